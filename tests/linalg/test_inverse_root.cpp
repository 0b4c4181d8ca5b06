// Inverse p-th roots against references built independently of the code under test: matrices with
// a known eigendecomposition (tests/common/spd_matrices.hpp), diagonal matrices in closed form, and
// residuals H^p (A + ridge I) - I computed with plain loops.
#include <lather/linalg/inverse_root.hpp>

#include "common/spd_matrices.hpp"
#include "linalg/batched_gemm.hpp"

#include <lather/core/host_threads.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using lather::linalg::InverseRootOptions;
using lather::linalg::InverseRootResult;
using lather::linalg::Precision;
using lather::linalg::RootMethod;
using lather::linalg::RootStatus;
using lather::linalg::RootTask;
using lather::test::KnownSpectrum;
using lather::test::make_spectrum;
using lather::test::relative_frobenius_error;
using Exec = Kokkos::DefaultExecutionSpace;

template <class T>
using Stack = Kokkos::View<T***, Kokkos::LayoutRight, Exec::memory_space>;

/// A stack [count, padded, padded] on the device, filled from row-major n x n host matrices placed
/// in the leading block; padding filled with `fill`.
template <class T>
Stack<T> make_stack(const std::vector<std::vector<double>>& matrices, const std::vector<int>& sizes, int padded,
                    double fill = 0.0) {
  Stack<T> stack("stack", matrices.size(), padded, padded);
  auto host = Kokkos::create_mirror_view(stack);
  for (std::size_t b = 0; b < matrices.size(); ++b)
    for (int i = 0; i < padded; ++i)
      for (int j = 0; j < padded; ++j) {
        const int n = sizes[b];
        host(b, i, j) = (i < n && j < n) ? T(matrices[b][std::size_t(i) * n + j]) : T(fill);
      }
  Kokkos::deep_copy(stack, host);
  return stack;
}

template <class T>
std::vector<double> leading_block(const Stack<T>& stack, int b, int n) {
  auto host = Kokkos::create_mirror_view(stack);
  Kokkos::deep_copy(host, stack);
  std::vector<double> out(std::size_t(n) * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) out[std::size_t(i) * n + j] = double(host(b, i, j));
  return out;
}

/// max |H^p (A + ridge I) - I| with plain loops in double.
double residual(const std::vector<double>& h, const std::vector<double>& a, double ridge, int n, int p) {
  std::vector<double> power(std::size_t(n) * n, 0.0), tmp(power.size());
  for (int i = 0; i < n; ++i) power[std::size_t(i) * n + i] = 1.0;
  for (int step = 0; step < p; ++step) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double sum = 0;
        for (int k = 0; k < n; ++k) sum += power[std::size_t(i) * n + k] * h[std::size_t(k) * n + j];
        tmp[std::size_t(i) * n + j] = sum;
      }
    power.swap(tmp);
  }
  double worst = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int k = 0; k < n; ++k)
        sum += power[std::size_t(i) * n + k] * (a[std::size_t(k) * n + j] + (k == j ? ridge : 0.0));
      worst = std::max(worst, std::fabs(sum - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

InverseRootOptions precise(RootMethod method) {
  InverseRootOptions options;
  options.method = method;
  options.compute_precision = Precision::float64;
  options.tolerance = 1e-10;
  return options;
}

struct Case {
  int n;
  int p;
};

class RootAccuracy : public ::testing::TestWithParam<std::tuple<RootMethod, Case>> {};

// The acceptance bound: relative Frobenius error <= 1e-6 against the eigendecomposition of the
// same ridged matrix, for condition numbers up to 1e6. With double compute the rounding floor is
// about cond * n * 1e-16 ~ 1e-8 at n = 512, leaving two orders of margin; a Newton tolerance of
// 1e-10 on max|M - I| bounds the truncation error of H by about tolerance / p.
TEST_P(RootAccuracy, MatchesEigendecompositionReference) {
  const auto [method, c] = GetParam();
  const KnownSpectrum spectrum = make_spectrum(c.n, 3.0, 1e6, 100 + c.n + c.p);
  const auto a = spectrum.matrix();
  auto stack = make_stack<double>({a}, {c.n}, c.n);
  Stack<double> roots("roots", 1, c.n, c.n);
  const auto options = precise(method);
  const InverseRootResult result = lather::linalg::inverse_pth_root(Exec(), stack, roots, c.p, options);
  ASSERT_EQ(result.size(), 1u);
  EXPECT_EQ(result.status[0], RootStatus::converged) << to_string(result.status[0]);

  // The ridge is the engine's: its lambda_max comes from the decomposition (exact) or from power
  // iteration, a Rayleigh quotient (never above lambda_max) that the reference's absolute stopping
  // rule (|change| <= 1e-6) ends early on clustered spectra; it only sets the ridge's scale.
  const double top = spectrum.lambda_max();
  EXPECT_LE(result.lambda_max[0], top * (1 + 1e-12));
  EXPECT_GE(result.lambda_max[0], top * (method != RootMethod::newton ? 1 - 1e-12 : 1 - 1e-3));
  EXPECT_DOUBLE_EQ(result.ridge[0], 1e-6 * std::max(result.lambda_max[0], 1e-6));
  const double ridge = result.ridge[0];
  // Capture by name, not [&]: capturing the structured binding c is C++20 (clang < 16 rejects it).
  const auto want = spectrum.function([ridge, p = c.p](double x) { return std::pow(x + ridge, -1.0 / p); });
  const auto got = leading_block(roots, 0, c.n);
  EXPECT_LE(relative_frobenius_error(got, want), 1e-6) << "n=" << c.n << " p=" << c.p;
  if (method == RootMethod::newton) {
    // Newton's error is the reference's max|M - I| of the coupled iterate M, which tracks
    // H^p (A + ridge I) only up to rounding amplified by cond(A)^(~1): it must meet the tolerance.
    if (c.n > 1) EXPECT_LE(result.error[0], 1e-10);
  } else if (c.n <= 128) {
    // eigh reports the explicit residual of the returned matrix.
    const double r = residual(got, a, ridge, c.n, c.p);
    EXPECT_NEAR(result.error[0], r, 1e-9 + 1e-3 * r);
  }
}

std::vector<Case> accuracy_cases() {
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 8, 17, 64, 100})
    for (int p : {1, 2, 4, 6, 8}) cases.push_back({n, p});
  cases.push_back({256, 2});
  cases.push_back({256, 8});
  cases.push_back({512, 4});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Newton, RootAccuracy,
                         ::testing::Combine(::testing::Values(RootMethod::newton),
                                            ::testing::ValuesIn(accuracy_cases())));
INSTANTIATE_TEST_SUITE_P(Eigh, RootAccuracy,
                         ::testing::Combine(::testing::Values(RootMethod::eigh, RootMethod::eigh_host),
                                            ::testing::ValuesIn(accuracy_cases())));

// Float storage with double compute (the default) loses only the final rounding to float:
// relative error ~ 1e-7 * cond(H) ~ 1e-7 * sqrt(1e4) for p = 2.
TEST(InverseRoot, FloatStorageDoubleCompute) {
  const int n = 48;
  const auto spectrum = make_spectrum(n, 2.0, 1e4, 7);
  auto stack = make_stack<float>({spectrum.matrix()}, {n}, n);
  Stack<float> roots("roots", 1, n, n);
  const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, precise(RootMethod::newton));
  const double ridge = result.ridge[0];
  const auto want = spectrum.function([&](double x) { return std::pow(x + ridge, -0.5); });
  EXPECT_LE(relative_frobenius_error(leading_block(roots, 0, n), want), 1e-5);
}

// Float compute: the iteration stalls near n * 6e-8 in max|M - I|; with the reference's default
// tolerance 1e-6 and cond 1e2 the root is good to ~1e-5 relative.
TEST(InverseRoot, FloatCompute) {
  for (auto method : {RootMethod::newton, RootMethod::eigh, RootMethod::eigh_host}) {
    const int n = 32;
    const auto spectrum = make_spectrum(n, 1.0, 1e2, 11);
    auto stack = make_stack<float>({spectrum.matrix()}, {n}, n);
    Stack<float> roots("roots", 1, n, n);
    InverseRootOptions options;
    options.method = method;
    options.compute_precision = Precision::float32;
    const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 4, options);
    EXPECT_NE(result.status[0], RootStatus::non_finite);
    EXPECT_LT(result.error[0], 1e-4);
    const double ridge = result.ridge[0];
    const auto want = spectrum.function([&](double x) { return std::pow(x + ridge, -0.25); });
    EXPECT_LE(relative_frobenius_error(leading_block(roots, 0, n), want), 5e-5) << to_string(method);
  }
}

// Diagonal matrices have closed-form roots; zero and rank-deficient matrices must stay finite.
TEST(InverseRoot, DiagonalZeroAndRankDeficient) {
  const int n = 6;
  std::vector<double> diagonal(n * n, 0.0), zero(n * n, 0.0), rank_one(n * n, 0.0);
  for (int i = 0; i < n; ++i) diagonal[i * n + i] = 0.5 + i;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) rank_one[i * n + j] = (i + 1.0) * (j + 1.0);
  for (auto method : {RootMethod::newton, RootMethod::eigh, RootMethod::eigh_host}) {
    auto stack = make_stack<double>({diagonal, zero, rank_one}, {n, n, n}, n);
    Stack<double> roots("roots", 3, n, n);
    const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 4, precise(method));
    const auto got = leading_block(roots, 0, n);
    const double ridge = result.ridge[0];
    EXPECT_NEAR(ridge, 1e-6 * (0.5 + n - 1), 1e-6 * 1e-5);  // power iteration, see above
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const double want = i == j ? std::pow(0.5 + i + ridge, -0.25) : 0.0;
        EXPECT_NEAR(got[i * n + j], want, 1e-9) << to_string(method) << " " << i << "," << j;
      }
    for (int b : {1, 2}) {
      EXPECT_NE(result.status[b], RootStatus::non_finite) << to_string(method) << " matrix " << b;
      for (double x : leading_block(roots, b, n)) EXPECT_TRUE(std::isfinite(x));
    }
    // The zero matrix: ridge = 1e-6 * 1e-6, root = ridge^(-1/4) I.
    const auto zero_root = leading_block(roots, 1, n);
    EXPECT_NEAR(zero_root[0], std::pow(1e-12, -0.25), 1e-6 * std::pow(1e-12, -0.25));
  }
}

// A NaN or Inf anywhere marks only that matrix failed and leaves the others bit-for-bit as they
// would be without it.
TEST(InverseRoot, NonFiniteInputIsIsolated) {
  const int n = 10;
  const auto good1 = make_spectrum(n, 1.0, 1e3, 1).matrix();
  const auto good2 = make_spectrum(n, 5.0, 1e2, 2).matrix();
  auto with_nan = good1, with_inf = good2;
  with_nan[13] = std::numeric_limits<double>::quiet_NaN();
  with_inf[0] = std::numeric_limits<double>::infinity();
  for (auto method : {RootMethod::newton, RootMethod::eigh, RootMethod::eigh_host}) {
    auto stack = make_stack<double>({good1, with_nan, good2, with_inf}, {n, n, n, n}, n);
    Stack<double> roots("roots", 4, n, n);
    Kokkos::deep_copy(roots, 42.0);  // sentinel: failed outputs must stay untouched
    const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, precise(method));
    EXPECT_EQ(result.status[1], RootStatus::non_finite);
    EXPECT_EQ(result.status[3], RootStatus::non_finite);
    EXPECT_FALSE(result.accepted(1, 0.1));
    EXPECT_TRUE(std::isinf(result.error[1]));
    for (double x : leading_block(roots, 1, n)) EXPECT_EQ(x, 42.0);
    for (double x : leading_block(roots, 3, n)) EXPECT_EQ(x, 42.0);

    auto clean = make_stack<double>({good1, good2}, {n, n}, n);
    Stack<double> clean_roots("clean_roots", 2, n, n);
    const auto clean_result = lather::linalg::inverse_pth_root(Exec(), clean, clean_roots, 2, precise(method));
    EXPECT_EQ(leading_block(roots, 0, n), leading_block(clean_roots, 0, n));
    EXPECT_EQ(leading_block(roots, 2, n), leading_block(clean_roots, 1, n));
    EXPECT_EQ(result.error[0], clean_result.error[0]);
    EXPECT_EQ(result.error[2], clean_result.error[1]);
    EXPECT_TRUE(result.accepted(0, 0.1));
  }
}

// Padding: the same matrices inside a larger stack, with junk in the padding, give bit-identical
// roots, and the padding of each root is the identity.
TEST(InverseRoot, PaddingDoesNotChangeResults) {
  const std::vector<int> sizes = {5, 12, 1, 33};
  std::vector<std::vector<double>> mats;
  for (std::size_t b = 0; b < sizes.size(); ++b) mats.push_back(make_spectrum(sizes[b], 1.0 + b, 1e4, 30 + b).matrix());
  for (auto method : {RootMethod::newton, RootMethod::eigh, RootMethod::eigh_host}) {
    const int padded = 40;
    auto stack = make_stack<double>(mats, sizes, padded, 7.0);
    Stack<double> roots("roots", sizes.size(), padded, padded);
    std::vector<RootTask> tasks;
    for (std::size_t b = 0; b < sizes.size(); ++b) tasks.push_back({int(b), sizes[b], 2 + 2 * int(b % 2)});
    const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, tasks, precise(method));
    auto host = Kokkos::create_mirror_view(roots);
    Kokkos::deep_copy(host, roots);
    for (std::size_t b = 0; b < sizes.size(); ++b) {
      const int n = sizes[b];
      auto alone = make_stack<double>({mats[b]}, {n}, n);
      Stack<double> alone_root("alone_root", 1, n, n);
      const auto alone_result = lather::linalg::inverse_pth_root(
          Exec(), alone, alone_root, std::vector<RootTask>{{0, n, tasks[b].exponent}}, precise(method));
      EXPECT_EQ(leading_block(roots, int(b), n), leading_block(alone_root, 0, n)) << "matrix " << b;
      EXPECT_EQ(result.error[b], alone_result.error[0]);
      for (int i = 0; i < padded; ++i)
        for (int j = 0; j < padded; ++j)
          if (i >= n || j >= n) ASSERT_EQ(host(b, i, j), i == j ? 1.0 : 0.0);
    }
  }
}

// Grouping, chunking and the small-GEMM kernel are implementation choices: a mixed batch solved
// with one matrix of workspace at a time, or with BLAS for every size, gives the same roots.
TEST(InverseRoot, ChunkingAndGemmPathsAgree) {
  const std::vector<int> sizes = {4, 9, 9, 20, 4, 20, 9};
  std::vector<std::vector<double>> mats;
  std::vector<RootTask> tasks;
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    mats.push_back(make_spectrum(sizes[b], 2.0, 1e3, 50 + b).matrix());
    tasks.push_back({int(b), sizes[b], b % 3 == 0 ? 2 : 4});
  }
  auto stack = make_stack<double>(mats, sizes, 20);
  Stack<double> wide("wide", sizes.size(), 20, 20), narrow("narrow", sizes.size(), 20, 20),
      blas("blas", sizes.size(), 20, 20);
  auto options = precise(RootMethod::newton);
  options.batched_gemm_max_size = 64;  // every GEMM in the batched small-GEMM kernel
  const auto r1 = lather::linalg::inverse_pth_root(Exec(), stack, wide, tasks, options);
  options.workspace_bytes = 1;  // one matrix at a time
  const auto r2 = lather::linalg::inverse_pth_root(Exec(), stack, narrow, tasks, options);
  options.batched_gemm_max_size = 0;  // every GEMM through KokkosBlas::gemm
  const auto r3 = lather::linalg::inverse_pth_root(Exec(), stack, blas, tasks, options);
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    EXPECT_EQ(leading_block(wide, int(b), 20), leading_block(narrow, int(b), 20));
    EXPECT_EQ(r1.iterations[b], r2.iterations[b]);
    EXPECT_LE(relative_frobenius_error(leading_block(blas, int(b), 20), leading_block(wide, int(b), 20)), 1e-12);
  }
  EXPECT_GT(r1.gemm_calls, 0);
  EXPECT_DOUBLE_EQ(r1.gemm_flops, r3.gemm_flops);
}

/// Nine matrices of sizes 1 to 33 (condition 1e4) padded to 33, the fourth with a NaN, named by
/// tasks out of order with exponents 2 and 4.
struct MixedBatch {
  std::vector<int> sizes = {1, 5, 12, 33, 12, 5, 1, 33, 20};
  int padded = 33;
  std::vector<std::vector<double>> mats;
  std::vector<RootTask> tasks;
  MixedBatch() {
    for (std::size_t b = 0; b < sizes.size(); ++b) mats.push_back(make_spectrum(sizes[b], 1.0, 1e4, 70 + b).matrix());
    mats[3][7] = std::numeric_limits<double>::quiet_NaN();
    for (int b : {4, 0, 8, 3, 1, 6, 2, 7, 5}) tasks.push_back({b, sizes[std::size_t(b)], 2 + 2 * (b % 2)});
  }
};

// eigh on several host threads: every root, error and status is the one a single thread gives
// (each matrix is taken whole by one thread), in either compute precision; a non-finite matrix in
// the batch leaves its output untouched; more threads than matrices is fine.
TEST(InverseRoot, EighHostThreadsGiveTheSameRoots) {
  const MixedBatch batch;
  const auto& sizes = batch.sizes;
  const auto& tasks = batch.tasks;
  const int padded = batch.padded;
  auto stack = make_stack<double>(batch.mats, sizes, padded);
  for (auto precision : {Precision::float64, Precision::float32}) {
    auto options = precise(RootMethod::eigh_host);
    options.compute_precision = precision;
    options.host_threads = 1;
    Stack<double> one("one", sizes.size(), padded, padded);
    Kokkos::deep_copy(one, 42.0);
    const auto single = lather::linalg::inverse_pth_root(Exec(), stack, one, tasks, options);
    EXPECT_EQ(single.status[3], RootStatus::non_finite);
    for (int threads : {2, 3, 16}) {
      options.host_threads = threads;
      Stack<double> many("many", sizes.size(), padded, padded);
      Kokkos::deep_copy(many, 42.0);
      const auto result = lather::linalg::inverse_pth_root(Exec(), stack, many, tasks, options);
      for (std::size_t t = 0; t < tasks.size(); ++t) {
        EXPECT_EQ(result.status[t], single.status[t]) << threads << " threads, task " << t;
        EXPECT_EQ(result.error[t], single.error[t]) << threads << " threads, task " << t;
        const double a = result.lambda_max[t], b = single.lambda_max[t];  // NaN for the NaN matrix
        EXPECT_TRUE(std::isnan(a) ? std::isnan(b) : a == b) << threads << " threads, task " << t;
      }
      for (std::size_t b = 0; b < sizes.size(); ++b)
        EXPECT_EQ(leading_block(many, int(b), padded), leading_block(one, int(b), padded))
            << threads << " threads, matrix " << b;
      for (double x : leading_block(many, 3, padded)) ASSERT_EQ(x, 42.0);
      EXPECT_EQ(result.gemm_calls, single.gemm_calls);
      EXPECT_DOUBLE_EQ(result.gemm_flops, single.gemm_flops);
    }
  }
}

/// The eigh roots by the execution space's own eigensolver: what RootMethod::eigh takes on a device
/// (cuSOLVER), and on a host backend LAPACK one matrix at a time through the same gather, scaling,
/// GEMM and scatter kernels.
template <class T>
InverseRootResult eigh_on_space(const Stack<T>& matrices, const Stack<T>& roots, const std::vector<RootTask>& tasks,
                                const InverseRootOptions& options) {
  return lather::linalg::Impl::InverseRootSolver<Exec, T>::solve_eigh_on_space(Exec(), matrices, roots, tasks, options);
}

// Against the closed form of matrices with a known eigendecomposition, to the bound and with the
// residual of RootAccuracy.MatchesEigendecompositionReference (the same argument: a backward-stable
// eigendecomposition in double leaves about cond * n * 1e-16 <= 1e-8 at cond 1e6, n <= 256).
TEST(EighOnSpace, MatchesTheKnownSpectrum) {
  for (int n : {1, 2, 3, 17, 64, 100, 256})
    for (int p : {1, 2, 4, 8}) {
      const KnownSpectrum spectrum = make_spectrum(n, 3.0, 1e6, 100 + n + p);
      const auto a = spectrum.matrix();
      auto stack = make_stack<double>({a}, {n}, n);
      Stack<double> roots("roots", 1, n, n);
      const auto result = eigh_on_space(stack, roots, {{0, n, p}}, precise(RootMethod::eigh));
      ASSERT_EQ(result.status[0], RootStatus::converged) << "n=" << n << " p=" << p;
      const double top = spectrum.lambda_max();
      EXPECT_NEAR(result.lambda_max[0], top, 1e-12 * top);
      EXPECT_DOUBLE_EQ(result.ridge[0], 1e-6 * std::max(result.lambda_max[0], 1e-6));
      const double ridge = result.ridge[0];
      const auto want = spectrum.function([ridge, p](double x) { return std::pow(x + ridge, -1.0 / p); });
      const auto got = leading_block(roots, 0, n);
      EXPECT_LE(relative_frobenius_error(got, want), 1e-6) << "n=" << n << " p=" << p;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < i; ++j) ASSERT_EQ(got[std::size_t(i) * n + j], got[std::size_t(j) * n + i]);
      if (n <= 100) {
        const double r = residual(got, a, ridge, n, p);
        EXPECT_NEAR(result.error[0], r, 1e-9 + 1e-3 * r) << "n=" << n << " p=" << p;
      }
    }
}

// The device's path equals the host threads' path (eigh_host) to rounding, for a padded batch of
// mixed sizes and exponents taken in chunks of one matrix or all at once, in either compute
// precision; a matrix with a NaN is non_finite on both and its output is left untouched, and the
// padding of every root is the identity. Tolerances: two backward-stable eigendecompositions of
// matrices of condition <= 1e4 give roots (p >= 2, condition <= 1e2) that differ by about
// cond(H) * n * eps: 1e2 * 33 * 1.1e-16 ~ 4e-13 in double, 1e2 * 33 * 6e-8 ~ 2e-4 in float, with
// float's rounding of the stored result on top; the bounds are 1e-10 and 1e-3.
TEST(EighOnSpace, EqualsTheHostThreadsPath) {
  const MixedBatch batch;
  const auto& sizes = batch.sizes;
  const auto& tasks = batch.tasks;
  const int padded = batch.padded;
  auto stack = make_stack<double>(batch.mats, sizes, padded, 7.0);
  for (auto precision : {Precision::float64, Precision::float32}) {
    const double bound = precision == Precision::float64 ? 1e-10 : 1e-3;
    auto options = precise(RootMethod::eigh_host);
    options.compute_precision = precision;
    Stack<double> host_roots("host_roots", sizes.size(), padded, padded);
    Kokkos::deep_copy(host_roots, 42.0);
    const auto host = lather::linalg::inverse_pth_root(Exec(), stack, host_roots, tasks, options);
    for (std::size_t workspace : {std::size_t(1), std::size_t(256) << 20}) {
      options.workspace_bytes = workspace;
      Stack<double> roots("roots", sizes.size(), padded, padded);
      Kokkos::deep_copy(roots, 42.0);
      const auto result = eigh_on_space(stack, roots, tasks, options);
      const std::string at = std::string(precision == Precision::float64 ? "float64" : "float32") +
                             (workspace == 1 ? ", one matrix a chunk" : ", one chunk");
      for (std::size_t t = 0; t < tasks.size(); ++t) {
        ASSERT_EQ(result.status[t], host.status[t]) << at << ", task " << t;
        if (host.status[t] == RootStatus::non_finite) {
          EXPECT_TRUE(std::isinf(result.error[t]));
          EXPECT_TRUE(std::isnan(result.lambda_max[t]));
          continue;
        }
        EXPECT_NEAR(result.lambda_max[t], host.lambda_max[t], bound * host.lambda_max[t]) << at << ", task " << t;
        EXPECT_NEAR(result.ridge[t], host.ridge[t], bound * host.ridge[t]) << at << ", task " << t;
        // Both report the explicit residual of their own root: rounding of the same size.
        EXPECT_LE(result.error[t], 10 * bound) << at << ", task " << t;
        const int b = tasks[t].index, n = tasks[t].size;
        EXPECT_LE(relative_frobenius_error(leading_block(roots, b, n), leading_block(host_roots, b, n)), bound)
            << at << ", task " << t;
      }
      for (double x : leading_block(roots, 3, padded)) ASSERT_EQ(x, 42.0);
      auto out = Kokkos::create_mirror_view(roots);
      Kokkos::deep_copy(out, roots);
      for (std::size_t b = 0; b < sizes.size(); ++b) {
        if (b == 3) continue;
        for (int i = 0; i < padded; ++i)
          for (int j = 0; j < padded; ++j)
            if (i >= sizes[b] || j >= sizes[b]) ASSERT_EQ(out(b, i, j), i == j ? 1.0 : 0.0) << "matrix " << b;
      }
      EXPECT_DOUBLE_EQ(result.gemm_flops, [&] {
        double flops = 0;
        for (const auto& task : tasks) flops += 3 * 2.0 * std::pow(double(task.size), 3);
        return flops;
      }());
    }
  }
}

// eigh names its path: eigh_host parses and prints as itself, and on a host backend takes the same
// path as eigh (equal bits).
TEST(EighOnSpace, EighHostIsAMethodOfItsOwn) {
  EXPECT_EQ(lather::linalg::parse_root_method("eigh_host"), RootMethod::eigh_host);
  EXPECT_EQ(lather::linalg::to_string(RootMethod::eigh_host), "eigh_host");
  EXPECT_THROW(lather::linalg::parse_root_method("eigh-host"), std::exception);
  if (!lather::Impl::host_accessible<Exec::memory_space>) GTEST_SKIP() << "eigh differs from eigh_host on a device";
  const int n = 24;
  auto stack = make_stack<double>({make_spectrum(n, 1.0, 1e4, 5).matrix()}, {n}, n);
  Stack<double> a("a", 1, n, n), b("b", 1, n, n);
  lather::linalg::inverse_pth_root(Exec(), stack, a, 4, precise(RootMethod::eigh));
  lather::linalg::inverse_pth_root(Exec(), stack, b, 4, precise(RootMethod::eigh_host));
  EXPECT_EQ(leading_block(a, 0, n), leading_block(b, 0, n));
}

// Stopping rules: max_iterations caps the steps and reports the error of what is returned.
TEST(InverseRoot, MaxIterationsIsReported) {
  const int n = 16;
  const auto spectrum = make_spectrum(n, 1.0, 1e5, 3);
  auto stack = make_stack<double>({spectrum.matrix()}, {n}, n);
  Stack<double> roots("roots", 1, n, n);
  auto options = precise(RootMethod::newton);
  options.max_iterations = 2;
  const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, options);
  EXPECT_EQ(result.status[0], RootStatus::max_iterations);
  EXPECT_EQ(result.iterations[0], 2);
  const auto got = leading_block(roots, 0, n);
  EXPECT_NEAR(result.error[0], residual(got, spectrum.matrix(), result.ridge[0], n, 2), 1e-9);
  EXPECT_GT(result.error[0], 1e-3);
}

// The power iteration's step count, against its closed form on a diagonal matrix: after k products
// the vector is d^k * v0 (elementwise), so the Rayleigh quotient is r_k = sum d^(2k+1) v0^2 / sum
// d^(2k) v0^2, and the iteration stops at the first step whose quotient moved by at most the
// tolerance from the last (from 0 before the first), or at the limit.
TEST(InverseRoot, PowerIterationStepsAreReported) {
  const std::vector<double> d = {1.0, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05};
  const int n = int(d.size());
  const auto v0 = lather::linalg::Impl::power_iteration_start_vector(n);
  const double tolerance = 1e-6;
  int expected = 0;
  double previous = 0, margin = 0;
  for (int k = 0; k < 100; ++k) {
    long double top = 0, bottom = 0;
    for (int i = 0; i < n; ++i) {
      const long double w = std::pow((long double)d[i], 2 * k) * v0[i] * v0[i];
      top += w * d[i];
      bottom += w;
    }
    const double quotient = double(top / bottom);
    const double moved = std::fabs(quotient - previous);
    previous = quotient;
    expected = k + 1;
    if (moved <= tolerance) {
      margin = moved / tolerance;
      break;
    }
  }
  // Not a near tie at the tolerance, which rounding could tip either way.
  ASSERT_LT(margin, 0.95) << "expected " << expected;
  ASSERT_GT(expected, 20);
  ASSERT_LT(expected, 100);

  std::vector<double> a(std::size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) a[std::size_t(i) * n + i] = d[i];
  auto stack = make_stack<double>({a, a}, {n, n}, n);
  Stack<double> roots("roots", 2, n, n);
  auto options = precise(RootMethod::newton);
  options.power_iteration_tolerance = tolerance;
  const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, options);
  EXPECT_EQ(result.power_iterations[0], expected);
  EXPECT_EQ(result.power_iterations[1], expected);
  EXPECT_NEAR(result.lambda_max[0], previous, 1e-12);

  options.power_iteration_max_iterations = 5;  // the limit stops it
  EXPECT_EQ(lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, options).power_iterations[0], 5);
  options.relative_ridge = false;  // no power iteration
  EXPECT_EQ(lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, options).power_iterations[0], 0);
  EXPECT_EQ(lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, precise(RootMethod::eigh)).power_iterations[0],
            0);
}

/// Newton as a device takes it, on this space: lockstep chunks of options.workspace_bytes, the
/// power iteration one team per matrix, each root written at the end from the H buffer that holds
/// it.
template <class T>
InverseRootResult newton_lockstep(const Stack<T>& matrices, const Stack<T>& roots, const std::vector<RootTask>& tasks,
                                  const InverseRootOptions& options) {
  return lather::linalg::Impl::InverseRootSolver<Exec, T>::solve_newton_lockstep(Exec(), matrices, roots, tasks,
                                                                                 options);
}

// Lockstep Newton equals Newton one matrix at a time. In one chunk the slots stop at different
// steps: better-conditioned matrices converge first, with max_iterations = 6 the worse ones stop at
// the cap, the indefinite one diverges (its previous H is returned), a non-finite one is left as it
// was; and the chunks hold 3 matrices, so a group of 7 spans three. The two paths differ only in
// how the power iteration sums A v (BLAS gemv on the host, a team's row sums on a device), so
// lambda_max agrees to a few ulps in double; the ridge is 1e-6 lambda_max (~1e-6 here) and moves by
// ~1e-22, far below the rounding of the Newton products (~n eps ~ 4e-15 per step), so the roots
// agree to 1e-12 relative and the errors to 1e-12 absolute, and statuses and step counts are equal.
TEST(NewtonLockstep, EqualsOneMatrixAtATime) {
  const int n = 16, padded = 16;
  std::vector<std::vector<double>> mats;
  std::vector<int> sizes;
  for (double condition : {1e1, 1e2, 1e3, 1e4, 1e6}) {
    mats.push_back(make_spectrum(n, 1.0, condition, 11 + unsigned(mats.size())).matrix());
    sizes.push_back(n);
  }
  auto indefinite = make_spectrum(n, 1.0, 10.0, 5);
  indefinite.eigenvalues[3] = -0.5;
  mats.push_back(indefinite.matrix());
  sizes.push_back(n);
  mats.push_back(make_spectrum(n, 1.0, 1e2, 17).matrix());
  mats.back()[5] = std::numeric_limits<double>::infinity();
  sizes.push_back(n);
  for (int b = 0; b < 2; ++b) {  // a second group, and a 1 x 1 matrix
    mats.push_back(make_spectrum(7, 2.0, 1e3, 30 + unsigned(b)).matrix());
    sizes.push_back(7);
  }
  mats.push_back({4.0});
  sizes.push_back(1);
  std::vector<RootTask> tasks;
  for (int b : {3, 0, 6, 8, 1, 5, 9, 2, 4, 7}) tasks.push_back({b, sizes[std::size_t(b)], b == 8 || b == 7 ? 2 : 4});
  auto stack = make_stack<double>(mats, sizes, padded);

  for (int max_iterations : {100, 6}) {
    auto options = precise(RootMethod::newton);
    options.max_iterations = max_iterations;
    options.workspace_bytes = 3 * (7 * std::size_t(n) * n + 2 * n) * sizeof(double);
    Stack<double> one("one", mats.size(), padded, padded), lockstep("lockstep", mats.size(), padded, padded);
    Kokkos::deep_copy(one, 42.0);
    Kokkos::deep_copy(lockstep, 42.0);
    const auto reference = lather::linalg::inverse_pth_root(Exec(), stack, one, tasks, options);
    const auto result = newton_lockstep(stack, lockstep, tasks, options);
    std::set<int> steps_in_group;
    std::set<RootStatus> statuses;
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      const std::string where =
          "max_iterations " + std::to_string(max_iterations) + ", matrix " + std::to_string(tasks[t].index);
      EXPECT_EQ(result.status[t], reference.status[t]) << where;
      EXPECT_EQ(result.iterations[t], reference.iterations[t]) << where;
      EXPECT_EQ(result.power_iterations[t], reference.power_iterations[t]) << where;
      if (reference.status[t] == RootStatus::non_finite) {
        EXPECT_TRUE(std::isnan(result.lambda_max[t])) << where;
        for (double x : leading_block(lockstep, tasks[t].index, padded)) ASSERT_EQ(x, 42.0) << where;
        continue;
      }
      EXPECT_NEAR(result.error[t], reference.error[t], 1e-12) << where;
      EXPECT_NEAR(result.lambda_max[t], reference.lambda_max[t], 1e-14 * reference.lambda_max[t]) << where;
      EXPECT_NEAR(result.ridge[t], reference.ridge[t], 1e-14 * reference.ridge[t]) << where;
      const auto got = leading_block(lockstep, tasks[t].index, padded);
      const auto want = leading_block(one, tasks[t].index, padded);
      EXPECT_LT(relative_frobenius_error(got, want), 1e-12) << where;
      if (tasks[t].size == n) {
        steps_in_group.insert(result.iterations[t]);
        statuses.insert(result.status[t]);
      }
      // Which iterate each slot returns, independently of the bookkeeping both paths share: the
      // H after k steps for a slot that stopped after k, the H after k - 1 for one that diverged at
      // step k; that is the root the same matrix alone gets with max_iterations capped there.
      auto capped = options;
      capped.max_iterations = result.iterations[t] - (result.status[t] == RootStatus::diverged ? 1 : 0);
      Stack<double> alone("alone", mats.size(), padded, padded);
      lather::linalg::inverse_pth_root(Exec(), stack, alone, std::vector<RootTask>{tasks[t]}, capped);
      EXPECT_LT(relative_frobenius_error(got, leading_block(alone, tasks[t].index, padded)), 1e-12) << where;
    }
    // The case exercises what it claims: slots of one chunk stop at several different steps (at
    // least two under the cap), and with the cap some stop at it while others diverge.
    EXPECT_GE(steps_in_group.size(), max_iterations == 6 ? 2u : 3u) << max_iterations;
    EXPECT_TRUE(statuses.count(RootStatus::diverged)) << max_iterations;
    if (max_iterations == 6) EXPECT_TRUE(statuses.count(RootStatus::max_iterations));
    EXPECT_EQ(result.gemm_calls, reference.gemm_calls);
  }
}

// An indefinite matrix is not a statistic: Newton must stop without NaN and flag a large error.
TEST(InverseRoot, IndefiniteInputIsFlaggedNotNaN) {
  const int n = 8;
  auto spectrum = make_spectrum(n, 1.0, 10.0, 5);
  spectrum.eigenvalues[3] = -0.5;
  auto stack = make_stack<double>({spectrum.matrix()}, {n}, n);
  Stack<double> roots("roots", 1, n, n);
  const auto result = lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, precise(RootMethod::newton));
  EXPECT_FALSE(result.accepted(0, 0.1)) << "error " << result.error[0];
  if (result.status[0] != RootStatus::non_finite)
    for (double x : leading_block(roots, 0, n)) EXPECT_TRUE(std::isfinite(x));
}

TEST(InverseRoot, StartVectorMatchesNumpyRandomState) {
  // numpy.random.RandomState(1729).uniform(-1, 1, 3)
  const auto v = lather::linalg::Impl::power_iteration_start_vector(3);
  EXPECT_DOUBLE_EQ(v[0], -0.5756828096125337);
  EXPECT_DOUBLE_EQ(v[1], -0.4819635189444771);
  EXPECT_DOUBLE_EQ(v[2], -0.15295624010794273);
}

TEST(InverseRoot, BadArgumentsNameTheProblem) {
  Stack<double> stack("stack", 2, 4, 4), roots("roots", 2, 4, 4), small("small", 1, 4, 4);
  auto expect_error = [](auto&& call, const std::string& fragment) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
    } catch (const lather::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([&] { lather::linalg::inverse_pth_root(Exec(), stack, small, 2); }, "must have the shape");
  expect_error(
      [&] {
        lather::linalg::inverse_pth_root(Exec(), stack, roots, std::vector<RootTask>{{5, 4, 2}});
      },
      "names matrix 5");
  expect_error(
      [&] {
        lather::linalg::inverse_pth_root(Exec(), stack, roots, std::vector<RootTask>{{0, 9, 2}});
      },
      "has size 9");
  expect_error(
      [&] {
        lather::linalg::inverse_pth_root(Exec(), stack, roots, std::vector<RootTask>{{0, 4, 0}});
      },
      "exponent 0");
  expect_error(
      [&] {
        lather::linalg::inverse_pth_root(Exec(), stack, roots, std::vector<RootTask>{{0, 4, 2}, {0, 4, 2}});
      },
      "more than one task");
  InverseRootOptions bad;
  bad.max_error_ratio = 0.5;
  expect_error([&] { lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, bad); }, "max_error_ratio");
  InverseRootOptions negative_threads;
  negative_threads.host_threads = -1;
  expect_error([&] { lather::linalg::inverse_pth_root(Exec(), stack, roots, 2, negative_threads); }, "host_threads");
}

// The batched products go one strided-batched call per run of consecutive matrices still
// iterating (cuBLAS builds); the runs must cover every slot once, in order.
TEST(BatchedGemm, ConsecutiveRunsCoverEverySlotOnce) {
  using lather::linalg::Impl::consecutive_runs;
  using Runs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(consecutive_runs({}), Runs{});
  EXPECT_EQ(consecutive_runs({7}), (Runs{{7, 1}}));
  EXPECT_EQ(consecutive_runs({0, 1, 2, 3}), (Runs{{0, 4}}));
  EXPECT_EQ(consecutive_runs({3, 4, 5, 9, 2, 3}), (Runs{{3, 3}, {9, 1}, {2, 2}}));
  EXPECT_EQ(consecutive_runs({1, 3, 5}), (Runs{{1, 1}, {3, 1}, {5, 1}}));
  EXPECT_EQ(consecutive_runs({4, 4, 5}), (Runs{{4, 1}, {4, 2}}));
}

// The host threads that take eigh roots (and Shampoo's products) give every item to exactly one
// thread, with a thread index below the count asked for, whether they are started for the call or
// lent by a threaded host backend (Kokkos OpenMP or Threads builds: concurrency() above 1); an
// item's exception reaches the caller after every thread has returned.
TEST(HostThreads, EveryItemOnceAndFailuresReachTheCaller) {
  using lather::Impl::for_each_on_host_threads;
  const Kokkos::DefaultHostExecutionSpace host;
  for (int variant = 0; variant < 2; ++variant) {
    const auto run = [&](int threads, std::size_t count, const auto& item) {
      if (variant == 0)
        for_each_on_host_threads(threads, count, item);
      else
        for_each_on_host_threads(host, threads, count, item);
    };
    for (int threads : {1, 2, 3, 8}) {
      const std::size_t count = 50;
      std::vector<std::atomic<int>> taken(count);
      std::atomic<int> bad_thread{0};
      run(threads, count, [&](int thread, std::size_t k) {
        if (thread < 0 || thread >= threads) ++bad_thread;
        ++taken[k];
      });
      EXPECT_EQ(bad_thread.load(), 0) << threads << " threads, variant " << variant;
      for (std::size_t k = 0; k < count; ++k) EXPECT_EQ(taken[k].load(), 1) << "item " << k << ", " << threads;
    }
    EXPECT_THROW(run(3, 40,
                     [&](int, std::size_t k) {
                       if (k == 5) throw std::runtime_error("item 5 failed");
                     }),
                 std::runtime_error)
        << "variant " << variant;
  }
}

// The threads kept between calls (kept_host_threads.hpp) serve call after call with any thread
// count; two callers at once, and a call from inside an item, are served too (one of them by
// threads started for it, as the kept ones are at work): every item once in each call, with a
// thread index below the count, and the kept threads still serve after an item threw. A kept
// thread that missed a call, or took a call's part twice, would show up as an item taken 0 or 2
// times or as a call that never returns (ctest's timeout).
TEST(HostThreads, KeptThreadsServeCallAfterCallAndCallersAtOnce) {
  using lather::Impl::for_each_on_host_threads;
  const auto check_call = [](int threads, std::size_t count) {
    std::vector<std::atomic<int>> taken(count);
    std::atomic<int> bad_thread{0};
    for_each_on_host_threads(threads, count, [&](int thread, std::size_t k) {
      if (thread < 0 || thread >= threads) ++bad_thread;
      ++taken[k];
    });
    int wrong = bad_thread.load();
    for (std::size_t k = 0; k < count; ++k) wrong += taken[k].load() != 1;
    return wrong;
  };
  int wrong = 0;
  for (int call = 0; call < 300; ++call) wrong += check_call(1 + call % 4, std::size_t(1 + call % 37));
  EXPECT_EQ(wrong, 0) << "one caller";

  std::atomic<int> wrong_at_once{0};
  const auto caller = [&](int threads) {
    for (int call = 0; call < 200; ++call) wrong_at_once += check_call(threads, 64);
  };
  std::thread other(caller, 3);
  caller(2);
  other.join();
  EXPECT_EQ(wrong_at_once.load(), 0) << "two callers at once";

  std::atomic<int> inner_wrong{0};
  for_each_on_host_threads(2, 6, [&](int, std::size_t) { inner_wrong += check_call(2, 16); });
  EXPECT_EQ(inner_wrong.load(), 0) << "calls from inside items";

  for (std::size_t failing : {std::size_t(0), std::size_t(5)}) {
    EXPECT_THROW(for_each_on_host_threads(2, 8,
                                          [&](int, std::size_t k) {
                                            if (k == failing) throw std::runtime_error("failed");
                                          }),
                 std::runtime_error);
    EXPECT_EQ(check_call(3, 40), 0) << "after item " << failing << " threw";
  }
}

}  // namespace
