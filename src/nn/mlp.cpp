#include <lather/nn/mlp.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>

#include <cmath>
#include <limits>
#include <random>

namespace lather::nn {

namespace {

using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
namespace kmath = ::lather::Impl::kmath;

template <class ExecutionSpace, class A, class B, class C>
void gemm(const ExecutionSpace& space, const char* ta, const char* tb, const A& a, const B& b, float beta, const C& c) {
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40100
  KokkosBlas::gemm(space, ta, tb, 1.0f, a, b, beta, c);
#else
  (void)space;
  KokkosBlas::gemm(ta, tb, 1.0f, a, b, beta, c);
#endif
}

}  // namespace

template <class ExecutionSpace>
Mlp<ExecutionSpace>::Mlp(const ExecutionSpace& space, std::vector<int> sizes, std::uint64_t seed,
                         ShardGroup<memory_space> group)
    : m_space(space), m_group(std::move(group)) {
  LATHER_REQUIRE(sizes.size() >= 2, "an MLP needs at least inputs and outputs, got ", sizes.size(), " sizes");
  for (int s : sizes) LATHER_REQUIRE(s >= 1, "MLP layer sizes must be >= 1, got ", s);
  const int shards = m_group.shards;
  LATHER_REQUIRE(shards >= 1 && m_group.shard >= 0 && m_group.shard < shards, "bad shard ", m_group.shard, " of ",
                 shards);
  LATHER_REQUIRE(shards == 1 || (m_group.sum && m_group.all_gather),
                 "a model split over ", shards, " shards needs the shard group's sum and all-gather");
  const int hidden = int(sizes.size()) - 2;
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
      LATHER_REQUIRE(layer.out % shards == 0, "hidden layer ", l + 1, " has ", layer.out,
                     " units, which the ", shards, " weight shards do not divide");
      layer.local_out = layer.out / shards;
    }
    if (layer.split == Split::row) layer.local_in = layer.in / shards;
    m_layers.push_back(layer);
  }

  // Parameters: the global tensors are drawn on the host from the seed, then each shard keeps its
  // slice, so every shard count starts from the same model.
  std::mt19937_64 rng(seed);
  for (std::size_t l = 0; l < m_layers.size(); ++l) {
    const auto& layer = m_layers[l];
    const std::string prefix = "layer" + std::to_string(l + 1);
    const float bound = std::sqrt(6.0f / float(layer.in));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    std::vector<float> kernel(std::size_t(layer.in) * layer.out);
    for (auto& w : kernel) w = uniform(rng);

    optim::ParameterSpec w_spec, b_spec;
    w_spec.name = prefix + "/kernel";
    w_spec.shape = {layer.local_in, layer.local_out};
    b_spec.name = prefix + "/bias";
    b_spec.shape = {layer.split == Split::column ? layer.local_out : layer.out};
    int row0 = 0, col0 = 0;
    if (layer.split == Split::column) {
      col0 = m_group.shard * layer.local_out;
      w_spec.split_axis = 1, w_spec.split_offset = col0, w_spec.global_shape = {layer.in, layer.out};
      b_spec.split_axis = 0, b_spec.split_offset = col0, b_spec.global_shape = {layer.out};
    } else if (layer.split == Split::row) {
      row0 = m_group.shard * layer.local_in;
      w_spec.split_axis = 0, w_spec.split_offset = row0, w_spec.global_shape = {layer.in, layer.out};
    }
    FlatTensor<float, memory_space> w(prefix + "/kernel", std::size_t(layer.local_in) * layer.local_out);
    FlatTensor<float, memory_space> b(prefix + "/bias", std::size_t(b_spec.shape[0]));
    auto host = Kokkos::create_mirror_view(w);
    for (int i = 0; i < layer.local_in; ++i)
      for (int j = 0; j < layer.local_out; ++j)
        host(std::size_t(i) * layer.local_out + j) = kernel[std::size_t(row0 + i) * layer.out + col0 + j];
    Kokkos::deep_copy(w, host);
    m_params.push_back(w);
    m_params.push_back(b);
    m_grads.push_back(FlatTensor<float, memory_space>(prefix + "/kernel/gradient", w.size()));
    m_grads.push_back(FlatTensor<float, memory_space>(prefix + "/bias/gradient", b.size()));
    m_specs.push_back(w_spec);
    m_specs.push_back(b_spec);
  }
}

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::allocate_activations(int rows) {
  if (rows <= m_rows) return;
  m_rows = rows;
  const std::size_t n = m_layers.size();
  m_z.assign(n, Matrix());
  m_a.assign(n + 1, Matrix());
  m_gathered.assign(n, Matrix());
  int widest = 0;
  for (std::size_t l = 0; l < n; ++l) {
    const auto& layer = m_layers[l];
    // A row-split layer produces the full width (after the sum over shards).
    const int width = layer.split == Split::column ? layer.local_out : layer.out;
    m_z[l] = Matrix(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Mlp::z"), rows, width);
    m_a[l + 1] = Matrix(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Mlp::a"), rows, width);
    const bool gathers = m_group.shards > 1 && layer.split == Split::column &&
                         (l + 1 == n || m_layers[l + 1].split != Split::row);
    if (gathers)
      m_gathered[l] = Matrix(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Mlp::gathered"), rows,
                             layer.out);
    widest = std::max({widest, layer.in, layer.out});
  }
  m_delta = Matrix(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Mlp::delta"), rows, widest);
  m_delta_previous =
      Matrix(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Mlp::delta_previous"), rows, widest);
  m_row_loss = Kokkos::View<double*, memory_space>("Lather::Mlp::row_loss", rows);
  m_row_correct = Kokkos::View<int*, memory_space>("Lather::Mlp::row_correct", rows);
}

template <class ExecutionSpace>
void Mlp<ExecutionSpace>::forward(const Matrix& inputs, int rows) {
  using Range = std::pair<int, int>;
  const Range r(0, rows);
  Matrix input = Kokkos::subview(inputs, r, Kokkos::ALL);
  for (std::size_t l = 0; l < m_layers.size(); ++l) {
    const auto& layer = m_layers[l];
    const Kokkos::View<const float**, Kokkos::LayoutRight, memory_space, Unmanaged> w(m_params[2 * l].data(),
                                                                                       layer.local_in, layer.local_out);
    const auto b = m_params[2 * l + 1];
    const auto z = Kokkos::subview(m_z[l], r, Kokkos::ALL);
    gemm(m_space, "N", "N", input, w, 0.0f, z);
    if (layer.split == Split::row && m_group.shards > 1) m_group.sum(z);  // the forward pass's all-reduce
    const bool last = l + 1 == m_layers.size();
    const auto a = Kokkos::subview(m_a[l + 1], r, Kokkos::ALL);
    const int width = int(z.extent(1));
    Kokkos::parallel_for(
        "Lather::Mlp::bias_relu", Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {rows, width}),
        KOKKOS_LAMBDA(int i, int j) {
          const float v = z(i, j) + b(j);
          z(i, j) = v;
          a(i, j) = last ? v : (v > 0.0f ? v : 0.0f);
        });
    if (m_gathered[l].data()) {
      const auto gathered = Kokkos::subview(m_gathered[l], r, Kokkos::ALL);
      m_group.all_gather(a, gathered);
      input = gathered;
    } else {
      input = a;
    }
  }
}

template <class ExecutionSpace>
BatchResult Mlp<ExecutionSpace>::loss_and_gradient(const Labels& labels, int rows, bool backward) {
  const std::size_t last = m_layers.size() - 1;
  const auto logits = Kokkos::subview(m_a[last + 1], std::pair<int, int>(0, rows), Kokkos::ALL);
  const int classes = int(logits.extent(1));
  const Kokkos::View<float**, Kokkos::LayoutRight, memory_space, Unmanaged> delta(m_delta.data(), rows, classes);
  const auto row_loss = m_row_loss;
  const auto row_correct = m_row_correct;
  Kokkos::parallel_for(
      "Lather::Mlp::softmax_cross_entropy", Kokkos::RangePolicy<ExecutionSpace>(m_space, 0, rows),
      KOKKOS_LAMBDA(int i) {
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
      "Lather::Mlp::loss_sum", Kokkos::RangePolicy<ExecutionSpace>(m_space, 0, rows),
      KOKKOS_LAMBDA(int i, double& sum) { sum += row_loss(i); }, loss);
  Kokkos::parallel_reduce(
      "Lather::Mlp::correct_count", Kokkos::RangePolicy<ExecutionSpace>(m_space, 0, rows),
      KOKKOS_LAMBDA(int i, int& count) { count += row_correct(i); }, correct);
  result.loss_sum = loss;
  result.correct = correct;
  return result;
}

template <class ExecutionSpace>
BatchResult Mlp<ExecutionSpace>::evaluate(const Matrix& inputs, const Labels& labels) {
  const int rows = int(inputs.extent(0));
  LATHER_REQUIRE(int(inputs.extent(1)) == m_layers.front().in, "MLP input has ", inputs.extent(1),
                 " features, the model expects ", m_layers.front().in);
  LATHER_REQUIRE(labels.extent(0) >= inputs.extent(0), "MLP: ", labels.extent(0), " labels for ", rows, " inputs");
  allocate_activations(rows);
  forward(inputs, rows);
  return loss_and_gradient(labels, rows, false);
}

template <class ExecutionSpace>
BatchResult Mlp<ExecutionSpace>::train_batch(const Matrix& inputs, const Labels& labels, bool accumulate) {
  const int rows = int(inputs.extent(0));
  LATHER_REQUIRE(int(inputs.extent(1)) == m_layers.front().in, "MLP input has ", inputs.extent(1),
                 " features, the model expects ", m_layers.front().in);
  allocate_activations(rows);
  forward(inputs, rows);
  const BatchResult result = loss_and_gradient(labels, rows, true);

  using Range = std::pair<int, int>;
  using Contiguous = Kokkos::View<float**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  const Range r(0, rows);
  const float beta = accumulate ? 1.0f : 0.0f;
  // dLoss/dZ of the current layer lives contiguously at the start of one scratch buffer, the
  // gradient of its input in the other (contiguous views keep every GEMM on the BLAS path).
  float* delta = m_delta.data();
  float* other = m_delta_previous.data();
  for (int l = int(m_layers.size()) - 1; l >= 0; --l) {
    const auto& layer = m_layers[l];
    const int width = layer.split == Split::column ? layer.local_out : layer.out;
    const Contiguous dz(delta, rows, width);
    const Matrix input = l == 0 ? Matrix(Kokkos::subview(inputs, r, Kokkos::ALL))
                                : Matrix(Kokkos::subview(m_gathered[l - 1].data() ? m_gathered[l - 1] : m_a[l], r,
                                                         Kokkos::ALL));
    const Contiguous dw(m_grads[2 * l].data(), layer.local_in, layer.local_out);
    gemm(m_space, "T", "N", input, dz, beta, dw);
    const auto db = m_grads[2 * l + 1];
    Kokkos::parallel_for(
        "Lather::Mlp::bias_gradient", Kokkos::RangePolicy<ExecutionSpace>(m_space, 0, width), KOKKOS_LAMBDA(int j) {
          float sum = 0;
          for (int i = 0; i < rows; ++i) sum += dz(i, j);
          db(j) = accumulate ? db(j) + sum : sum;
        });
    if (l == 0) break;
    // dA of the layer's input, then through the previous ReLU into that layer's dZ.
    const Kokkos::View<const float**, Kokkos::LayoutRight, memory_space, Unmanaged> w(m_params[2 * l].data(),
                                                                                       layer.local_in, layer.local_out);
    const auto& before = m_layers[l - 1];
    const int in_width = int(input.extent(1));
    const Contiguous da(other, rows, in_width);
    gemm(m_space, "N", "T", dz, w, 0.0f, da);
    if (layer.split == Split::column && m_group.shards > 1) m_group.sum(Matrix(da));  // input gradient all-reduce
    // If the previous layer's output was all-gathered, keep this shard's slice of the gradient.
    const int before_width = before.split == Split::column ? before.local_out : before.out;
    const int slice = m_gathered[l - 1].data() ? m_group.shard * before_width : 0;
    const auto z = Kokkos::subview(m_z[l - 1], r, Kokkos::ALL);
    const Contiguous next(delta, rows, before_width);
    Kokkos::parallel_for(
        "Lather::Mlp::relu_backward",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {rows, before_width}),
        KOKKOS_LAMBDA(int i, int j) { next(i, j) = z(i, j) > 0.0f ? da(i, slice + j) : 0.0f; });
  }
  return result;
}

template class Mlp<DefaultExecutionSpace>;

}  // namespace lather::nn
