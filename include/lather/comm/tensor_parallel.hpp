#pragma once
// Tensor-parallel building blocks over the shard group of a Mesh (Megatron-LM's layers): a dense
// layer split by output columns, one split by input rows, the all-gather of a sharded activation,
// and a softmax cross-entropy over a vocabulary split across shards that never gathers the
// logits. Activations are 2-D row-major Views [batch, features]; products go to KokkosBlas::gemm.
//
// Uneven splits are supported: `total` features over S shards give shard d the range
// shard_range(total, S, d), the first total % S shards holding one more (a shard may hold none
// when total < S). Every collective call first agrees on the shapes across the shards (one small
// MPI_Allreduce, TensorParallelOptions::verify_shapes), so a mismatch is an error on every shard.
// A layer over a one-process Group (the default) is an ordinary dense layer.
//
// Failures: what a shard does before a call's collective (checking its Views, allocating the
// call's buffers, copying labels to the host) is agreed in that same small MPI_Allreduce, so a
// failure on one shard is a lather::Error on every shard, "<Class>::<call>: <message> (on group
// rank k of n)", thrown before any output is written; the object stays usable and the next call
// behaves as if the failed one had not been made. With verify_shapes off there is no agreement
// and a failure is thrown on its shard alone (nn::Transformer and nn::Mlp, whose shards run the
// same batch by construction, agree instead when they allocate their activations).

#include <lather/comm/group.hpp>

#include <Kokkos_Core.hpp>

#include <memory>

namespace lather::comm {

template <class Scalar, class MemorySpace>
using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;

/// The features [begin, begin + count) that shard `shard` of `shards` holds out of `total`.
struct ShardRange {
  int begin = 0;
  int count = 0;
};
ShardRange shard_range(int total, int shards, int shard);

struct TensorParallelOptions {
  /// Agree on the batch size (and argument validity) before every communicating call: one small
  /// MPI_Allreduce. Turn off only when every shard is known to pass the same shapes.
  bool verify_shapes = true;
};

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
  ParallelLinear(const char* name, const Group& shards, int in_features, int out_features, bool split_inputs,
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
  ColumnParallelLinear(const Group& shards, int in_features, int out_features,
                       const TensorParallelOptions& options = {});
  ShardRange local_out() const { return this->local(); }

  /// Y_d = X W_d + b_d. Local: no communication.
  void forward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight,
               const const_vector& bias, const matrix& y) const;
  /// dW_d = X^T dY_d, db_d = column sums of dY_d (local; added to dweight and dbias when
  /// `accumulate`), dX = sum over shards of dY_d W_d^T (one all-reduce of [batch, in]; skipped,
  /// with its agreement, when dx is an empty View). Collective.
  void backward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight,
                const const_matrix& dy, const matrix& dx, const matrix& dweight, const vector& dbias,
                bool accumulate = false);
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

  RowParallelLinear(const Group& shards, int in_features, int out_features,
                    const TensorParallelOptions& options = {});
  ShardRange local_in() const { return this->local(); }

  /// Y = (sum over shards of X_d W_d) + b: one all-reduce of [batch, out]. Collective.
  void forward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight,
               const const_vector& bias, const matrix& y);
  /// dX_d = dY W_d^T (skipped when dx is an empty View), dW_d = X_d^T dY, db = column sums of dY
  /// (the same on every shard; added when `accumulate`). Local.
  void backward(const ExecutionSpace& space, const const_matrix& x, const const_matrix& weight,
                const const_matrix& dy, const matrix& dx, const matrix& dweight, const vector& dbias,
                bool accumulate = false) const;
};

/// x [batch, f] := the shards' x_d [batch, f_d] side by side, shard d's at columns
/// shard_range(f, S, d). Keeps its buffers between calls; collective over `shards` (agreement +
/// one all-gather).
template <class ExecutionSpace, class Scalar>
class FeatureAllGather {
 public:
  using memory_space = typename ExecutionSpace::memory_space;

  explicit FeatureAllGather(const Group& shards, const TensorParallelOptions& options = {});
  ~FeatureAllGather();
  FeatureAllGather(FeatureAllGather&&) noexcept;
  FeatureAllGather& operator=(FeatureAllGather&&) noexcept;

  void operator()(const ExecutionSpace& space, const Matrix<const Scalar, memory_space>& local,
                  const Matrix<Scalar, memory_space>& gathered);

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

/// One-shot FeatureAllGather (fresh buffers each call): hold a FeatureAllGather to gather repeatedly.
template <class ExecutionSpace, class Scalar>
void all_gather_features(const ExecutionSpace& space, const Group& shards,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& local,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& gathered,
                         const TensorParallelOptions& options = {}) {
  FeatureAllGather<ExecutionSpace, Scalar>(shards, options)(space, local, gathered);
}

/// What VocabParallelCrossEntropy's general form adds to the plain cross-entropy.
struct CrossEntropyTerms {
  /// grad := gradient_scale x d(loss)/d(logits): 1 for the gradient of the summed loss, 1/batch
  /// for the mean's (what the plain form uses), 1/(global tokens) for a token mean.
  double gradient_scale = 1;
  /// PaLM's auxiliary z-loss weight: adds z_loss (log Z_i)^2 per row (Z_i the softmax normaliser),
  /// which keeps log Z near 0 in low precision (PaLM uses 1e-4). 0: off.
  double z_loss = 0;
};
/// Sums over the batch's rows, the same on every shard.
struct CrossEntropySums {
  double loss = 0;    ///< cross-entropy (nats), without the z-loss
  double z_loss = 0;  ///< z_loss (log Z)^2
  long correct = 0;   ///< rows whose target logit is the largest of all shards' (ties count as correct)
};

/// Softmax cross-entropy over a vocabulary split across shards, as Megatron's
/// vocab_parallel_cross_entropy: each shard holds logits_d [batch, V_d] for its vocabulary range;
/// the row maxima (max), then the sums of exp(logit - max) and the target logits (one sum of
/// [2, batch]; the target logit comes from the shard that owns the label) are reduced across
/// shards, never the logits. loss_i = log(sum_j exp(z_ij - m_i)) + m_i - z_{i,label_i}.
template <class ExecutionSpace, class Scalar>
class VocabParallelCrossEntropy {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using matrix = Matrix<Scalar, memory_space>;
  using const_matrix = Matrix<const Scalar, memory_space>;
  using vector = Kokkos::View<Scalar*, memory_space>;
  using labels_view = Kokkos::View<const int*, memory_space>;

  VocabParallelCrossEntropy(const Group& shards, int vocab_size, const TensorParallelOptions& options = {});
  ~VocabParallelCrossEntropy();
  VocabParallelCrossEntropy(VocabParallelCrossEntropy&&) noexcept;
  VocabParallelCrossEntropy& operator=(VocabParallelCrossEntropy&&) noexcept;

  int vocab_size() const;
  ShardRange local_vocab() const;

  /// Writes loss [batch] (per row) and grad [batch, V_d] = (softmax - onehot(label)) / batch, the
  /// gradient of the mean loss w.r.t. this shard's logits; returns the mean loss. `labels` are
  /// global class ids in [0, vocab_size), the same on every shard. Collective.
  double forward_backward(const ExecutionSpace& space, const const_matrix& logits,
                          const labels_view& labels, const vector& loss, const matrix& grad);
  /// The general form: the gradient scaled by terms.gradient_scale, the optional z-loss, and the
  /// accuracy, all without gathering the logits (the correct count needs no extra communication:
  /// the target logit and the row maximum are already reduced). Collective.
  CrossEntropySums forward_backward(const ExecutionSpace& space, const const_matrix& logits,
                                    const labels_view& labels, const vector& loss, const matrix& grad,
                                    const CrossEntropyTerms& terms);

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

}  // namespace lather::comm
