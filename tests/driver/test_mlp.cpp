// The MLP's loss and gradients against a plain double-precision model of the same network
// (loops, no BLAS), itself checked against central finite differences.
#include <lather/nn/mlp.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

/// Plain model: layers W [in, out], b [out]; ReLU between; softmax cross-entropy summed over rows.
struct PlainMlp {
  std::vector<int> sizes;
  std::vector<std::vector<double>> w = {}, b = {};  // filled after construction from `sizes`

  double loss(const std::vector<double>& x, const std::vector<int>& y, int rows, std::vector<std::vector<double>>* dw,
              std::vector<std::vector<double>>* db) const {
    const std::size_t n = w.size();
    std::vector<std::vector<double>> a(n + 1), z(n);
    a[0] = x;
    for (std::size_t l = 0; l < n; ++l) {
      const int in = sizes[l], out = sizes[l + 1];
      z[l].assign(std::size_t(rows) * out, 0.0);
      a[l + 1].assign(z[l].size(), 0.0);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < out; ++j) {
          double s = b[l][j];
          for (int k = 0; k < in; ++k) s += a[l][i * in + k] * w[l][k * out + j];
          z[l][i * out + j] = s;
          a[l + 1][i * out + j] = (l + 1 == n) ? s : std::max(s, 0.0);
        }
    }
    const int classes = sizes.back();
    double total = 0;
    std::vector<double> delta(std::size_t(rows) * classes);
    for (int i = 0; i < rows; ++i) {
      double top = -1e300, sum = 0;
      for (int c = 0; c < classes; ++c) top = std::max(top, a[n][i * classes + c]);
      for (int c = 0; c < classes; ++c) sum += std::exp(a[n][i * classes + c] - top);
      total += std::log(sum) + top - a[n][i * classes + y[i]];
      for (int c = 0; c < classes; ++c)
        delta[i * classes + c] = std::exp(a[n][i * classes + c] - top) / sum - (c == y[i] ? 1.0 : 0.0);
    }
    if (!dw) return total;
    dw->assign(n, {});
    db->assign(n, {});
    for (int l = int(n) - 1; l >= 0; --l) {
      const int in = sizes[l], out = sizes[l + 1];
      (*dw)[l].assign(std::size_t(in) * out, 0.0);
      (*db)[l].assign(out, 0.0);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < out; ++j) {
          (*db)[l][j] += delta[i * out + j];
          for (int k = 0; k < in; ++k) (*dw)[l][k * out + j] += a[l][i * in + k] * delta[i * out + j];
        }
      if (l == 0) break;
      std::vector<double> previous(std::size_t(rows) * in, 0.0);
      for (int i = 0; i < rows; ++i)
        for (int k = 0; k < in; ++k) {
          double s = 0;
          for (int j = 0; j < out; ++j) s += delta[i * out + j] * w[l][k * out + j];
          previous[i * in + k] = z[l - 1][i * in + k] > 0 ? s : 0.0;
        }
      delta.swap(previous);
    }
    return total;
  }
};

TEST(Mlp, GradientsMatchPlainModel) {
  const std::vector<int> sizes = {5, 7, 6, 3};
  const int rows = 9;
  lather::nn::Mlp<Space> mlp(Space(), sizes, 17);
  ASSERT_EQ(mlp.parameters().size(), 6u);
  PlainMlp plain{sizes};
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    auto hw = Kokkos::create_mirror_view(mlp.parameters().value(2 * l));
    Kokkos::deep_copy(hw, mlp.parameters().value(2 * l));
    plain.w.emplace_back(hw.data(), hw.data() + hw.size());
    plain.b.emplace_back(sizes[l + 1], 0.0);
    // Non-zero biases exercise the bias paths.
    std::vector<float> bias(sizes[l + 1]);
    for (int j = 0; j < sizes[l + 1]; ++j) bias[j] = plain.b[l][j] = 0.1 * std::sin(1.0 + j + l);
    auto hb = Kokkos::create_mirror_view(mlp.parameters().value(2 * l + 1));
    for (int j = 0; j < sizes[l + 1]; ++j) hb(j) = bias[j];
    Kokkos::deep_copy(mlp.parameters().value(2 * l + 1), hb);
  }
  std::mt19937 rng(4);
  std::normal_distribution<double> normal;
  std::vector<double> x(rows * sizes[0]);
  std::vector<int> y(rows);
  for (auto& v : x) v = float(normal(rng));
  for (int i = 0; i < rows; ++i) y[i] = i % sizes.back();
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> xs("x", rows, sizes[0]);
  Kokkos::View<std::int32_t*, Mem> ys("y", rows);
  auto hx = Kokkos::create_mirror_view(xs);
  auto hy = Kokkos::create_mirror_view(ys);
  for (int i = 0; i < rows; ++i) {
    hy(i) = y[i];
    for (int k = 0; k < sizes[0]; ++k) hx(i, k) = float(x[i * sizes[0] + k]);
  }
  Kokkos::deep_copy(xs, hx);
  Kokkos::deep_copy(ys, hy);

  // The plain model against finite differences (double, h = 1e-6: error ~ h^2 + 1e-16 / h).
  std::vector<std::vector<double>> dw, db;
  const double base = plain.loss(x, y, rows, &dw, &db);
  for (std::size_t l = 0; l < plain.w.size(); ++l)
    for (std::size_t k = 0; k < plain.w[l].size(); k += 5) {
      PlainMlp up = plain, down = plain;
      up.w[l][k] += 1e-6;
      down.w[l][k] -= 1e-6;
      const double fd = (up.loss(x, y, rows, nullptr, nullptr) - down.loss(x, y, rows, nullptr, nullptr)) / 2e-6;
      ASSERT_NEAR(dw[l][k], fd, 1e-6 * (1 + std::fabs(fd)));
    }

  // Lather's MLP in float against the plain model: float rounding over sums of <= 9 * 7 terms.
  const auto result = mlp.train_batch(Space(), xs, ys, false);
  EXPECT_NEAR(result.loss_sum, base, 1e-5 * std::fabs(base));
  EXPECT_EQ(result.samples, rows);
  for (std::size_t l = 0; l < plain.w.size(); ++l) {
    auto gw = Kokkos::create_mirror_view(mlp.parameters().gradient(2 * l));
    auto gb = Kokkos::create_mirror_view(mlp.parameters().gradient(2 * l + 1));
    Kokkos::deep_copy(gw, mlp.parameters().gradient(2 * l));
    Kokkos::deep_copy(gb, mlp.parameters().gradient(2 * l + 1));
    for (std::size_t k = 0; k < dw[l].size(); ++k) EXPECT_NEAR(gw(k), dw[l][k], 1e-4 * (1 + std::fabs(dw[l][k])));
    for (std::size_t k = 0; k < db[l].size(); ++k) EXPECT_NEAR(gb(k), db[l][k], 1e-4 * (1 + std::fabs(db[l][k])));
  }
  // Accumulating a second identical micro-batch doubles the gradient.
  auto before = Kokkos::create_mirror_view(mlp.parameters().gradient(0));
  Kokkos::deep_copy(before, mlp.parameters().gradient(0));
  std::vector<float> first(before.data(), before.data() + before.size());
  mlp.train_batch(Space(), xs, ys, true);
  Kokkos::deep_copy(before, mlp.parameters().gradient(0));
  for (std::size_t k = 0; k < first.size(); ++k) EXPECT_FLOAT_EQ(before(k), 2 * first[k]);
  const auto eval = mlp.evaluate(Space(), xs, ys);
  EXPECT_NEAR(eval.loss_sum, base, 1e-5 * std::fabs(base));
}

}  // namespace
