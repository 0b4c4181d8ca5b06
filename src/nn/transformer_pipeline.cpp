// The transformer's pipeline schedules: each stage runs its actions (pipeline_schedule.hpp), taking
// the stream from the previous stage and its gradient from the next (comm::StageLink). A failure
// anywhere (this rank's pass, a neighbour's failed status) turns the rest of this rank's schedule
// into messages only: every transfer still carries a status, so no neighbour waits for a message
// that will not come, and the mesh agrees on the failure once, after the schedule.
#include "transformer_state.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <algorithm>
#include <chrono>

namespace lather::nn {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// This stage's verdict on a pass: the fault point, agreed over the shards of the stage (whose
/// tensor-parallel all-reduces would otherwise wait for a shard that skips the pass), then the
/// pass itself. Returns false, keeping the first message in `error`, when it did not run or threw.
template <class Pass>
bool run_pass(const comm::Group& shards, bool ok, std::string& error, Pass&& pass) {
  if (ok) {
    std::string fault = ::lather::Impl::local_failure("transformer.pipeline", [] {});
    if (!fault.empty()) {
      if (error.empty()) error = fault;
      ok = false;
    }
  }
  if (shards.size() > 1) ok = shards.allreduce(int(ok), comm::Combine::min) != 0;
  if (!ok) return false;
  std::string failure = ::lather::Impl::local_failure(nullptr, std::forward<Pass>(pass));
  if (failure.empty()) return true;
  if (error.empty()) error = failure;
  return false;
}

}  // namespace

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::train_micro_batches(const ExecutionSpace& space,
                                                                           PipelineSchedule schedule,
                                                                           const std::vector<MicroBatch>& micro_batches,
                                                                           bool accumulate, PipelineTimes* times) {
  ::lather::Impl::ScopedRegion region("Lather::Transformer::train_micro_batches");
  auto& st = *m_state;
  const int M = int(micro_batches.size());
  LATHER_REQUIRE(M >= 1, "Transformer::train_micro_batches: no micro-batch");
  for (const auto& mb : micro_batches)
    LATHER_REQUIRE(mb.batch >= 1 && mb.time >= 1 && mb.time <= m_config.block_size,
                   "Transformer::train_micro_batches: a micro-batch of ", mb.batch, " windows of ", mb.time,
                   " tokens; each needs 1 or more windows of 1 to ", m_config.block_size);
  const auto start = Clock::now();
  PipelineTimes local_times;
  auto& t = times ? *times : local_times;
  t = PipelineTimes();
  LanguageModelSums sums;
  const auto timed = [&](bool forward, int m, auto&& pass) {
    const double begin = since(start);
    pass();
    ::lather::Impl::fence(space, "Lather::Transformer::pipeline: pass done");
    const double end = since(start);
    t.busy += end - begin;
    t.events.push_back({forward, m, begin, end});
  };

  if (st.stages == 1) {
    // No neighbours: the micro-batches one after the other (gradient accumulation).
    for (int m = 0; m < M; ++m) {
      const auto& mb = micro_batches[std::size_t(m)];
      const int rows = mb.batch * mb.time;
      reserve(space, 0, rows);
      LanguageModelSums r;
      timed(true, m, [&] {
        forward(space, 0, mb.batch, mb.time, mb.inputs);
        r = loss(space, 0, rows, mb.targets, true);
      });
      timed(false, m, [&] { backward(space, 0, mb.batch, mb.time, mb.inputs, accumulate || m > 0); });
      sums.loss += r.loss, sums.z_loss += r.z_loss, sums.correct += r.correct, sums.tokens += r.tokens;
    }
    t.seconds = since(start);
    return sums;
  }

  std::string error;  // this rank's own failure, the first one
  bool ok = true;     // false once this rank failed or a neighbour sent a failure
  const int slots = activation_slots(schedule, st.stages, st.stage, M);
  // The slots, grown before the schedule (an agreement over the shards when they grow).
  {
    int largest = 0;
    for (const auto& mb : micro_batches) largest = std::max(largest, mb.batch * mb.time);
    const std::string failure = ::lather::Impl::local_failure(nullptr, [&] {
      for (int s = 0; s < slots; ++s) reserve(space, s, largest);
    });
    if (!failure.empty()) error = failure, ok = false;
  }
  const auto rows_of = [](const Matrix& m, int rows) {
    return Kokkos::View<Scalar*, memory_space>(m.data(), std::size_t(rows) * m.extent(1));
  };
  const auto receive = [&](comm::StageDirection direction, const Matrix& into, int rows) {
    const std::string failure = ::lather::Impl::local_failure(nullptr, [&] {
      const bool keep = ok && into.data() != nullptr;
      const auto view = keep ? rows_of(into, rows) : Kokkos::View<Scalar*, memory_space>();
      const bool sent = st.link.receive(space, direction, keep ? view : Kokkos::View<Scalar*, memory_space>(), keep);
      if (!sent) ok = false;
    });
    if (!failure.empty()) {
      if (error.empty()) error = failure;
      ok = false;
    }
  };

  for (const auto& action : pipeline_actions(schedule, st.stages, st.stage, M)) {
    const int m = action.micro_batch;
    const auto& mb = micro_batches[std::size_t(m)];
    const int rows = mb.batch * mb.time;
    auto* slot = std::size_t(action.slot) < st.slots.size() ? &st.slots[std::size_t(action.slot)] : nullptr;
    if (action.kind == PipelineAction::Kind::forward) {
      if (slot) {
        slot->forward_send.wait();  // the slot's last output has left before it is overwritten
        slot->backward_send.wait();
      }
      if (!st.first_stage()) receive(comm::StageDirection::forward, slot ? slot->blocks[0].x : Matrix(), rows);
      ok = run_pass(st.shards, ok, error, [&] {
        timed(true, m, [&] {
          forward(space, action.slot, mb.batch, mb.time, mb.inputs);
          if (st.last_stage()) {
            const auto r = loss(space, action.slot, rows, mb.targets, true);
            sums.loss += r.loss, sums.z_loss += r.z_loss, sums.correct += r.correct, sums.tokens += r.tokens;
          }
        });
      });
      if (!st.last_stage()) {
        const auto failure = ::lather::Impl::local_failure(nullptr, [&] {
          typename comm::StageLink<ExecutionSpace, Scalar>::Outgoing scratch;
          auto& out = slot ? slot->forward_send : scratch;
          st.link.start_send(space, comm::StageDirection::forward,
                             ok ? rows_of(slot->x_final, rows) : Kokkos::View<Scalar*, memory_space>(), ok, out);
          if (!slot) out.wait();
        });
        if (!failure.empty() && error.empty()) error = failure, ok = false;
      }
    } else {
      if (!st.last_stage()) receive(comm::StageDirection::backward, st.dx, rows);
      ok = run_pass(st.shards, ok, error, [&] {
        timed(false, m, [&] { backward(space, action.slot, mb.batch, mb.time, mb.inputs, accumulate || m > 0); });
      });
      if (!st.first_stage()) {
        const auto failure = ::lather::Impl::local_failure(nullptr, [&] {
          typename comm::StageLink<ExecutionSpace, Scalar>::Outgoing scratch;
          auto& out = slot ? slot->backward_send : scratch;
          Kokkos::View<Scalar*, memory_space> gradient;
          if (ok) {
            // dX is scratch that the next backward overwrites: the slot's copy travels.
            out.wait();
            gradient = rows_of(slot->input_gradient, rows);
            Kokkos::deep_copy(space, gradient, rows_of(st.dx, rows));
          }
          st.link.start_send(space, comm::StageDirection::backward, gradient, ok, out);
          if (!slot) out.wait();
        });
        if (!failure.empty() && error.empty()) error = failure, ok = false;
      }
    }
  }
  for (auto& slot : st.slots) {
    slot.forward_send.wait();
    slot.backward_send.wait();
  }
  t.seconds = since(start);
  st.world.agree_on_failure("Transformer pipeline", error);
  return sums;
}

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::forward_through_stages(const ExecutionSpace& space, int batch,
                                                                              int time, const Tokens& inputs,
                                                                              const Tokens* targets) {
  auto& st = *m_state;
  const int rows = batch * time;
  std::string error;
  bool ok = true;
  LanguageModelSums sums;
  {
    const std::string failure = ::lather::Impl::local_failure(nullptr, [&] { reserve(space, 0, rows); });
    if (!failure.empty()) error = failure, ok = false;
  }
  auto* slot = st.slots.empty() ? nullptr : &st.slots[0];
  if (slot) {
    slot->forward_send.wait();
    slot->backward_send.wait();
  }
  const auto flat = [&](const Matrix& m) {
    return Kokkos::View<Scalar*, memory_space>(m.data(), std::size_t(rows) * m.extent(1));
  };
  if (!st.first_stage()) {
    const std::string failure = ::lather::Impl::local_failure(nullptr, [&] {
      const bool keep = ok && slot;
      if (!st.link.receive(space, comm::StageDirection::forward,
                           keep ? flat(slot->blocks[0].x) : Kokkos::View<Scalar*, memory_space>(), keep))
        ok = false;
    });
    if (!failure.empty()) error = error.empty() ? failure : error, ok = false;
  }
  ok = run_pass(st.shards, ok, error, [&] {
    forward(space, 0, batch, time, inputs);
    if (st.last_stage() && targets) sums = loss(space, 0, rows, *targets, false);
  });
  if (!st.last_stage()) {
    const std::string failure = ::lather::Impl::local_failure(nullptr, [&] {
      typename comm::StageLink<ExecutionSpace, Scalar>::Outgoing out;
      st.link.start_send(space, comm::StageDirection::forward,
                         ok ? flat(slot->x_final) : Kokkos::View<Scalar*, memory_space>(), ok, out);
      out.wait();
    });
    if (!failure.empty()) error = error.empty() ? failure : error, ok = false;
  }
  st.world.agree_on_failure("Transformer pipeline", error);
  return sums;
}

#define LATHER_NN_TRANSFORMER_PIPELINE(SPACE, SCALAR)                                                                  \
  template LanguageModelSums Transformer<SPACE, SCALAR>::train_micro_batches(                                          \
      const SPACE&, PipelineSchedule, const std::vector<MicroBatch>&, bool, PipelineTimes*);                           \
  template LanguageModelSums Transformer<SPACE, SCALAR>::forward_through_stages(const SPACE&, int, int, const Tokens&, \
                                                                                const Tokens*);

LATHER_NN_TRANSFORMER_PIPELINE(DefaultExecutionSpace, float)
LATHER_NN_TRANSFORMER_PIPELINE(DefaultExecutionSpace, double)

}  // namespace lather::nn
