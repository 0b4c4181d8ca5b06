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

  std::vector<std::int64_t> sizes(gradients.size());
  for (std::size_t t = 0; t < gradients.size(); ++t) sizes[t] = std::int64_t(gradients[t].extent(0));
  const bool same_as_before = st.layout_known && st.layout.sizes == sizes;
  Impl::Layout layout = same_as_before ? st.layout : Impl::plan_layout(sizes, st.fusion_elements);

  const bool weighted = op == ReduceOp::weighted_mean;
  const bool weight_valid = std::isfinite(local_weight) && local_weight >= 0;
  double global_weight = double(st.size);
  // This rank's work before the reduction: the caller's, the scan for non-finite values and the
  // buffers. What fails here is agreed below, with the layout, so every rank throws it.
  std::string local_error = caller_error, non_finite;
  if (local_error.empty())
    local_error = lather::Impl::local_failure(Impl::reduce_fault_point(op), [&] {
      if (st.options.check_finite) non_finite = st.first_non_finite(space, gradients);
      if (non_finite.empty()) st.prepare(op, layout);
    });
  if (local_error.empty()) local_error = non_finite;
  if (weighted && !weight_valid && local_error.empty())
    local_error = lather::Impl::concat("the local weight must be finite and >= 0, got ", local_weight);
  const bool placed = st.shared.placed(st.rank, gradients);
  if (st.options.verify_layout || !same_as_before) {
    std::vector<AgreementField> extra = {
        {"gradients placed in the reducer's shared window (shared_gradient_storage)", std::int64_t(placed)}};
    for (const auto& value : agreed) extra.push_back({value.name, value.value, value.has_required, value.required});
    const double sum = st.agree(context, int(op), st.options.wire_precision, layout, std::move(extra),
                                weighted ? std::vector<double>{local_weight} : std::vector<double>{}, local_error);
    if (weighted) global_weight = sum;
  } else if (st.options.check_finite) {
    // No layout agreement: the verdict on the gradients, and the weight, in one small collective.
    st.group.agree_on_failure(context, local_error);
    ++st.statistics.scalar_collectives;
    if (weighted) {
      global_weight = st.group.allreduce(local_weight, Combine::sum);
      ++st.statistics.scalar_collectives;
    }
  } else {
    // No agreement at all (verify_layout off, the layout unchanged, check_finite off): the caller
    // vouched for every rank, so a failure here can only be thrown on this rank.
    if (!(weighted && !weight_valid)) LATHER_REQUIRE(local_error.empty(), context, ": ", local_error);
    if (weighted) {
      // An invalid weight anywhere turns the sum into NaN, an error on every rank.
      const double mine = weight_valid ? local_weight : std::numeric_limits<double>::quiet_NaN();
      global_weight = st.group.allreduce(mine, Combine::sum);
      ++st.statistics.scalar_collectives;
    }
  }
  if (weighted)
    LATHER_REQUIRE(std::isfinite(global_weight) && global_weight > 0, context,
                   ": the global weight (sum of the local weights over the ", st.size, " ranks of the group) is ",
                   global_weight, "; it must be finite and > 0 (this rank's weight: ", local_weight, ")");
  st.layout = std::move(layout);
  st.layout_known = true;
  st.placed_agreed = placed;

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
