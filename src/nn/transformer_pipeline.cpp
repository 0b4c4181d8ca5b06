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
#include <string>
#include <utility>

namespace lather::nn {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// This rank's part in a schedule that a failure must not stop: the first failure's message, and
/// whether this rank still computes (false once it failed or a neighbour sent a failure).
struct Verdict {
  std::string error;
  bool ok = true;
  void fail(const std::string& message) {
    if (error.empty()) error = message;
    ok = false;
  }
  /// Runs `work`; what it throws becomes this rank's failure.
  template <class Work>
  void run(Work&& work) {
    const std::string message = ::lather::Impl::local_failure(nullptr, std::forward<Work>(work));
    if (!message.empty()) fail(message);
  }
};

/// A pass of this stage: the fault point, agreed over the shards of the stage (whose
/// tensor-parallel all-reduces would otherwise wait for a shard that skips the pass), then the
/// pass itself, unless the verdict already says no.
template <class Pass>
void run_pass(const comm::Group& shards, Verdict& verdict, Pass&& pass) {
  if (verdict.ok) {
    const std::string fault = ::lather::Impl::local_failure("transformer.pipeline", [] {});
    if (!fault.empty()) verdict.fail(fault);
  }
  if (shards.size() > 1 && shards.allreduce(int(verdict.ok), comm::Combine::min) == 0) verdict.ok = false;
  if (verdict.ok) verdict.run(std::forward<Pass>(pass));
}

/// The hook backward() reports each layer's gradients to, for the lifetime of this object (the
/// step's last backward, which writes them for the last time).
template <class State>
class ReadyDuring {
 public:
  ReadyDuring(State& st, const GradientsReady* ready) : m_st(st) {
    if (ready && *ready) m_st.gradients_ready = ready;
  }
  ~ReadyDuring() { m_st.gradients_ready = nullptr; }
  ReadyDuring(const ReadyDuring&) = delete;
  ReadyDuring& operator=(const ReadyDuring&) = delete;

 private:
  State& m_st;
};

/// The first `rows` rows of an activation as the flat View a transfer moves.
template <class Matrix>
auto flat_rows(const Matrix& m, int rows) {
  return Kokkos::View<typename Matrix::value_type*, typename Matrix::memory_space>(m.data(),
                                                                                   std::size_t(rows) * m.extent(1));
}

}  // namespace

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::train_micro_batches(
    const ExecutionSpace& space, PipelineSchedule schedule, const std::vector<MicroBatch>& micro_batches,
    bool accumulate, PipelineTimes* times, const GradientsReady& ready, const ParametersNeeded& needed) {
  ::lather::Impl::ScopedRegion region("Lather::Transformer::train_micro_batches");
  auto& st = *m_state;
  const NeededDuring<State> asking(st, needed, "train_micro_batches");
  const int M = int(micro_batches.size());
  LATHER_REQUIRE(M >= 1, "Transformer::train_micro_batches: no micro-batch");
  for (const auto& mb : micro_batches)
    LATHER_REQUIRE(mb.batch >= 1 && mb.time >= 1 && mb.time <= m_config.block_size,
                   "Transformer::train_micro_batches: a micro-batch of ", mb.batch, " windows of ", mb.time,
                   " tokens; each needs 1 or more windows of 1 to ", m_config.block_size);
  const auto start = Clock::now();
  if (times) *times = PipelineTimes();
  LanguageModelSums sums;
  const auto add = [&](const LanguageModelSums& r) {
    sums.loss += r.loss, sums.z_loss += r.z_loss, sums.correct += r.correct, sums.tokens += r.tokens;
  };
  // A timeline costs a fence after every pass (a pass's time is its kernels'); without one asked
  // for, the passes queue as they always did.
  const auto timed = [&](bool forward, int m, auto&& pass) {
    if (!times) return pass();
    const double begin = since(start);
    pass();
    ::lather::Impl::fence(space, "Lather::Transformer::pipeline: pass done");
    const double end = since(start);
    times->busy += end - begin;
    times->events.push_back({forward, m, begin, end});
  };

  if (st.stages == 1) {
    // No neighbours: the micro-batches one after the other (gradient accumulation).
    for (int m = 0; m < M; ++m) {
      const auto& mb = micro_batches[std::size_t(m)];
      const int rows = mb.batch * mb.time;
      reserve(space, 0, rows);
      timed(true, m, [&] {
        forward(space, 0, mb.batch, mb.time, mb.inputs);
        add(loss(space, 0, rows, mb.targets, true));
      });
      const ReadyDuring last(st, m + 1 == M ? &ready : nullptr);
      timed(false, m, [&] { backward(space, 0, mb.batch, mb.time, mb.inputs, accumulate || m > 0); });
    }
    if (times) times->seconds = since(start);
    return sums;
  }

  using Outgoing = typename comm::StageLink<ExecutionSpace, Scalar>::Outgoing;
  using Flat = Kokkos::View<Scalar*, memory_space>;
  Verdict verdict;
  const int slots = activation_slots(schedule, st.stages, st.stage, M);
  // The slots, grown before the schedule (an agreement over the shards when they grow).
  verdict.run([&] {
    int largest = 0;
    for (const auto& mb : micro_batches) largest = std::max(largest, mb.batch * mb.time);
    for (int s = 0; s < slots; ++s) reserve(space, s, largest);
  });
  // Takes the neighbour's transfer into `into`, or drops it once this rank computes no more.
  const auto receive = [&](comm::StageDirection direction, const Matrix& into, int rows) {
    verdict.run([&] {
      const bool keep = verdict.ok && into.data() != nullptr;
      if (!st.link.receive(space, direction, keep ? flat_rows(into, rows) : Flat(), keep)) verdict.ok = false;
    });
  };
  // Sends `data` (or, after a failure, the status alone) from `out`; without a slot (its growth
  // failed) from a scratch transfer, completed at once.
  const auto send = [&](comm::StageDirection direction, Outgoing* out, const Flat& data) {
    verdict.run([&] {
      Outgoing scratch;
      st.link.start_send(space, direction, verdict.ok ? data : Flat(), verdict.ok, out ? *out : scratch);
      if (!out) scratch.wait();
    });
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
      run_pass(st.shards, verdict, [&] {
        timed(true, m, [&] {
          forward(space, action.slot, mb.batch, mb.time, mb.inputs);
          if (st.last_stage()) add(loss(space, action.slot, rows, mb.targets, true));
        });
      });
      if (!st.last_stage())
        send(comm::StageDirection::forward, slot ? &slot->forward_send : nullptr,
             verdict.ok ? flat_rows(slot->x_final, rows) : Flat());
    } else {
      if (!st.last_stage()) receive(comm::StageDirection::backward, st.dx, rows);
      const ReadyDuring last(st, m + 1 == M ? &ready : nullptr);
      run_pass(st.shards, verdict, [&] {
        timed(false, m, [&] { backward(space, action.slot, mb.batch, mb.time, mb.inputs, accumulate || m > 0); });
      });
      if (!st.first_stage()) {
        Flat gradient;
        if (verdict.ok)
          verdict.run([&] {
            // dX is scratch that the next backward overwrites: the slot's copy travels.
            slot->backward_send.wait();
            gradient = flat_rows(slot->input_gradient, rows);
            Kokkos::deep_copy(space, gradient, flat_rows(st.dx, rows));
          });
        send(comm::StageDirection::backward, slot ? &slot->backward_send : nullptr, gradient);
      }
    }
  }
  for (auto& slot : st.slots) {
    slot.forward_send.wait();
    slot.backward_send.wait();
  }
  if (times) times->seconds = since(start);
  st.world.agree_on_failure("Transformer pipeline", verdict.error);
  return sums;
}

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::forward_through_stages(const ExecutionSpace& space, int batch,
                                                                              int time, const Tokens& inputs,
                                                                              const Tokens* targets) {
  auto& st = *m_state;
  using Flat = Kokkos::View<Scalar*, memory_space>;
  const int rows = batch * time;
  Verdict verdict;
  LanguageModelSums sums;
  verdict.run([&] { reserve(space, 0, rows); });
  auto* slot = st.slots.empty() ? nullptr : &st.slots[0];
  if (slot) {
    slot->forward_send.wait();
    slot->backward_send.wait();
  }
  if (!st.first_stage())
    verdict.run([&] {
      const bool keep = verdict.ok && slot;
      if (!st.link.receive(space, comm::StageDirection::forward, keep ? flat_rows(slot->blocks[0].x, rows) : Flat(),
                           keep))
        verdict.ok = false;
    });
  run_pass(st.shards, verdict, [&] {
    forward(space, 0, batch, time, inputs);
    if (st.last_stage() && targets) sums = loss(space, 0, rows, *targets, false);
  });
  if (!st.last_stage())
    verdict.run([&] {
      typename comm::StageLink<ExecutionSpace, Scalar>::Outgoing out;
      st.link.start_send(space, comm::StageDirection::forward, verdict.ok ? flat_rows(slot->x_final, rows) : Flat(),
                         verdict.ok, out);
      out.wait();
    });
  st.world.agree_on_failure("Transformer pipeline", verdict.error);
  return sums;
}

#define LATHER_NN_TRANSFORMER_PIPELINE(SPACE, SCALAR)                                                                  \
  template LanguageModelSums Transformer<SPACE, SCALAR>::train_micro_batches(                                          \
      const SPACE&, PipelineSchedule, const std::vector<MicroBatch>&, bool, PipelineTimes*, const GradientsReady&,     \
      const ParametersNeeded&);                                                                                        \
  template LanguageModelSums Transformer<SPACE, SCALAR>::forward_through_stages(const SPACE&, int, int, const Tokens&, \
                                                                                const Tokens*);

LATHER_NN_TRANSFORMER_PIPELINE(DefaultExecutionSpace, float)
LATHER_NN_TRANSFORMER_PIPELINE(DefaultExecutionSpace, double)

}  // namespace lather::nn
