#pragma once
// The implementation of GradientReducer, for explicit instantiation: src/comm/reduce.cpp
// instantiates it for lather::DefaultExecutionSpace (and the host space on device builds); a
// program that needs another execution space includes this header and uses the class as usual.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/agreement.hpp>
#include <lather/comm/impl/kernels.hpp>
#include <lather/comm/impl/layout.hpp>
#include <lather/comm/impl/support.hpp>
#include <lather/comm/impl/window_sum.hpp>
#include <lather/comm/transport.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/core/fault_injection.hpp>

#include <cmath>
#include <limits>

namespace lather::comm {

template <class ExecutionSpace, class Scalar>
GradientReducer<ExecutionSpace, Scalar>::GradientReducer(const Mesh& mesh, const ReduceOptions& options)
    : GradientReducer(mesh.data_parallel(), options) {}

template <class ExecutionSpace, class Scalar>
GradientReducer<ExecutionSpace, Scalar>::GradientReducer(const Group& group, const ReduceOptions& options)
    : m_state(std::make_unique<State>()) {
  options.validate();
  auto& st = *m_state;
  st.group = group;
  st.size = group.size();
  st.rank = group.rank();
  st.options = options;
  st.fusion_elements = std::max<std::int64_t>(1, std::int64_t(options.fusion_bytes / sizeof(Scalar)));
  st.transport = Transport<ExecutionSpace, Scalar>(group, std::size_t(st.fusion_elements), "Lather::GradientReducer");
  st.wire_transport =
      Transport<ExecutionSpace, std::uint16_t>(group, std::size_t(st.fusion_elements), "Lather::GradientReducer::wire");
}

template <class ExecutionSpace, class Scalar>
GradientReducer<ExecutionSpace, Scalar>::~GradientReducer() = default;
template <class ExecutionSpace, class Scalar>
GradientReducer<ExecutionSpace, Scalar>::GradientReducer(GradientReducer&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
GradientReducer<ExecutionSpace, Scalar>& GradientReducer<ExecutionSpace, Scalar>::operator=(
    GradientReducer&&) noexcept = default;

namespace Impl {
/// The fault-injection point of each operation (tests, <lather/core/fault_injection.hpp>).
inline const char* reduce_fault_point(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "reduce.sum";
    case ReduceOp::mean:
      return "reduce.mean";
    case ReduceOp::weighted_mean:
      return "reduce.weighted_mean";
    case ReduceOp::adasum:
      return "reduce.adasum";
    case ReduceOp::adasum_approx:
      return "reduce.adasum_approx";
  }
  return "reduce";
}
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
double GradientReducer<ExecutionSpace, Scalar>::reduce(const ExecutionSpace& space, const tensor_list& gradients,
                                                       ReduceOp op, double local_weight,
                                                       const std::vector<AgreedValue>& agreed,
                                                       const std::string& caller_error) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  auto& st = *m_state;
  const std::string context = "GradientReducer::" + to_string(op);
  Impl::ScopedRegion region("Lather::" + context);
  LATHER_REQUIRE(!st.overlap.active, context, ": an overlapped reduction is in flight (start() without finish())");
  const double global_weight =
      st.agree_before(space, gradients, op, local_weight, agreed, caller_error, context, false);
  st.decide_nccl(space);
  const bool weighted = op == ReduceOp::weighted_mean;
  switch (op) {
    case ReduceOp::sum:
      st.sum_like(space, gradients, 1.0);
      break;
    case ReduceOp::mean:
      st.sum_like(space, gradients, 1.0 / st.size);
      break;
    case ReduceOp::weighted_mean:
      st.sum_like(space, gradients, 1.0 / global_weight);
      break;
    case ReduceOp::adasum:
      LATHER_REQUIRE(st.options.wire_precision == WirePrecision::native, context,
                     ": exact Adasum sends the native type; ReduceOptions::wire_precision must be "
                     "native, got ",
                     to_string(st.options.wire_precision));
      st.adasum(space, gradients);
      break;
    case ReduceOp::adasum_approx:
      st.adasum_approx(space, gradients);
      break;
  }
  Impl::fence(space, "Lather::" + context + ": gradients reduced");
  ++st.statistics.calls;
  return weighted ? global_weight : double(st.size);
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::start(const ExecutionSpace& space, const tensor_list& gradients,
                                                    ReduceOp op, double local_weight,
                                                    const std::vector<AgreedValue>& agreed,
                                                    const std::string& caller_error) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  auto& st = *m_state;
  const std::string context = "GradientReducer::start(" + to_string(op) + ")";
  Impl::ScopedRegion region("Lather::GradientReducer::start");
  LATHER_REQUIRE(!st.overlap.active, context, ": an overlapped reduction is in flight (start() without finish())");
  const double global_weight = st.agree_before(space, gradients, op, local_weight, agreed, caller_error, context, true);
  st.decide_nccl(space);
  LATHER_REQUIRE(op != ReduceOp::adasum || st.options.wire_precision == WirePrecision::native, context,
                 ": exact Adasum sends the native type; ReduceOptions::wire_precision must be native, got ",
                 to_string(st.options.wire_precision));
  auto& ov = st.overlap;
  ov.queue.clear();
  ov.operation = int(op);
  ov.deferred = op == ReduceOp::adasum || op == ReduceOp::adasum_approx;
  ov.result = op == ReduceOp::weighted_mean ? global_weight : double(st.size);
  ov.factor = op == ReduceOp::mean ? 1.0 / st.size : op == ReduceOp::weighted_mean ? 1.0 / global_weight : 1.0;
  ov.windowed = false;
  if (!ov.deferred) {
    // Collective the first time (after the agreement, every rank is here).
    ov.windowed =
        st.shared.active(st.group, st.options.shared_memory && st.options.wire_precision == WirePrecision::native);
    if (ov.windowed) st.shared.prepare(st.group, st.layout);
  }
  const auto& buckets = st.layout.buckets;
  ov.ready.assign(gradients.size(), 0);
  ov.bucket_of.assign(gradients.size(), 0);
  ov.missing.assign(buckets.size(), 0);
  ov.bucket_first.assign(buckets.size(), 0);
  std::int64_t first = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    ov.bucket_first[b] = first;
    first += buckets[b].elements;
    ov.missing[b] = std::int64_t(buckets[b].last - buckets[b].first);
    for (std::size_t t = buckets[b].first; t < buckets[b].last; ++t) ov.bucket_of[t] = b;
  }
  ov.next = int(buckets.size()) - 1;
  st.overlap_tensors = gradients;
  ov.active = true;
  if (!ov.deferred) st.launch_ready_buckets(space);  // empty buckets need no ready()
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::ready(const ExecutionSpace& space, std::size_t first, std::size_t last) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  auto& st = *m_state;
  auto& ov = st.overlap;
  LATHER_REQUIRE(ov.active, "GradientReducer::ready: no overlapped reduction in flight (call start() first)");
  LATHER_REQUIRE(first <= last && last <= ov.ready.size(), "GradientReducer::ready: tensors [", first, ", ", last,
                 ") of a list of ", ov.ready.size());
  for (std::size_t t = first; t < last; ++t)
    if (!ov.ready[t]) {
      ov.ready[t] = 1;
      --ov.missing[ov.bucket_of[t]];
    }
  if (ov.deferred) return;
  st.launch_ready_buckets(space);
  ov.queue.advance();
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::progress(const ExecutionSpace&) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  if (m_state->overlap.active) m_state->overlap.queue.advance();
}

template <class ExecutionSpace, class Scalar>
double GradientReducer<ExecutionSpace, Scalar>::finish(const ExecutionSpace& space, const std::string& caller_error) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  auto& st = *m_state;
  auto& ov = st.overlap;
  LATHER_REQUIRE(ov.active, "GradientReducer::finish: no overlapped reduction in flight (call start() first)");
  const auto op = ReduceOp(ov.operation);
  const std::string context = "GradientReducer::" + to_string(op);
  Impl::ScopedRegion region("Lather::GradientReducer::finish");
  std::string local_error = caller_error;
  for (std::size_t t = 0; t < ov.ready.size() && local_error.empty(); ++t)
    if (!ov.ready[t])
      local_error = lather::Impl::concat(
          t < st.tensor_names.size() ? "'" + st.tensor_names[t] + "'" : "tensor " + std::to_string(t),
          " was never reported ready (GradientReducer::ready) before finish()");
  // Whatever this rank's state, it starts every bucket the others start.
  ov.active = false;
  if (!ov.deferred) {
    for (auto& missing : ov.missing) missing = 0;
    st.launch_ready_buckets(space);
    st.overlap.queue.drain();
  }
  if (local_error.empty()) local_error = ov.queue.error();
  if (ov.deferred && local_error.empty() && st.options.check_finite)
    local_error = st.first_non_finite(space, st.overlap_tensors);
  ov.queue.clear();
  const auto tensors = std::move(st.overlap_tensors);
  st.overlap_tensors = tensor_list();
  st.group.agree_on_failure(context, local_error);
  ++st.statistics.scalar_collectives;
  if (op == ReduceOp::adasum) st.adasum(space, tensors);
  if (op == ReduceOp::adasum_approx) st.adasum_approx(space, tensors);
  Impl::fence(space, "Lather::" + context + ": gradients reduced");
  ++st.statistics.calls;
  return ov.result;
}

template <class ExecutionSpace, class Scalar>
bool GradientReducer<ExecutionSpace, Scalar>::overlapping() const {
  return m_state && m_state->overlap.active;
}

template <class ExecutionSpace, class Scalar>
FlatTensor<Scalar, typename ExecutionSpace::memory_space>
GradientReducer<ExecutionSpace, Scalar>::shared_gradient_storage(std::int64_t elements) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  auto& st = *m_state;
  return st.shared.storage(st.group, st.options.shared_memory && st.options.wire_precision == WirePrecision::native,
                           elements);
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::sum(const ExecutionSpace& space, const tensor_list& g) {
  reduce(space, g, ReduceOp::sum);
}
template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::mean(const ExecutionSpace& space, const tensor_list& g) {
  reduce(space, g, ReduceOp::mean);
}
template <class ExecutionSpace, class Scalar>
double GradientReducer<ExecutionSpace, Scalar>::weighted_mean(const ExecutionSpace& space, const tensor_list& g,
                                                              double weight) {
  return reduce(space, g, ReduceOp::weighted_mean, weight);
}
template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::adasum(const ExecutionSpace& space, const tensor_list& g) {
  reduce(space, g, ReduceOp::adasum);
}
template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::adasum_approx(const ExecutionSpace& space, const tensor_list& g) {
  reduce(space, g, ReduceOp::adasum_approx);
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::broadcast(const ExecutionSpace& space, const tensor_list& tensors,
                                                        int root) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  auto& st = *m_state;
  const std::string context = "GradientReducer::broadcast";
  Impl::ScopedRegion region("Lather::" + context);
  LATHER_REQUIRE(!st.overlap.active, context, ": an overlapped reduction is in flight (start() without finish())");
  std::vector<std::int64_t> sizes(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) sizes[t] = std::int64_t(tensors[t].extent(0));
  const bool same_as_before = st.layout_known && st.layout.sizes == sizes;
  Impl::Layout layout = same_as_before ? st.layout : Impl::plan_layout(sizes, st.fusion_elements);
  std::string local_error;
  if (root < 0 || root >= st.size) {
    local_error = lather::Impl::concat("root ", root, " is not a rank of the group of ", st.size);
  } else {
    local_error = lather::Impl::local_failure("reduce.broadcast", [&] {
      State::ensure(st.fusion, std::min<std::int64_t>(st.fusion_elements, layout.largest_bucket), "fusion");
    });
  }
  if (st.options.verify_layout || !same_as_before) {
    // A broadcast always sends the native type, whatever the wire precision of the options.
    st.agree(context, 5, WirePrecision::native, layout, {{"broadcast root", root}}, {}, local_error);
  } else {
    // No agreement (verify_layout off, the layout unchanged): the caller vouched for every rank.
    LATHER_REQUIRE(local_error.empty(), context, ": ", local_error);
  }
  st.layout = std::move(layout);
  st.layout_known = true;
  st.broadcast(space, tensors, root);
  Impl::fence(space, "Lather::" + context + ": tensors received");
  ++st.statistics.calls;
}

template <class ExecutionSpace, class Scalar>
void GradientReducer<ExecutionSpace, Scalar>::set_tensor_names(std::vector<std::string> names) {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  m_state->tensor_names = std::move(names);
}

template <class ExecutionSpace, class Scalar>
const Group& GradientReducer<ExecutionSpace, Scalar>::group() const {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  return m_state->group;
}
template <class ExecutionSpace, class Scalar>
int GradientReducer<ExecutionSpace, Scalar>::group_size() const {
  return m_state ? m_state->size : 0;
}
template <class ExecutionSpace, class Scalar>
int GradientReducer<ExecutionSpace, Scalar>::group_rank() const {
  return m_state ? m_state->rank : 0;
}
template <class ExecutionSpace, class Scalar>
const ReduceOptions& GradientReducer<ExecutionSpace, Scalar>::options() const {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  return m_state->options;
}
template <class ExecutionSpace, class Scalar>
ReducerStatistics GradientReducer<ExecutionSpace, Scalar>::statistics() const {
  LATHER_REQUIRE(m_state, "GradientReducer: used after being moved from");
  ReducerStatistics out = m_state->statistics;
  out.data_messages += m_state->transport.counters().data_calls;
  out.bytes += m_state->transport.counters().bytes;
  out.data_messages += m_state->wire_transport.counters().data_calls;
  out.bytes += m_state->wire_transport.counters().bytes;
  return out;
}

}  // namespace lather::comm

// GradientReducer::State, the part that holds the buffers and the bodies of the reductions; the
// calls above reach it only when instantiated.
#include <lather/comm/impl/reducer_state.hpp>
