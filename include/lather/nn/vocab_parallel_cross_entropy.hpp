#pragma once
// Softmax cross-entropy over a vocabulary split across the shard group of a Mesh, as Megatron's
// vocab_parallel_cross_entropy: the logits are never gathered, only per-row maxima and sums are
// reduced across shards. Failures are agreed before the collectives as in parallel_linear.hpp.

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

  VocabParallelCrossEntropy(const comm::Group& shards, int vocab_size, const TensorParallelOptions& options = {});
  ~VocabParallelCrossEntropy();
  VocabParallelCrossEntropy(VocabParallelCrossEntropy&&) noexcept;
  VocabParallelCrossEntropy& operator=(VocabParallelCrossEntropy&&) noexcept;

  int vocab_size() const;
  ShardRange local_vocab() const;

  /// Writes loss [batch] (per row) and grad [batch, V_d] = (softmax - onehot(label)) / batch, the
  /// gradient of the mean loss w.r.t. this shard's logits; returns the mean loss. `labels` are
  /// global class ids in [0, vocab_size), the same on every shard. Collective.
  double forward_backward(const ExecutionSpace& space, const const_matrix& logits, const labels_view& labels,
                          const vector& loss, const matrix& grad);
  /// The general form: the gradient scaled by terms.gradient_scale, the optional z-loss, and the
  /// accuracy, all without gathering the logits (the correct count needs no extra communication:
  /// the target logit and the row maximum are already reduced). Collective.
  CrossEntropySums forward_backward(const ExecutionSpace& space, const const_matrix& logits, const labels_view& labels,
                                    const vector& loss, const matrix& grad, const CrossEntropyTerms& terms);

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

}  // namespace lather::nn
