// Adasum against plain references computed on every rank from every rank's inputs:
//  * exact Adasum against the pairwise tree: fold x(j) with x(j + P) for j < n - P (P the largest
//    power of two <= n), then combine pairs (2i, 2i + 1) level by level, per tensor;
//  * approximate Adasum against its closed form.
// One call reduces a whole list of tensors, so the special cases (orthogonal, parallel, zero,
// tiny and huge magnitudes) are tensors of one list: per-tensor semantics inside fused buffers is
// what the test checks, with few collectives.
#include <lather/comm/reduce.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

namespace {

using lather::comm::GradientReducer;
using lather::comm::ReduceOptions;
using namespace lather::test;
using Vec = std::vector<double>;

/// Adasum(a, b) in double, rounded to T as the tensor stores it (Horovod's zero-norm rule).
template <class T>
Vec adasum_pair(const Vec& a, const Vec& b) {
  double dot = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double threshold = std::sqrt(DBL_MIN);
  const double ca = aa >= threshold ? 1.0 - dot / aa * 0.5 : 1.0;
  const double cb = bb >= threshold ? 1.0 - dot / bb * 0.5 : 1.0;
  Vec out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = double(T(ca * a[i] + cb * b[i]));
  return out;
}

/// The tree reference: fold, then pairs (2i, 2i + 1) per level.
template <class T>
Vec adasum_tree(std::vector<Vec> x) {
  const int n = int(x.size());
  int p = 1;
  while (2 * p <= n) p *= 2;
  for (int j = 0; j + p < n; ++j) x[j] = adasum_pair<T>(x[j], x[j + p]);
  x.resize(p);
  while (x.size() > 1) {
    std::vector<Vec> next;
    for (std::size_t i = 0; i + 1 < x.size(); i += 2) next.push_back(adasum_pair<T>(x[i], x[i + 1]));
    x = next;
  }
  return x[0];
}

/// Approximate Adasum: sum_r g_r (1 - (g_r.s - |g_r|^2) / (n |g_r|^2)), s = sum_r g_r; a zero g_r
/// keeps coefficient 1 (and contributes nothing).
Vec adasum_approx_reference(const std::vector<Vec>& g) {
  const std::size_t n = g.size(), length = g[0].size();
  Vec s(length, 0.0), out(length, 0.0);
  for (const auto& v : g)
    for (std::size_t i = 0; i < length; ++i) s[i] += v[i];
  for (const auto& v : g) {
    double gs = 0, gg = 0;
    for (std::size_t i = 0; i < length; ++i) gs += v[i] * s[i], gg += v[i] * v[i];
    const double c = gg >= std::sqrt(DBL_MIN) ? 1.0 - (gs - gg) / (double(n) * gg) : 1.0;
    for (std::size_t i = 0; i < length; ++i) out[i] += c * v[i];
  }
  return out;
}

/// The special tensors of the list, as rank `r` of `n` holds them (before rounding to T).
struct Case {
  std::string name;
  std::int64_t size;
  std::function<double(int r, int n, std::int64_t i)> value;
};

std::vector<Case> cases() {
  auto sign = [](double x) { return x < 0 ? -1.0 : 1.0; };
  return {
      // Disjoint supports: every dot product is 0, so Adasum is the plain sum.
      {"orthogonal", 16,
       [](int r, int, std::int64_t i) { return i == 2 * r ? 1.5 * (r + 1) : (i == 2 * r + 1 ? -double(r + 1) : 0.0); }},
      // Equal vectors: every coefficient is 1/2, so the result is the vector (= the mean).
      {"equal", 33, [](int, int, std::int64_t i) { return input_value(0, 1, i); }},
      // Parallel, different lengths: coefficients 1 - |a|/(2|b|)-type, checked by the tree.
      {"parallel", 20, [](int r, int, std::int64_t i) { return (r + 1) * input_value(0, 2, i); }},
      // Zero on even ranks: a zero side has coefficient 1 and adds nothing.
      {"zero_on_even_ranks", 40, [](int r, int, std::int64_t i) { return r % 2 ? input_value(r, 3, i) : 0.0; }},
      {"all_zero", 9, [](int, int, std::int64_t) { return 0.0; }},
      // Magnitudes whose squares underflow float (FLT_MIN = 1.2e-38) ...
      {"tiny", 300,
       [sign](int r, int, std::int64_t i) {
         const double x = input_value(r, 5, i);
         return sign(x) * 1.5e-38 * (1.0 + std::fabs(x));
       }},
      // ... and whose squares overflow it (sqrt(FLT_MAX) = 1.8e19): dots and norms are doubles.
      {"huge", 300, [](int r, int, std::int64_t i) { return 1.0e19 * input_value(r, 6, i); }},
      {"random_1", 1, [](int r, int, std::int64_t i) { return input_value(r, 7, i); }},
      {"random_1500", 1500, [](int r, int, std::int64_t i) { return input_value(r, 8, i); }},
      {"random_3", 3, [](int r, int, std::int64_t i) { return input_value(r, 9, i); }},
      {"random_5000", 5000, [](int r, int, std::int64_t i) { return input_value(r, 10, i); }},
  };
}

template <class T>
lather::TensorList<T, Memory> make_case_tensors(int rank, int n) {
  lather::TensorList<T, Memory> tensors;
  for (const auto& c : cases()) {
    Vec values(c.size);
    for (std::int64_t i = 0; i < c.size; ++i) values[i] = c.value(rank, n, i);
    tensors.push_back(make_view<T>(values, c.name));
  }
  return tensors;
}

template <class T>
std::vector<Vec> case_inputs(const Case& c, int n) {
  std::vector<Vec> x(n, Vec(c.size));
  for (int r = 0; r < n; ++r)
    for (std::int64_t i = 0; i < c.size; ++i) x[r][i] = double(T(c.value(r, n, i)));
  return x;
}

/// Rounding to T at each of the log2(n) + 1 levels, with coefficients that differ by rounding of
/// the partial sums: a few eps per level, relative to the largest magnitude of the tensor.
template <class T>
double relative_tolerance(int n) {
  return 8.0 * (std::log2(double(n)) + 2) * std::numeric_limits<T>::epsilon();
}

template <class T>
void expect_matches(const lather::TensorList<T, Memory>& tensors, int n, bool approximate) {
  const auto all = cases();
  for (std::size_t t = 0; t < all.size(); ++t) {
    const auto inputs = case_inputs<T>(all[t], n);
    const Vec expected = approximate ? adasum_approx_reference(inputs) : adasum_tree<T>(inputs);
    const Vec got = read_view(tensors[t]);
    double scale = 0;
    for (double v : expected) scale = std::max(scale, std::fabs(v));
    const double tolerance = relative_tolerance<T>(n) * (approximate ? double(n) : 1.0) * scale;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << all[t].name << " " << i;
      ASSERT_NEAR(got[i], expected[i], tolerance) << all[t].name << " index " << i;
    }
    if (!approximate && all[t].name == "orthogonal") {
      for (std::size_t i = 0; i < expected.size(); ++i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += inputs[r][i];
        EXPECT_EQ(got[i], sum) << "orthogonal inputs: Adasum is the sum";
      }
    }
    if (!approximate && all[t].name == "equal")
      for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(got[i], inputs[0][i]) << "equal inputs";
  }
}

template <class T>
class Adasum : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Adasum, Scalars);

TYPED_TEST(Adasum, EqualsThePairwiseTreePerTensorInsideFusedBuffers) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  ReduceOptions options;
  options.fusion_bytes = 4096;  // many small tensors per bucket, the large ones alone
  // Small buckets take the gather-and-tree shortcut, the large single tensors the VHDD scheme.
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
  auto tensors = make_case_tensors<T>(rank, n);
  reducer.adasum(Exec(), tensors);
  expect_matches<T>(tensors, n, false);
  // Every tensor in one bucket, always by vector halving, distance doubling.
  ReduceOptions vhdd;
  vhdd.adasum_gather_bytes = 0;
  GradientReducer<Exec, T> one_bucket(MPI_COMM_WORLD, vhdd);
  tensors = make_case_tensors<T>(rank, n);
  one_bucket.adasum(Exec(), tensors);
  expect_matches<T>(tensors, n, false);
}

TYPED_TEST(Adasum, ApproximateEqualsItsClosedForm) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  ReduceOptions options;
  options.fusion_bytes = 4096;
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
  auto tensors = make_case_tensors<T>(rank, n);
  reducer.adasum_approx(Exec(), tensors);
  expect_matches<T>(tensors, n, true);
}

TEST(Adasum, TheExactVectorsOfTheSpecification) {
  const int n = world_size(), rank = world_rank();
  struct Example {
    std::vector<Vec> inputs;
    Vec expected;
  };
  std::vector<Example> examples;
  if (n == 2) examples = {{{{1, 0}, {0, 1}}, {1, 1}}, {{{1, 2}, {2, 4}}, {1.5, 3}}, {{{1, 0}, {1, 1}}, {1.25, 0.75}}};
  if (n == 4) examples = {{{{1, 0}, {1, 1}, {0, 1}, {0, 2}}, {0.9191176, 1.6764706}}};
  if (examples.empty()) GTEST_SKIP() << "the examples are for 2 and 4 ranks";
  // All examples in one call, one tensor each; by the gather shortcut and by VHDD.
  for (std::size_t gather_bytes : {std::size_t(1) << 16, std::size_t(0)}) {
    lather::TensorList<double, Memory> tensors;
    for (const auto& e : examples) tensors.push_back(make_view<double>(e.inputs[rank]));
    ReduceOptions options;
    options.adasum_gather_bytes = gather_bytes;
    GradientReducer<Exec, double>(MPI_COMM_WORLD, options).adasum(Exec(), tensors);
    for (std::size_t k = 0; k < examples.size(); ++k) {
      const auto got = read_view(tensors[k]);
      for (std::size_t i = 0; i < 2; ++i)
        EXPECT_NEAR(got[i], examples[k].expected[i], 5e-8) << k << " " << i << " gather " << gather_bytes;
    }
  }
}

TEST(Adasum, SixteenBitWireIsRefusedOnEveryRank) {
  ReduceOptions options;
  options.wire_precision = lather::comm::WirePrecision::bfloat16;
  GradientReducer<Exec, float> reducer(MPI_COMM_WORLD, options);
  const auto tensors = make_inputs<float>(world_rank(), {3});
  expect_error([&] { reducer.adasum(Exec(), tensors); }, "exact Adasum sends the native type");
}

}  // namespace
