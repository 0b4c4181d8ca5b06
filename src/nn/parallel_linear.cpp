#include <lather/nn/parallel_linear.hpp>

#include <lather/comm/agreement.hpp>
#include <lather/comm/transport.hpp>
#include <lather/core/fault_injection.hpp>

#include <lather/core/shape_checks.hpp>
#include "parallel_linear_kernels.hpp"

namespace lather::nn {

using comm::Agreement;
using comm::Group;
using comm::shard_range;
using comm::Transport;
using ::lather::Impl::expect_length;
using ::lather::Impl::expect_shape;
using ::lather::Impl::first_error;
using ::lather::Impl::prepare_locally;

// ---- the shared part of the column- and row-parallel layers -------------------------------------

namespace Impl {
template <class ExecutionSpace, class Scalar>
struct ParallelLinearState {
  using memory_space = typename ExecutionSpace::memory_space;
  std::string name;
  Group shards;
  int in = 0, out = 0;
  bool split_inputs = false;
  ShardRange range;
  TensorParallelOptions options;
  Transport<ExecutionSpace, Scalar> transport;

  /// This shard's weight shape [rows, columns].
  std::size_t weight_rows() const { return std::size_t(split_inputs ? range.count : in); }
  std::size_t weight_columns() const { return std::size_t(split_inputs ? out : range.count); }
  std::size_t x_columns() const { return weight_rows(); }
  std::size_t y_columns() const { return split_inputs ? std::size_t(out) : std::size_t(range.count); }

  /// What is wrong with the Views of a call ("" if nothing); empty dx / dweight / dbias are not
  /// checked (forward passes none of them, backward may skip dx).
  template <class X, class W, class B, class Y, class DX, class DW>
  std::string check(std::size_t batch, const X& x, const W& weight, const B& bias, const Y& y, const DX& dx,
                    const DW& dweight, bool backward) const {
    return first_error({expect_shape("x", x, batch, x_columns()),
                        expect_shape("weight", weight, weight_rows(), weight_columns()),
                        expect_length(backward ? "dbias" : "bias", bias, y_columns()),
                        expect_shape(backward ? "dy" : "y", y, batch, y_columns()),
                        dx.data() ? expect_shape("dx", dx, batch, x_columns()) : std::string(),
                        backward ? expect_shape("dweight", dweight, weight_rows(), weight_columns()) : std::string()});
  }
};
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>::ParallelLinear(const char* name, const Group& shards, int in_features,
                                                       int out_features, bool split_inputs,
                                                       const TensorParallelOptions& options)
    : m_state(std::make_unique<Impl::ParallelLinearState<ExecutionSpace, Scalar>>()) {
  const std::string error =
      in_features >= 1 && out_features >= 1
          ? std::string()
          : ::lather::Impl::concat("in_features ", in_features, " and out_features ", out_features, " must be >= 1");
  Agreement(shards, name, {{"in_features", in_features}, {"out_features", out_features}}, {}, error)
      .require_agreement();
  auto& st = *m_state;
  st.name = name;
  st.shards = shards;
  st.in = in_features;
  st.out = out_features;
  st.split_inputs = split_inputs;
  st.range = shard_range(split_inputs ? in_features : out_features, shards.size(), shards.rank());
  st.options = options;
  st.transport = Transport<ExecutionSpace, Scalar>(shards, std::size_t(1) << 24, std::string("Lather::") + name);
}

template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>::~ParallelLinear() = default;
template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>::ParallelLinear(ParallelLinear&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>& ParallelLinear<ExecutionSpace, Scalar>::operator=(ParallelLinear&&) noexcept =
    default;
template <class ExecutionSpace, class Scalar>
int ParallelLinear<ExecutionSpace, Scalar>::in_features() const {
  return m_state->in;
}
template <class ExecutionSpace, class Scalar>
int ParallelLinear<ExecutionSpace, Scalar>::out_features() const {
  return m_state->out;
}
template <class ExecutionSpace, class Scalar>
ShardRange ParallelLinear<ExecutionSpace, Scalar>::local() const {
  return m_state->range;
}

// ---- ColumnParallelLinear -----------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
ColumnParallelLinear<ExecutionSpace, Scalar>::ColumnParallelLinear(const Group& shards, int in_features,
                                                                   int out_features,
                                                                   const TensorParallelOptions& options)
    : ParallelLinear<ExecutionSpace, Scalar>("ColumnParallelLinear", shards, in_features, out_features, false,
                                             options) {}

template <class ExecutionSpace, class Scalar>
void ColumnParallelLinear<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, const const_matrix& x,
                                                           const const_matrix& weight, const const_vector& bias,
                                                           const matrix& y) const {
  Impl::ScopedRegion region("Lather::ColumnParallelLinear::forward");
  const auto& st = *this->m_state;
  const auto error = st.check(x.extent(0), x, weight, bias, y, matrix(), matrix(), false);
  LATHER_REQUIRE(error.empty(), "ColumnParallelLinear::forward: ", error);
  Impl::gemm(space, "N", "N", Scalar(1), x, weight, Scalar(0), y);
  Impl::add_bias(space, y, bias);
}

template <class ExecutionSpace, class Scalar>
void ColumnParallelLinear<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, const const_matrix& x,
                                                            const const_matrix& weight, const const_matrix& dy,
                                                            const matrix& dx, const matrix& dweight,
                                                            const vector& dbias, bool accumulate) {
  Impl::ScopedRegion region("Lather::ColumnParallelLinear::backward");
  auto& st = *this->m_state;
  const std::size_t batch = x.extent(0), in = std::size_t(st.in);
  std::string error = st.check(batch, x, weight, dbias, dy, dx, dweight, true);
  if (error.empty() && dx.data() && !dx.span_is_contiguous()) error = "dx must be contiguous";
  const bool reduces = dx.data() && st.shards.size() > 1;
  prepare_locally("tensor_parallel.column_backward", error, [] {});
  if (reduces)
    comm::agree_on_call(st.shards, st.options.verify_shapes, "ColumnParallelLinear::backward", std::int64_t(batch),
                        error);
  else
    LATHER_REQUIRE(error.empty(), "ColumnParallelLinear::backward: ", error);
  const Scalar beta = accumulate ? Scalar(1) : Scalar(0);
  Impl::gemm(space, "T", "N", Scalar(1), x, dy, beta, dweight);
  Impl::column_sums(space, dy, dbias, accumulate);
  if (!dx.data()) return;
  Impl::gemm(space, "N", "T", Scalar(1), dy, weight, Scalar(0), dx);
  // The one all-reduce of the layer: every shard's contribution to the input gradient.
  if (reduces && batch * in > 0)
    st.transport.allreduce(space, Kokkos::View<Scalar*, memory_space>(dx.data(), batch * in));
}

// ---- RowParallelLinear --------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
RowParallelLinear<ExecutionSpace, Scalar>::RowParallelLinear(const Group& shards, int in_features, int out_features,
                                                             const TensorParallelOptions& options)
    : ParallelLinear<ExecutionSpace, Scalar>("RowParallelLinear", shards, in_features, out_features, true, options) {}

template <class ExecutionSpace, class Scalar>
void RowParallelLinear<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, const const_matrix& x,
                                                        const const_matrix& weight, const const_vector& bias,
                                                        const matrix& y) {
  Impl::ScopedRegion region("Lather::RowParallelLinear::forward");
  auto& st = *this->m_state;
  const std::size_t batch = x.extent(0), out = std::size_t(st.out);
  std::string error = st.check(batch, x, weight, bias, y, matrix(), matrix(), false);
  if (error.empty() && !y.span_is_contiguous()) error = "y must be contiguous";
  prepare_locally("tensor_parallel.row_forward", error, [] {});
  if (st.shards.size() > 1)
    comm::agree_on_call(st.shards, st.options.verify_shapes, "RowParallelLinear::forward", std::int64_t(batch), error);
  else
    LATHER_REQUIRE(error.empty(), "RowParallelLinear::forward: ", error);
  Impl::gemm(space, "N", "N", Scalar(1), x, weight, Scalar(0), y);
  if (st.shards.size() > 1 && batch * out > 0)
    st.transport.allreduce(space, Kokkos::View<Scalar*, memory_space>(y.data(), batch * out));
  Impl::add_bias(space, y, bias);  // once, after the sum
}

template <class ExecutionSpace, class Scalar>
void RowParallelLinear<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, const const_matrix& x,
                                                         const const_matrix& weight, const const_matrix& dy,
                                                         const matrix& dx, const matrix& dweight, const vector& dbias,
                                                         bool accumulate) const {
  Impl::ScopedRegion region("Lather::RowParallelLinear::backward");
  const auto& st = *this->m_state;
  const auto error = st.check(dy.extent(0), x, weight, dbias, dy, dx, dweight, true);
  LATHER_REQUIRE(error.empty(), "RowParallelLinear::backward: ", error);
  if (dx.data()) Impl::gemm(space, "N", "T", Scalar(1), dy, weight, Scalar(0), dx);
  Impl::gemm(space, "T", "N", Scalar(1), x, dy, accumulate ? Scalar(1) : Scalar(0), dweight);
  Impl::column_sums(space, dy, dbias, accumulate);
}

#define LATHER_NN_PARALLEL_LINEAR_INSTANTIATE(SPACE, SCALAR) \
  template class ParallelLinear<SPACE, SCALAR>;              \
  template class ColumnParallelLinear<SPACE, SCALAR>;        \
  template class RowParallelLinear<SPACE, SCALAR>;

LATHER_NN_PARALLEL_LINEAR_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_NN_PARALLEL_LINEAR_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_NN_PARALLEL_LINEAR_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_NN_PARALLEL_LINEAR_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::nn
