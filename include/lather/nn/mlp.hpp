#pragma once
// The multilayer perceptron the training driver trains: dense layers with ReLU between them and a
// softmax cross-entropy head, forward and backward with Kokkos kernels and Kokkos Kernels GEMMs.
// Hidden layers can be split across the S ranks of a replica (tensor parallelism): alternately
// column-parallel and row-parallel, as Megatron pairs them.

#include <lather/core/tensor.hpp>
#include <lather/optim/optimizer.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace lather::nn {

/// What the model needs from the ranks of its replica when hidden layers are split: a sum over
/// the shard group (in place, on Views of the model's memory space) and an all-gather along the
/// feature dimension. Single-shard models use none of it.
template <class MemorySpace>
struct ShardGroup {
  int shards = 1;
  int shard = 0;
  /// x <- sum over the shards of x (all shards pass Views of the same shape).
  std::function<void(const Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace>&)> sum;
  /// out[:, d*w:(d+1)*w] <- in of shard d (w = in.extent(1)); out is [rows, shards * w].
  std::function<void(const Kokkos::View<const float**, Kokkos::LayoutRight, MemorySpace>&,
                     const Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace>&)>
      all_gather;
};

struct BatchResult {
  double loss_sum = 0;  ///< sum over the batch of the cross-entropy losses
  long correct = 0;     ///< samples whose arg-max logit is the label
  long samples = 0;
};

template <class ExecutionSpace>
class Mlp {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, memory_space>;
  using Labels = Kokkos::View<std::int32_t*, memory_space>;

  enum class Split { none, column, row };
  struct Layer {
    int in = 0, out = 0;              ///< global sizes
    int local_in = 0, local_out = 0;  ///< this shard's sizes
    Split split = Split::none;
  };

  /// sizes = {inputs, hidden..., classes}; parameters initialised from `seed` (He-uniform weights,
  /// zero biases) identically for every rank count and shard count.
  Mlp(const ExecutionSpace& space, std::vector<int> sizes, std::uint64_t seed, ShardGroup<memory_space> group = {});

  const std::vector<Layer>& layers() const { return m_layers; }
  /// Local parameters (kernel then bias per layer) with their global shapes and split axes.
  const std::vector<optim::ParameterSpec>& parameter_specs() const { return m_specs; }
  const TensorList<float, memory_space>& parameters() const { return m_params; }
  const TensorList<float, memory_space>& gradients() const { return m_grads; }

  /// Forward and backward on one micro-batch: the gradient of the summed loss is added to
  /// gradients() (set instead of added when `accumulate` is false).
  BatchResult train_batch(const Matrix& inputs, const Labels& labels, bool accumulate);
  /// Forward only: loss sum and correct count.
  BatchResult evaluate(const Matrix& inputs, const Labels& labels);

  // Implementation steps. Public only because nvcc rejects an extended __host__ __device__ lambda
  // (KOKKOS_LAMBDA) whose enclosing member function is private or protected; not for users.
  void forward(const Matrix& inputs, int rows);
  BatchResult loss_and_gradient(const Labels& labels, int rows, bool backward);

 private:
  void allocate_activations(int rows);

  ExecutionSpace m_space;
  std::vector<Layer> m_layers;
  std::vector<optim::ParameterSpec> m_specs;
  TensorList<float, memory_space> m_params, m_grads;
  ShardGroup<memory_space> m_group;
  int m_rows = 0;
  std::vector<Matrix> m_z;          // pre-activations per layer [rows, local_out] (row layers: full out)
  std::vector<Matrix> m_a;          // activations feeding each layer (m_a[0] = input)
  std::vector<Matrix> m_gathered;   // all-gathered activations where a split layer feeds a whole one
  Matrix m_delta, m_delta_previous;
  Kokkos::View<double*, memory_space> m_row_loss;
  Kokkos::View<int*, memory_space> m_row_correct;
};

}  // namespace lather::nn
