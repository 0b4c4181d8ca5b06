#include <lather/nn/mlp.hpp>

#include "for_each_element.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>

namespace lather::nn {

namespace {
namespace kmath = ::lather::Impl::kmath;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
}  // namespace

template <class ExecutionSpace>
Mlp<ExecutionSpace>::Mlp(const ExecutionSpace& space, std::vector<int> sizes, std::uint64_t seed,
                         const comm::Mesh& mesh) {
  LATHER_REQUIRE(sizes.size() >= 2, "an MLP needs at least inputs and outputs, got ", sizes.size(), " sizes");
  for (int s : sizes) LATHER_REQUIRE(s >= 1, "MLP layer sizes must be >= 1, got ", s);
  const auto& shards = mesh.shards();
  m_shard_group = shards;
  m_shards = shards.size();
  m_shard = shards.rank();
  const int hidden = int(sizes.size()) - 2;
  // Every shard of a replica runs the same batch through the same layers, so the shapes agree by
  // construction: the layers skip their per-call agreement.
  comm::TensorParallelOptions trusted;
  trusted.verify_shapes = false;
  std::vector<ParameterSpec> specs;
  for (int l = 0; l + 1 < int(sizes.size()); ++l) {
    Layer layer;
    layer.in = sizes[l];
    layer.out = sizes[l + 1];
    // Hidden layers are column- then row-parallel whatever the shard count (one shard holds the
    // whole layer), so that optimizers see the same parameter layout for every shard count.
    if (l < hidden) layer.split = (l % 2 == 0) ? Split::column : Split::row;
    layer.local_in = layer.in;
    layer.local_out = layer.out;
    if (layer.split == Split::column) {
      LATHER_REQUIRE(layer.out % m_shards == 0, "hidden layer ", l + 1, " has ", layer.out, " units, which the ",
                     m_shards, " weight shards do not divide");
      layer.local_out = layer.out / m_shards;
    }
    if (layer.split == Split::row) layer.local_in = layer.in / m_shards;
    m_layers.push_back(layer);

    ParameterSpec w_spec, b_spec;
    const std::string prefix = "layer" + std::to_string(l + 1);
    w_spec.name = prefix + "/kernel";
    w_spec.shape = {layer.local_in, layer.local_out};
    b_spec.name = prefix + "/bias";
    b_spec.shape = {layer.split == Split::column ? layer.local_out : layer.out};
    if (layer.split == Split::column) {
      const int col0 = m_shard * layer.local_out;
      w_spec.split_axis = 1, w_spec.split_offset = col0, w_spec.global_shape = {layer.in, layer.out};
      b_spec.split_axis = 0, b_spec.split_offset = col0, b_spec.global_shape = {layer.out};
    } else if (layer.split == Split::row) {
      w_spec.split_axis = 0, w_spec.split_offset = m_shard * layer.local_in,
      w_spec.global_shape = {layer.in, layer.out};
    }
    specs.push_back(w_spec);
    specs.push_back(b_spec);

    if (layer.split == Split::row) {
      m_rows.push_back(
          std::make_unique<nn::RowParallelLinear<ExecutionSpace, float>>(shards, layer.in, layer.out, trusted));
      m_columns.emplace_back();
    } else {
      // The output layer is whole on every shard: a column-parallel layer over this process alone.
      const comm::Group& over = layer.split == Split::column ? shards : comm::Group();
      m_columns.push_back(
          std::make_unique<nn::ColumnParallelLinear<ExecutionSpace, float>>(over, layer.in, layer.out, trusted));
      m_rows.emplace_back();
    }
  }
  // The parameters' allocation and initial values may fail on one shard only (memory): the shards
  // agree on it before the all-gather's constructor agrees, and before any pass, so such a failure
  // is an error on every shard.
  shards.run_agreed("Mlp: parameters", [&] {
    ::lather::Impl::fault_point("mlp.construct");
    m_parameters = Parameters(space, specs);

    // Weights: the global tensors are drawn on the host from the seed, then each shard keeps its
    // slice, so every shard count starts from the same model. Biases start at zero.
    std::mt19937_64 rng(seed);
    for (std::size_t l = 0; l < m_layers.size(); ++l) {
      const auto& layer = m_layers[l];
      const float bound = std::sqrt(6.0f / float(layer.in));
      std::uniform_real_distribution<float> uniform(-bound, bound);
      std::vector<float> kernel(std::size_t(layer.in) * layer.out);
      for (auto& w : kernel) w = uniform(rng);
      const auto& spec = m_parameters.spec(2 * l);
      const int row0 = spec.split_axis == 0 ? int(spec.split_offset) : 0;
      const int col0 = spec.split_axis == 1 ? int(spec.split_offset) : 0;
      std::vector<float> mine(std::size_t(layer.local_in) * layer.local_out);
      for (int i = 0; i < layer.local_in; ++i)
        for (int j = 0; j < layer.local_out; ++j)
          mine[std::size_t(i) * layer.local_out + j] = kernel[std::size_t(row0 + i) * layer.out + col0 + j];
      m_parameters.set_value(space, 2 * l, mine);
    }
  });
  if (m_shards > 1) m_gather = std::make_unique<comm::FeatureAllGather<ExecutionSpace, float>>(shards, trusted);
}

template <class ExecutionSpace>
Mlp<ExecutionSpace>::~Mlp() = default;

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::adopt_parameters(const Parameters& parameters) {
  LATHER_REQUIRE(parameters.size() == m_parameters.size(), "Mlp::adopt_parameters: ", parameters.size(),
                 " parameters for a model of ", m_parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto& mine = m_parameters.spec(i);
    const auto& theirs = parameters.spec(i);
    LATHER_REQUIRE(mine.name == theirs.name && mine.shape == theirs.shape, "Mlp::adopt_parameters: parameter ", i,
                   " is '", theirs.name, "' of shape ", to_string(theirs.shape), "; the model's is '", mine.name,
                   "' of shape ", to_string(mine.shape));
  }
  m_parameters = parameters;
}

template <class ExecutionSpace>
auto Mlp<ExecutionSpace>::weight(std::size_t l) const -> ConstMatrix {
  const auto& layer = m_layers[l];
  return ConstMatrix(m_parameters.value(2 * l).data(), layer.local_in, layer.local_out);
}

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::allocate_activations(const ExecutionSpace& space, int rows) {
  if (rows <= m_capacity) return;
  // The layers skip their per-call agreement (the shards run the same batch), so the one local
  // failure a pass can meet, an allocation, is agreed here: every shard grows its buffers at the
  // same call, and one agreement over the shards makes a failure on one an error on all, before
  // the first collective. Only when the buffers grow, not on every batch.
  m_shard_group.run_agreed(::lather::Impl::concat("Mlp: activations for ", rows, " rows"), [&] {
    ::lather::Impl::fault_point("mlp.allocate");
    allocate_buffers(space, rows);
  });
  m_capacity = rows;
}

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::allocate_buffers(const ExecutionSpace& space, int rows) {
  const std::size_t n = m_layers.size();
  m_z.assign(n, Matrix());
  m_a.assign(n + 1, Matrix());
  m_gathered.assign(n, Matrix());
  const auto alloc = [&](const char* label, int width) {
    return Matrix(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("Lather::Mlp::") + label), rows,
                  width);
  };
  int widest = 0;
  for (std::size_t l = 0; l < n; ++l) {
    const auto& layer = m_layers[l];
    // A row-split layer produces the full width (after the sum over shards).
    const int width = layer.split == Split::column ? layer.local_out : layer.out;
    m_z[l] = alloc("z", width);
    if (l + 1 < n) m_a[l + 1] = alloc("a", width);
    const bool gathers =
        m_shards > 1 && layer.split == Split::column && l + 1 < n && m_layers[l + 1].split != Split::row;
    if (gathers) m_gathered[l] = alloc("gathered", layer.out);
    widest = std::max({widest, layer.in, layer.out});
  }
  const auto scratch = std::size_t(rows) * std::size_t(widest);
  m_delta = Kokkos::View<float*, memory_space>(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Mlp::delta"), scratch);
  m_delta_previous = Kokkos::View<float*, memory_space>(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Mlp::delta_previous"), scratch);
  m_row_loss = Kokkos::View<double*, memory_space>(Kokkos::view_alloc(space, "Lather::Mlp::row_loss"), rows);
  m_row_correct = Kokkos::View<int*, memory_space>(Kokkos::view_alloc(space, "Lather::Mlp::row_correct"), rows);
}

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::forward(const ExecutionSpace& space, const Matrix& inputs, int rows,
                                  const ParametersNeeded& needed) {
  using Range = std::pair<int, int>;
  const Range r(0, rows);
  Matrix input = Kokkos::subview(inputs, r, Kokkos::ALL);
  for (std::size_t l = 0; l < m_layers.size(); ++l) {
    if (needed) needed(2 * l, 2 * l + 2);  // this layer's kernel and bias
    const auto bias = Kokkos::View<const float*, memory_space>(m_parameters.value(2 * l + 1));
    const Matrix z = Kokkos::subview(m_z[l], r, Kokkos::ALL);
    if (m_rows[l])
      m_rows[l]->forward(space, input, weight(l), bias, z);
    else
      m_columns[l]->forward(space, input, weight(l), bias, z);
    if (l + 1 == m_layers.size()) break;  // the logits are z of the last layer
    const auto a = Kokkos::subview(m_a[l + 1], r, Kokkos::ALL);
    Impl::for_each_element(
        "Lather::Mlp::relu", space, std::size_t(rows), z.extent(1),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) { a(i, j) = z(i, j) > 0.0f ? z(i, j) : 0.0f; });
    if (m_gathered[l].data()) {
      const Matrix gathered = Kokkos::subview(m_gathered[l], r, Kokkos::ALL);
      (*m_gather)(space, a, gathered);
      input = gathered;
    } else {
      input = a;
    }
  }
}

template <class ExecutionSpace>
BatchResult Mlp<ExecutionSpace>::loss_and_gradient(const ExecutionSpace& space, const Labels& labels, int rows,
                                                   bool backward) {
  const auto logits = Kokkos::subview(m_z.back(), std::pair<int, int>(0, rows), Kokkos::ALL);
  const int classes = int(logits.extent(1));
  const Kokkos::View<float**, Kokkos::LayoutRight, memory_space, Unmanaged> delta(m_delta.data(), rows, classes);
  const auto row_loss = m_row_loss;
  const auto row_correct = m_row_correct;
  Kokkos::parallel_for(
      "Lather::Mlp::softmax_cross_entropy", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows), KOKKOS_LAMBDA(int i) {
        float top = logits(i, 0);
        int arg = 0;
        for (int c = 1; c < classes; ++c)
          if (logits(i, c) > top) top = logits(i, c), arg = c;
        double sum = 0;
        for (int c = 0; c < classes; ++c) sum += kmath::exp(double(logits(i, c) - top));
        const int label = labels(i);
        row_loss(i) = kmath::log(sum) - double(logits(i, label) - top);
        row_correct(i) = arg == label;
        if (backward)
          for (int c = 0; c < classes; ++c)
            delta(i, c) = float(kmath::exp(double(logits(i, c) - top)) / sum) - (c == label ? 1.0f : 0.0f);
      });
  BatchResult result;
  result.samples = rows;
  double loss = 0;
  int correct = 0;
  Kokkos::parallel_reduce(
      "Lather::Mlp::loss_sum", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows),
      KOKKOS_LAMBDA(int i, double& sum) { sum += row_loss(i); }, loss);
  Kokkos::parallel_reduce(
      "Lather::Mlp::correct_count", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows),
      KOKKOS_LAMBDA(int i, int& count) { count += row_correct(i); }, correct);
  result.loss_sum = loss;
  result.correct = correct;
  return result;
}

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::backward(const ExecutionSpace& space, const Matrix& inputs, int rows, bool accumulate,
                                   const GradientsReady& ready, const ParametersNeeded& needed) {
  using Range = std::pair<int, int>;
  using Contiguous = Kokkos::View<float**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  const Range r(0, rows);
  // dLoss/dZ of the current layer lives contiguously at the start of one scratch buffer, the
  // gradient of its input in the other (contiguous views keep every GEMM on the BLAS path).
  float* delta = m_delta.data();
  float* other = m_delta_previous.data();
  for (int l = int(m_layers.size()) - 1; l >= 0; --l) {
    const auto& layer = m_layers[l];
    if (needed) needed(std::size_t(2 * l), std::size_t(2 * l + 2));
    const int width = layer.split == Split::column ? layer.local_out : layer.out;
    const Contiguous dz(delta, rows, width);
    const Matrix input =
        l == 0 ? Matrix(Kokkos::subview(inputs, r, Kokkos::ALL))
               : Matrix(Kokkos::subview(m_gathered[l - 1].data() ? m_gathered[l - 1] : m_a[l], r, Kokkos::ALL));
    const Contiguous dw(m_parameters.gradient(2 * l).data(), layer.local_in, layer.local_out);
    const auto db = m_parameters.gradient(2 * l + 1);
    // The input's gradient, except for the first layer's (the data's).
    const Contiguous da = l == 0 ? Contiguous() : Contiguous(other, rows, int(input.extent(1)));
    if (m_rows[l])
      m_rows[l]->backward(space, input, weight(l), dz, da, dw, db, accumulate);
    else
      m_columns[l]->backward(space, input, weight(l), dz, da, dw, db, accumulate);
    if (ready) ready(std::size_t(2 * l), std::size_t(2 * l + 2));  // this layer's kernel and bias
    if (l == 0) break;
    // Through the previous ReLU into that layer's dZ; where the previous layer's output was
    // all-gathered, this shard's slice of the gradient.
    const auto& before = m_layers[l - 1];
    const int before_width = before.split == Split::column ? before.local_out : before.out;
    const int slice = m_gathered[l - 1].data() ? m_shard * before_width : 0;
    const auto z = Kokkos::subview(m_z[l - 1], r, Kokkos::ALL);
    const Contiguous next(delta, rows, before_width);
    // The gradient is loaded whatever the sign, so that the choice is a select the host compiler
    // vectorises: loaded only where z > 0, it was a branch taken at random, mispredicted about
    // every other element (0.19 ms a call for 128 x 512 and 128 x 256 values, 7x the forward ReLU).
    Impl::for_each_element(
        "Lather::Mlp::relu_backward", space, std::size_t(rows), std::size_t(before_width),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) {
          const float gradient = da(i, slice + j);
          next(i, j) = z(i, j) > 0.0f ? gradient : 0.0f;
        });
  }
}

template <class ExecutionSpace>
BatchResult Mlp<ExecutionSpace>::evaluate(const ExecutionSpace& space, const Matrix& inputs, const Labels& labels,
                                          const ParametersNeeded& needed) {
  const int rows = int(inputs.extent(0));
  LATHER_REQUIRE(int(inputs.extent(1)) == m_layers.front().in, "MLP input has ", inputs.extent(1),
                 " features, the model expects ", m_layers.front().in);
  LATHER_REQUIRE(labels.extent(0) >= inputs.extent(0), "MLP: ", labels.extent(0), " labels for ", rows, " inputs");
  allocate_activations(space, rows);
  forward(space, inputs, rows, needed);
  return loss_and_gradient(space, labels, rows, false);
}

template <class ExecutionSpace>
BatchResult Mlp<ExecutionSpace>::train_batch(const ExecutionSpace& space, const Matrix& inputs, const Labels& labels,
                                             bool accumulate, const GradientsReady& ready,
                                             const ParametersNeeded& needed) {
  const int rows = int(inputs.extent(0));
  LATHER_REQUIRE(int(inputs.extent(1)) == m_layers.front().in, "MLP input has ", inputs.extent(1),
                 " features, the model expects ", m_layers.front().in);
  allocate_activations(space, rows);
  forward(space, inputs, rows, needed);
  const BatchResult result = loss_and_gradient(space, labels, rows, true);
  backward(space, inputs, rows, accumulate, ready, needed);
  return result;
}

template class Mlp<DefaultExecutionSpace>;

}  // namespace lather::nn
