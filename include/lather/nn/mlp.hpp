#pragma once
// The multilayer perceptron the training driver trains: dense layers with ReLU between them and a
// softmax cross-entropy head, forward and backward with Kokkos kernels and Kokkos Kernels GEMMs.
// Built from comm's tensor-parallel layers: on a Mesh with S weight shards, hidden layers are split
// across the S ranks of a replica, alternately column-parallel and row-parallel as Megatron pairs
// them; the output layer is whole on every shard.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/mesh.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/nn/parallel_linear.hpp>
#include <lather/core/parameters.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace lather::nn {

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
  using Parameters = ParameterList<float, memory_space>;

  enum class Split { none, column, row };
  struct Layer {
    int in = 0, out = 0;              ///< global sizes
    int local_in = 0, local_out = 0;  ///< this shard's sizes
    Split split = Split::none;
  };

  /// sizes = {inputs, hidden..., classes}; parameters initialised from `seed` (He-uniform weights,
  /// zero biases) identically for every rank count and shard count. Hidden layers are split over
  /// mesh.shards(); collective over it.
  Mlp(const ExecutionSpace& space, std::vector<int> sizes, std::uint64_t seed, const comm::Mesh& mesh = comm::Mesh());
  ~Mlp();

  const std::vector<Layer>& layers() const { return m_layers; }
  /// This shard's parameters (kernel then bias per layer) with their global shapes and split
  /// axes; the gradients live in one contiguous buffer.
  const Parameters& parameters() const { return m_parameters; }
  const std::vector<ParameterSpec>& parameter_specs() const { return m_parameters.specs(); }
  /// Moves the gradients into `storage` (ParameterList::place_gradients): memory the gradient
  /// reducer sums where it lies (comm::GradientReducer::shared_gradient_storage).
  void place_gradients(const ExecutionSpace& space, const typename Parameters::tensor& storage) {
    m_parameters.place_gradients(space, storage);
  }
  /// Makes `parameters` (the same names and shapes as parameters(), in the same order) the ones
  /// the passes read and write, releasing the model's own: for sharded parameters, whose values
  /// live in gather buffers (comm::ParameterShards::gathered, with a ParametersNeeded hook on
  /// every pass). Throws lather::Error naming the first parameter that differs.
  void adopt_parameters(const Parameters& parameters);

  /// Forward and backward on one micro-batch: the gradient of the summed loss is added to the
  /// parameters' gradients (set instead of added when `accumulate` is false). Collective over the
  /// shards when split. `ready`, when given, hears of each layer's gradients as the backward
  /// writes them (the step's last micro-batch: an overlapped reduction). `needed`, when given,
  /// is asked for each layer's parameters before its forward and before its backward.
  BatchResult train_batch(const ExecutionSpace& space, const Matrix& inputs, const Labels& labels, bool accumulate,
                          const GradientsReady& ready = {}, const ParametersNeeded& needed = {});
  /// Forward only: loss sum and correct count.
  BatchResult evaluate(const ExecutionSpace& space, const Matrix& inputs, const Labels& labels,
                       const ParametersNeeded& needed = {});

  // Implementation steps. Public only because nvcc rejects an extended __host__ __device__ lambda
  // (KOKKOS_LAMBDA) whose enclosing member function is private or protected; not for users.
  void forward(const ExecutionSpace& space, const Matrix& inputs, int rows, const ParametersNeeded& needed = {});
  BatchResult loss_and_gradient(const ExecutionSpace& space, const Labels& labels, int rows, bool backward);
  void backward(const ExecutionSpace& space, const Matrix& inputs, int rows, bool accumulate,
                const GradientsReady& ready = {}, const ParametersNeeded& needed = {});

 private:
  using ConstMatrix = Kokkos::View<const float**, Kokkos::LayoutRight, memory_space>;
  /// Grows the activations to `rows` rows, agreed over the shards (one small collective, only
  /// when they grow).
  void allocate_activations(const ExecutionSpace& space, int rows);
  void allocate_buffers(const ExecutionSpace& space, int rows);
  ConstMatrix weight(std::size_t l) const;

  std::vector<Layer> m_layers;
  Parameters m_parameters;
  comm::Group m_shard_group;
  int m_shards = 1, m_shard = 0;
  /// Per layer: the column-parallel layer (also the whole layers, over one process) or the
  /// row-parallel one; and the all-gather after a split layer that feeds a whole one.
  std::vector<std::unique_ptr<nn::ColumnParallelLinear<ExecutionSpace, float>>> m_columns;
  std::vector<std::unique_ptr<nn::RowParallelLinear<ExecutionSpace, float>>> m_rows;
  std::unique_ptr<comm::FeatureAllGather<ExecutionSpace, float>> m_gather;
  int m_capacity = 0;
  std::vector<Matrix> m_z;         // pre-activations per layer [rows, local width] (row layers: full out)
  std::vector<Matrix> m_a;         // activations feeding each layer (m_a[0] unused: the input)
  std::vector<Matrix> m_gathered;  // all-gathered activations where a split layer feeds a whole one
  Kokkos::View<float*, memory_space> m_delta, m_delta_previous;
  Kokkos::View<double*, memory_space> m_row_loss;
  Kokkos::View<int*, memory_space> m_row_correct;
};

}  // namespace lather::nn
