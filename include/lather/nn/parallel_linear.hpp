#pragma once
// The tensor-parallel dense layers of Megatron-LM over the shard group of a Mesh: one split by
// output columns, one split by input rows. Activations are 2-D row-major Views [batch, features];
// products go to Lather's GEMM (KokkosBlas::gemm, or the host BLAS). Features are split as
// comm::shard_range says (uneven splits allowed).
//
// Failures: what a shard does before a call's collective is agreed in one small MPI_Allreduce
// (comm::TensorParallelOptions::verify_shapes), so a failure on one shard is a lather::Error on
// every shard, "<Class>::<call>: <message> (on group rank k of n)", thrown before any output is
// written; the object stays usable. With verify_shapes off there is no agreement and a failure is
// thrown on its shard alone (nn::Transformer and nn::Mlp, whose shards run the same batch by
// construction, agree instead when they allocate their activations). A layer over a one-process
// Group (the default) is an ordinary dense layer.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>
#include <lather/comm/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

#include <memory>

namespace lather::nn {

using comm::Matrix;
using comm::ShardRange;
using comm::TensorParallelOptions;

namespace Impl {
template <class ExecutionSpace, class Scalar>
struct ParallelLinearState;
}

/// What the column- and row-parallel layers share: the shard group, the global sizes and this
/// shard's range of the split dimension.
template <class ExecutionSpace, class Scalar>
class ParallelLinear {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using matrix = Matrix<Scalar, memory_space>;
  using const_matrix = Matrix<const Scalar, memory_space>;
  using vector = Kokkos::View<Scalar*, memory_space>;
  using const_vector = Kokkos::View<const Scalar*, memory_space>;

  ~ParallelLinear();
  ParallelLinear(ParallelLinear&&) noexcept;
  ParallelLinear& operator=(ParallelLinear&&) noexcept;

  int in_features() const;
  int out_features() const;
  /// This shard's range of the split dimension (outputs for column-, inputs for row-parallel).
  ShardRange local() const;

 protected:
  /// Collective over `shards`: agrees on the feature counts. `split_inputs` selects the
  /// dimension this shard holds a range of.
  ParallelLinear(const char* name, const comm::Group& shards, int in_features, int out_features, bool split_inputs,
                 const TensorParallelOptions& options);
  std::unique_ptr<Impl::ParallelLinearState<ExecutionSpace, Scalar>> m_state;
};

/// Y = X W + b with W [in, out] split by output columns: shard d holds W_d = W[:, range_d] and
/// b_d = b[range_d], sees the whole input X [batch, in] and produces Y_d = Y[:, range_d].
template <class ExecutionSpace, class Scalar>
class ColumnParallelLinear : public ParallelLinear<ExecutionSpace, Scalar> {
 public:
  using typename ParallelLinear<ExecutionSpace, Scalar>::memory_space;
  using typename ParallelLinear<ExecutionSpace, Scalar>::matrix;
  using typename ParallelLinear<ExecutionSpace, Scalar>::const_matrix;
  using typename ParallelLinear<ExecutionSpace, Scalar>::vector;
  using typename ParallelLinear<ExecutionSpace, Scalar>::const_vector;

  /// Collective over `shards` (agrees on in/out features).
  ColumnParallelLinear(const comm::Group& shards, int in_features, int out_features,
                       const TensorParallelOptions& options = {});
  ShardRange local_out() const { return this->local(); }

  /// Y_d = X W_d + b_d. Local: no communication.
  void forward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight, const const_vector& bias,
               const matrix& y) const;
  /// dW_d = X^T dY_d, db_d = column sums of dY_d (local; added to dweight and dbias when
  /// `accumulate`), dX = sum over shards of dY_d W_d^T (one all-reduce of [batch, in]; skipped,
  /// with its agreement, when dx is an empty View). Collective.
  void backward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight, const const_matrix& dy,
                const matrix& dx, const matrix& dweight, const vector& dbias, bool accumulate = false);
};

/// Y = X W + b with W [in, out] split by input rows: shard d holds W_d = W[range_d, :] and its
/// slice of the input X_d = X[:, range_d]; b [out] is replicated and added once.
template <class ExecutionSpace, class Scalar>
class RowParallelLinear : public ParallelLinear<ExecutionSpace, Scalar> {
 public:
  using typename ParallelLinear<ExecutionSpace, Scalar>::memory_space;
  using typename ParallelLinear<ExecutionSpace, Scalar>::matrix;
  using typename ParallelLinear<ExecutionSpace, Scalar>::const_matrix;
  using typename ParallelLinear<ExecutionSpace, Scalar>::vector;
  using typename ParallelLinear<ExecutionSpace, Scalar>::const_vector;

  RowParallelLinear(const comm::Group& shards, int in_features, int out_features,
                    const TensorParallelOptions& options = {});
  ShardRange local_in() const { return this->local(); }

  /// Y = (sum over shards of X_d W_d) + b: one all-reduce of [batch, out]. Collective.
  void forward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight, const const_vector& bias,
               const matrix& y);
  /// dX_d = dY W_d^T (skipped when dx is an empty View), dW_d = X_d^T dY, db = column sums of dY
  /// (the same on every shard; added when `accumulate`). Local.
  void backward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight, const const_matrix& dy,
                const matrix& dx, const matrix& dweight, const vector& dbias, bool accumulate = false) const;
};

}  // namespace lather::nn
