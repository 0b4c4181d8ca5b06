// The transformer's local layers (LayerNorm, GELU, causal attention, embeddings): every input
// gradient in double against central finite differences of L = sum(w o output) with random
// weights w, and every forward pass against a plain host loop written independently here.
//
// Finite-difference tolerance: with step h = 1e-6 max(1, |x|), the central difference's error is
// truncation h^2 |f'''| / 6 ~ 1e-13 (inputs and third derivatives are O(1)) plus rounding
// eps |L| / h ~ 1e-16 * 10 / 1e-6 = 1e-9, against gradients of size O(0.1 .. 1): ~1e-8 relative.
// The checks assert max |fd - analytic| / max |analytic| <= 1e-6, far above that and far below
// any real mistake (a wrong term changes the gradient at O(1)).
#include <lather/core/error.hpp>
#include <lather/nn/causal_attention.hpp>
#include <lather/nn/embedding.hpp>
#include <lather/nn/gelu.hpp>
#include <lather/nn/layer_norm.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Matrix = lather::comm::Matrix<T, Mem>;
template <class T>
using Vector = Kokkos::View<T*, Mem>;
using Host = std::vector<double>;

constexpr double fd_tolerance = 1e-6;

Host random_values(std::size_t n, std::uint64_t seed, double low = -1, double high = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(low, high);
  Host values(n);
  for (auto& v : values) v = uniform(rng);
  return values;
}

template <class T = double>
Matrix<T> matrix(const Host& values, int rows, int columns) {
  Matrix<T> m("matrix", rows, columns);
  auto host = Kokkos::create_mirror_view(m);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < columns; ++j) host(i, j) = T(values[std::size_t(i) * columns + j]);
  Kokkos::deep_copy(m, host);
  return m;
}

template <class T = double>
Vector<T> vector(const Host& values) {
  Vector<T> v("vector", values.size());
  auto host = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = T(values[i]);
  Kokkos::deep_copy(v, host);
  return v;
}

Vector<std::int32_t> tokens_view(const std::vector<std::int32_t>& values) {
  Vector<std::int32_t> v("tokens", values.size());
  auto host = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = values[i];
  Kokkos::deep_copy(v, host);
  return v;
}

template <class T>
Host host(const Matrix<T>& m) {
  auto h = Kokkos::create_mirror_view(m);
  Kokkos::deep_copy(h, m);
  Host out(m.size());
  for (std::size_t i = 0; i < m.extent(0); ++i)
    for (std::size_t j = 0; j < m.extent(1); ++j) out[i * m.extent(1) + j] = double(h(i, j));
  return out;
}

template <class T>
Host host(const Vector<T>& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return Host(h.data(), h.data() + h.size());
}

double dot(const Host& a, const Host& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

/// max |a - b| / max |b|: the error relative to the size of the reference as a whole, so that
/// entries near zero do not turn rounding into large relative errors.
double relative_error(const Host& a, const Host& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, size = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    size = std::max(size, std::fabs(b[i]));
  }
  return size > 0 ? diff / size : diff;
}

/// Central differences of loss() w.r.t. every element of `values`, which loss() reads.
Host finite_differences(Host& values, const std::function<double()>& loss) {
  Host gradient(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double x = values[i], h = 1e-6 * std::max(1.0, std::fabs(x));
    const double up = x + h, down = x - h;
    values[i] = up;
    const double plus = loss();
    values[i] = down;
    const double minus = loss();
    values[i] = x;
    gradient[i] = (plus - minus) / (up - down);
  }
  return gradient;
}

Host plus(const Host& a, const Host& b) {
  Host sum(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  return sum;
}

// ---- LayerNorm ------------------------------------------------------------------------------

struct LayerNormOutput {
  Host y, mean, rstd;
};

LayerNormOutput layer_norm(const Host& x, const Host& gamma, const Host& beta, int rows, int features,
                           double epsilon = 1e-5) {
  Matrix<double> y("y", rows, features);
  Vector<double> mean("mean", rows), rstd("rstd", rows);
  lather::nn::layer_norm_forward<Space, double>(Space(), matrix(x, rows, features), vector(gamma), vector(beta), y,
                                                mean, rstd, epsilon);
  return {host(y), host(mean), host(rstd)};
}

TEST(LayerNorm, ForwardMatchesPlainLoop) {
  const int rows = 6, features = 11;
  // Rows with an offset far from zero: the two-pass variance keeps them exact.
  Host x = random_values(rows * features, 1);
  for (int j = 0; j < features; ++j) x[features + j] += 1000;
  const Host gamma = random_values(features, 2), beta = random_values(features, 3);
  const auto out = layer_norm(x, gamma, beta, rows, features);
  for (int i = 0; i < rows; ++i) {
    double mean = 0, variance = 0;
    for (int j = 0; j < features; ++j) mean += x[i * features + j] / features;
    for (int j = 0; j < features; ++j) variance += std::pow(x[i * features + j] - mean, 2) / features;
    const double rstd = 1 / std::sqrt(variance + 1e-5);
    EXPECT_NEAR(out.mean[i], mean, 1e-12 * (1 + std::fabs(mean)));
    EXPECT_NEAR(out.rstd[i], rstd, 1e-12 * rstd);
    for (int j = 0; j < features; ++j)
      EXPECT_NEAR(out.y[i * features + j], (x[i * features + j] - mean) * rstd * gamma[j] + beta[j], 1e-11);
  }
  // Without gamma, beta and epsilon, every row has mean 0 and (biased) variance 1.
  const auto plain = layer_norm(x, Host(features, 1.0), Host(features, 0.0), rows, features, 0.0);
  for (int i = 0; i < rows; ++i) {
    double mean = 0, variance = 0;
    for (int j = 0; j < features; ++j) mean += plain.y[i * features + j] / features;
    for (int j = 0; j < features; ++j) variance += std::pow(plain.y[i * features + j] - mean, 2) / features;
    EXPECT_NEAR(mean, 0, 1e-12);
    EXPECT_NEAR(variance, 1, 1e-12);
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  // 7 features: one group of four lanes and a tail; 37: a whole host strip of 32 columns for the
  // parameters' sums, a partial one, and nine groups of four lanes and a tail.
  const int rows = 5;
  for (const int features : {7, 37}) {
    SCOPED_TRACE("features = " + std::to_string(features));
    Host x = random_values(rows * features, 11), gamma = random_values(features, 12, 0.5, 1.5),
         beta = random_values(features, 13);
    const Host w = random_values(rows * features, 14);
    const auto loss = [&] { return dot(w, layer_norm(x, gamma, beta, rows, features).y); };

    const auto out = layer_norm(x, gamma, beta, rows, features);
    Matrix<double> dx("dx", rows, features);
    Vector<double> dgamma("dgamma", features), dbeta("dbeta", features);
    const auto backward = [&](bool add_to_dx, bool accumulate) {
      lather::nn::layer_norm_backward<Space, double>(Space(), matrix(x, rows, features), vector(gamma),
                                                     vector(out.mean), vector(out.rstd), matrix(w, rows, features), dx,
                                                     add_to_dx, dgamma, dbeta, accumulate);
    };
    backward(false, false);
    const Host analytic_x = host(dx), analytic_gamma = host(dgamma), analytic_beta = host(dbeta);
    EXPECT_LE(relative_error(analytic_x, finite_differences(x, loss)), fd_tolerance);
    EXPECT_LE(relative_error(analytic_gamma, finite_differences(gamma, loss)), fd_tolerance);
    EXPECT_LE(relative_error(analytic_beta, finite_differences(beta, loss)), fd_tolerance);

    // add_to_dx and accumulate add to what is there: exactly the sum, one rounding per element.
    const Host dx0 = random_values(rows * features, 15), dgamma0 = random_values(features, 16),
               dbeta0 = random_values(features, 17);
    Kokkos::deep_copy(dx, matrix(dx0, rows, features));
    Kokkos::deep_copy(dgamma, vector(dgamma0));
    Kokkos::deep_copy(dbeta, vector(dbeta0));
    backward(true, true);
    EXPECT_EQ(host(dx), plus(dx0, analytic_x));
    EXPECT_EQ(host(dgamma), plus(dgamma0, analytic_gamma));
    EXPECT_EQ(host(dbeta), plus(dbeta0, analytic_beta));

    // dx may overwrite dy.
    Matrix<double> in_place = matrix(w, rows, features);
    Kokkos::deep_copy(dgamma, 0.0);
    lather::nn::layer_norm_backward<Space, double>(Space(), matrix(x, rows, features), vector(gamma), vector(out.mean),
                                                   vector(out.rstd), in_place, in_place, false, dgamma, dbeta, false);
    EXPECT_EQ(host(in_place), analytic_x);
    EXPECT_EQ(host(dgamma), analytic_gamma);
  }
}

TEST(LayerNorm, RejectsMismatchedShapes) {
  Matrix<double> x("x", 3, 4), y("y", 3, 5);
  Vector<double> gamma("gamma", 4), beta("beta", 4), mean("mean", 3), rstd("rstd", 3);
  EXPECT_THROW((lather::nn::layer_norm_forward<Space, double>(Space(), x, gamma, beta, y, mean, rstd)), lather::Error);
  EXPECT_THROW((lather::nn::layer_norm_forward<Space, double>(Space(), x, Vector<double>("g", 5), beta, x, mean, rstd)),
               lather::Error);
}

// ---- GELU -----------------------------------------------------------------------------------

Host gelu(const Host& x, int rows, int columns) {
  Matrix<double> y("y", rows, columns);
  lather::nn::gelu_forward<Space, double>(Space(), matrix(x, rows, columns), y);
  return host(y);
}

TEST(Gelu, ForwardIsTheTanhApproximation) {
  const int rows = 4, columns = 50;
  Host x(rows * columns);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -8.0 + 16.0 * double(i) / double(x.size() - 1);
  const Host y = gelu(x, rows, columns);
  const double pi = std::acos(-1.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double approximation = 0.5 * v * (1 + std::tanh(std::sqrt(2 / pi) * (v + 0.044715 * v * v * v)));
    const double exact = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    // The same formula: equal up to the last bits of tanh (a device's tanh may differ by an ulp).
    EXPECT_NEAR(y[i], approximation, 4e-16 * std::max(1.0, std::fabs(approximation))) << "x = " << v;
    // The approximation stays within ~5e-4 of the erf-based GELU (Hendrycks & Gimpel).
    EXPECT_NEAR(y[i], exact, 1e-3) << "x = " << v;
  }
}

TEST(Gelu, GradientMatchesFiniteDifferences) {
  const int rows = 6, columns = 9;
  Host x = random_values(rows * columns, 21, -4, 4);
  const Host w = random_values(rows * columns, 22);
  Matrix<double> dx("dx", rows, columns);
  lather::nn::gelu_backward<Space, double>(Space(), matrix(x, rows, columns), matrix(w, rows, columns), dx);
  const Host analytic = host(dx);
  EXPECT_LE(relative_error(analytic, finite_differences(x, [&] { return dot(w, gelu(x, rows, columns)); })),
            fd_tolerance);
  // dx may be dy.
  Matrix<double> in_place = matrix(w, rows, columns);
  lather::nn::gelu_backward<Space, double>(Space(), matrix(x, rows, columns), in_place, in_place);
  EXPECT_EQ(host(in_place), analytic);
  EXPECT_THROW((lather::nn::gelu_backward<Space, double>(Space(), matrix(x, rows, columns), in_place,
                                                         Matrix<double>("bad", rows, columns + 1))),
               lather::Error);
}

// ---- Causal attention -----------------------------------------------------------------------

struct Shape {
  int batch, heads, time, head_dim;
  int rows() const { return batch * time; }
  int columns() const { return heads * head_dim; }
  std::size_t size() const { return std::size_t(rows()) * columns(); }
};

/// The plain definition: per sequence b, head h and position t, softmax over s <= t of
/// q_t . k_s / sqrt(head_dim), then the weighted sum of v_s.
Host naive_attention(const Shape& s, const Host& q, const Host& k, const Host& v) {
  Host y(s.size(), 0.0);
  const auto at = [&](int b, int t, int h, int e) {
    return std::size_t(b * s.time + t) * s.columns() + h * s.head_dim + e;
  };
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int t = 0; t < s.time; ++t) {
        std::vector<double> score(t + 1);
        for (int u = 0; u <= t; ++u) {
          double sum = 0;
          for (int e = 0; e < s.head_dim; ++e) sum += q[at(b, t, h, e)] * k[at(b, u, h, e)];
          score[u] = sum / std::sqrt(double(s.head_dim));
        }
        const double top = *std::max_element(score.begin(), score.end());
        double total = 0;
        for (auto& value : score) total += (value = std::exp(value - top));
        for (int u = 0; u <= t; ++u)
          for (int e = 0; e < s.head_dim; ++e) y[at(b, t, h, e)] += score[u] / total * v[at(b, u, h, e)];
      }
  return y;
}

struct AttentionRun {
  Host y, dq, dk, dv;
};

template <class T>
AttentionRun attention(lather::nn::CausalAttention<Space, T>& layer, const Shape& s, const Host& q, const Host& k,
                       const Host& v, const Host* dy) {
  const auto qd = matrix<T>(q, s.rows(), s.columns()), kd = matrix<T>(k, s.rows(), s.columns()),
             vd = matrix<T>(v, s.rows(), s.columns());
  Matrix<T> y("y", s.rows(), s.columns());
  layer.forward(Space(), s.batch, s.time, qd, kd, vd, y);
  AttentionRun run;
  run.y = host(y);
  if (dy) {
    Matrix<T> dq("dq", s.rows(), s.columns()), dk("dk", s.rows(), s.columns()), dv("dv", s.rows(), s.columns());
    layer.backward(Space(), s.batch, s.time, qd, kd, vd, matrix<T>(*dy, s.rows(), s.columns()), dq, dk, dv);
    run.dq = host(dq);
    run.dk = host(dk);
    run.dv = host(dv);
  }
  return run;
}

TEST(CausalAttention, ForwardMatchesNaiveLoops) {
  const Shape s{3, 2, 7, 5};
  const Host q = random_values(s.size(), 31, -2, 2), k = random_values(s.size(), 32, -2, 2),
             v = random_values(s.size(), 33);
  lather::nn::CausalAttention<Space, double> layer(s.heads, s.head_dim);
  // Sums of <= 7 products in another order: agreement to a few ulps of O(1) values.
  EXPECT_LE(relative_error(attention(layer, s, q, k, v, nullptr).y, naive_attention(s, q, k, v)), 1e-13);
  EXPECT_GT(layer.scratch_bytes(), 0u);
}

TEST(CausalAttention, FutureKeysAndValuesDoNotReachEarlierPositions) {
  const Shape s{2, 3, 6, 4};
  const Host q = random_values(s.size(), 41), k = random_values(s.size(), 42), v = random_values(s.size(), 43);
  lather::nn::CausalAttention<Space, double> layer(s.heads, s.head_dim);
  const Host y = attention(layer, s, q, k, v, nullptr).y;
  for (int changed = 1; changed < s.time; ++changed) {
    Host k2 = k, v2 = v;
    for (int c = 0; c < s.columns(); ++c) {
      k2[std::size_t(changed) * s.columns() + c] += 10;  // sequence 0, position `changed`
      v2[std::size_t(changed) * s.columns() + c] -= 5;
    }
    const Host y2 = attention(layer, s, q, k2, v2, nullptr).y;
    // Masked probabilities are exactly 0, so earlier rows are bit-identical, as is sequence 1.
    for (int row = 0; row < s.rows(); ++row)
      for (int c = 0; c < s.columns(); ++c) {
        const std::size_t i = std::size_t(row) * s.columns() + c;
        if (row < changed || row >= s.time) {
          EXPECT_EQ(y2[i], y[i]) << "row " << row << " changed by position " << changed;
        }
      }
    EXPECT_NE(y2[std::size_t(changed) * s.columns()], y[std::size_t(changed) * s.columns()]);
  }
}

TEST(CausalAttention, GradientsMatchFiniteDifferences) {
  const Shape s{2, 3, 5, 4};
  Host q = random_values(s.size(), 51), k = random_values(s.size(), 52), v = random_values(s.size(), 53);
  const Host w = random_values(s.size(), 54);
  lather::nn::CausalAttention<Space, double> layer(s.heads, s.head_dim);
  const auto run = attention(layer, s, q, k, v, &w);
  const auto loss = [&] { return dot(w, attention(layer, s, q, k, v, nullptr).y); };
  EXPECT_LE(relative_error(run.dq, finite_differences(q, loss)), fd_tolerance);
  EXPECT_LE(relative_error(run.dk, finite_differences(k, loss)), fd_tolerance);
  EXPECT_LE(relative_error(run.dv, finite_differences(v, loss)), fd_tolerance);
  // A second backward of the same forward gives the same gradients (the probabilities are kept).
  attention(layer, s, q, k, v, nullptr);
  const auto again = attention(layer, s, q, k, v, &w);
  EXPECT_EQ(again.dq, run.dq);
  EXPECT_EQ(again.dv, run.dv);
}

TEST(CausalAttention, FloatMatchesDouble) {
  // Float rounding: eps = 6e-8 per operation over sums of <= 32 terms, and exp / softmax
  // normalisation of O(1) scores; the errors grow like sqrt(terms) eps ~ 1e-6 at most, so 1e-5
  // relative to the largest entry leaves a margin of 10 while catching any real difference.
  const Shape s{2, 2, 32, 16};
  const Host q = random_values(s.size(), 61), k = random_values(s.size(), 62), v = random_values(s.size(), 63),
             dy = random_values(s.size(), 64);
  lather::nn::CausalAttention<Space, double> in_double(s.heads, s.head_dim);
  lather::nn::CausalAttention<Space, float> in_float(s.heads, s.head_dim);
  const auto reference = attention(in_double, s, q, k, v, &dy);
  const auto single = attention(in_float, s, q, k, v, &dy);
  EXPECT_LE(relative_error(single.y, reference.y), 1e-5);
  EXPECT_LE(relative_error(single.dq, reference.dq), 1e-5);
  EXPECT_LE(relative_error(single.dk, reference.dk), 1e-5);
  EXPECT_LE(relative_error(single.dv, reference.dv), 1e-5);
}

TEST(CausalAttention, FarBelowTheRowMaximumVanishes) {
  // Key 0 points against every query: its score, -10 |q|^2 / sqrt(4) = -150, is ~150 below the
  // others, and e^-150 is far below what a float can hold. Positions t >= 1 must give it no
  // weight, position 0 all of it, in float as in double. The other scores are O(1), so the 1e-5
  // argument above applies.
  const Shape s{1, 2, 6, 4};
  Host q(s.size()), k = random_values(s.size(), 66), v = random_values(s.size(), 67);
  const Host direction = {3, -2, 4, 1};
  for (int t = 0; t < s.time; ++t)
    for (int c = 0; c < s.columns(); ++c) q[std::size_t(t) * s.columns() + c] = direction[c % s.head_dim];
  for (int c = 0; c < s.columns(); ++c) k[c] = -10 * direction[c % s.head_dim];
  lather::nn::CausalAttention<Space, double> in_double(s.heads, s.head_dim);
  lather::nn::CausalAttention<Space, float> in_float(s.heads, s.head_dim);
  const Host reference = attention(in_double, s, q, k, v, nullptr).y;
  const Host single = attention(in_float, s, q, k, v, nullptr).y;
  EXPECT_LE(relative_error(single, reference), 1e-5);
  for (int c = 0; c < s.columns(); ++c) EXPECT_EQ(single[c], float(v[c]));  // row 0 sees only key 0
}

TEST(CausalAttention, ShapesAndEmptyShards) {
  const Shape s{2, 2, 4, 3};
  lather::nn::CausalAttention<Space, double> layer(s.heads, s.head_dim);
  Matrix<double> m("m", s.rows(), s.columns()), wrong("wrong", s.rows(), s.columns() + 1);
  EXPECT_THROW((layer.forward(Space(), s.batch, s.time, m, m, wrong, m)), lather::Error);
  layer.forward(Space(), s.batch, s.time, m, m, m, m);
  // backward needs the last forward's batch and time.
  Matrix<double> other("other", s.rows(), s.columns());
  EXPECT_THROW((layer.backward(Space(), s.time, s.batch, m, m, m, m, other, other, other)), lather::Error);
  EXPECT_THROW((lather::nn::CausalAttention<Space, double>(2, 0)), lather::Error);
  // A shard without heads: [rows, 0] matrices, nothing to do.
  lather::nn::CausalAttention<Space, double> none(0, 8);
  Matrix<double> empty("empty", s.rows(), 0);
  none.forward(Space(), s.batch, s.time, empty, empty, empty, empty);
  none.backward(Space(), s.batch, s.time, empty, empty, empty, empty, empty, empty, empty);
  EXPECT_EQ(none.scratch_bytes(), 0u);
}

// ---- Embeddings -----------------------------------------------------------------------------

TEST(TokenEmbedding, ForwardAndGradientOfOneVocabularyShard) {
  // This shard holds ids [3, 7) of a vocabulary of 10; -1 and 100 are no ids at all.
  const int vocab_begin = 3, vocab_count = 4, features = 5;
  const std::vector<std::int32_t> ids = {3, 0, 6, 4, 9, 4, -1, 4, 100, 3, 5};
  const int count = int(ids.size());
  const auto tokens = tokens_view(ids);
  Host table = random_values(vocab_count * features, 71);
  const Host w = random_values(count * features, 72);
  const auto forward = [&] {
    Matrix<double> out("out", count, features);
    lather::nn::token_embedding_forward<Space, double>(Space(), tokens, matrix(table, vocab_count, features),
                                                       vocab_begin, out);
    return host(out);
  };
  const Host out = forward();
  for (int n = 0; n < count; ++n) {
    const int v = ids[n] - vocab_begin;
    for (int j = 0; j < features; ++j)
      EXPECT_EQ(out[n * features + j], v >= 0 && v < vocab_count ? table[v * features + j] : 0.0);
  }

  Matrix<double> dtable("dtable", vocab_count, features);
  Kokkos::deep_copy(dtable, 7.0);  // overwritten, rows of absent ids included
  lather::nn::token_embedding_backward<Space, double>(Space(), tokens, matrix(w, count, features), vocab_begin, dtable,
                                                      false);
  const Host analytic = host(dtable);
  EXPECT_LE(relative_error(analytic, finite_differences(table, [&] { return dot(w, forward()); })), fd_tolerance);
  // Id 5 (row 2) occurs once, 4 (row 1) three times; no row gets anything from the ids outside.
  for (int j = 0; j < features; ++j) {
    EXPECT_EQ(analytic[2 * features + j], w[10 * features + j]);
    EXPECT_EQ(analytic[1 * features + j], (w[3 * features + j] + w[5 * features + j]) + w[7 * features + j]);
  }
  // Row of an id absent from the batch: zero.
  const std::vector<std::int32_t> few = {3, 3, 8};
  Kokkos::deep_copy(dtable, 7.0);
  lather::nn::token_embedding_backward<Space, double>(Space(), tokens_view(few), matrix(w, 3, features), vocab_begin,
                                                      dtable, false);
  const Host sparse = host(dtable);
  for (int j = 0; j < features; ++j) {
    EXPECT_EQ(sparse[j], w[j] + w[features + j]);
    for (int v = 1; v < vocab_count; ++v) EXPECT_EQ(sparse[v * features + j], 0.0);
  }

  // accumulate adds.
  const Host initial = random_values(vocab_count * features, 73);
  Kokkos::deep_copy(dtable, matrix(initial, vocab_count, features));
  lather::nn::token_embedding_backward<Space, double>(Space(), tokens, matrix(w, count, features), vocab_begin, dtable,
                                                      true);
  const Host accumulated = host(dtable);
  for (std::size_t i = 0; i < accumulated.size(); ++i) EXPECT_NEAR(accumulated[i], initial[i] + analytic[i], 1e-14);
}

TEST(PositionEmbedding, ForwardAndGradient) {
  const int batch = 3, time = 4, max_time = 6, features = 5;
  Host table = random_values(max_time * features, 81);
  const Host w = random_values(batch * time * features, 82);
  const auto forward = [&] {
    Matrix<double> out("out", batch * time, features);
    lather::nn::position_embedding_forward<Space, double>(Space(), batch, time, matrix(table, max_time, features), out);
    return host(out);
  };
  const Host out = forward();
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < time; ++t)
      for (int j = 0; j < features; ++j) EXPECT_EQ(out[(b * time + t) * features + j], table[t * features + j]);

  Matrix<double> dtable("dtable", max_time, features);
  Kokkos::deep_copy(dtable, 7.0);
  lather::nn::position_embedding_backward<Space, double>(Space(), batch, time, matrix(w, batch * time, features),
                                                         dtable, false);
  const Host analytic = host(dtable);
  EXPECT_LE(relative_error(analytic, finite_differences(table, [&] { return dot(w, forward()); })), fd_tolerance);
  for (int t = time; t < max_time; ++t)
    for (int j = 0; j < features; ++j) EXPECT_EQ(analytic[t * features + j], 0.0);

  const Host initial = random_values(max_time * features, 83);
  Kokkos::deep_copy(dtable, matrix(initial, max_time, features));
  lather::nn::position_embedding_backward<Space, double>(Space(), batch, time, matrix(w, batch * time, features),
                                                         dtable, true);
  const Host accumulated = host(dtable);
  for (std::size_t i = 0; i < accumulated.size(); ++i) EXPECT_NEAR(accumulated[i], initial[i] + analytic[i], 1e-14);
  for (int t = time; t < max_time; ++t)
    for (int j = 0; j < features; ++j) EXPECT_EQ(accumulated[t * features + j], initial[t * features + j]);

  EXPECT_THROW(
      (lather::nn::position_embedding_forward<Space, double>(
          Space(), 1, max_time + 1, matrix(table, max_time, features), Matrix<double>("o", max_time + 1, features))),
      lather::Error);
}

}  // namespace
