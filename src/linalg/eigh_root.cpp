#include "eigh_root.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

// LAPACK's Fortran symbols, with the hidden string-length arguments that gfortran and ifort pass.
extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info,
             std::size_t jobz_len, std::size_t uplo_len);
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w,
             float* work, const int* lwork, int* iwork, const int* liwork, int* info,
             std::size_t jobz_len, std::size_t uplo_len);
}

namespace lather::linalg::Impl {

namespace {

void syevd(int n, double* a, double* w, int& info) {
  int lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  dsyevd_("V", "L", &n, a, &n, w, &work_query, &lwork, &iwork_query, &liwork, &info, 1, 1);
  if (info != 0) return;
  lwork = int(work_query);
  liwork = iwork_query;
  std::vector<double> work(std::max(lwork, 1));
  std::vector<int> iwork(std::max(liwork, 1));
  dsyevd_("V", "L", &n, a, &n, w, work.data(), &lwork, iwork.data(), &liwork, &info, 1, 1);
}

void syevd(int n, float* a, float* w, int& info) {
  int lwork = -1, liwork = -1, iwork_query = 0;
  float work_query = 0;
  ssyevd_("V", "L", &n, a, &n, w, &work_query, &lwork, &iwork_query, &liwork, &info, 1, 1);
  if (info != 0) return;
  lwork = int(work_query);
  liwork = iwork_query;
  std::vector<float> work(std::max(lwork, 1));
  std::vector<int> iwork(std::max(liwork, 1));
  ssyevd_("V", "L", &n, a, &n, w, work.data(), &lwork, iwork.data(), &liwork, &info, 1, 1);
}

template <class C>
using HostMatrix = Kokkos::View<C**, Kokkos::LayoutRight, Kokkos::HostSpace,
                                Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

}  // namespace

template <class C>
EighOutcome eigh_inverse_root(std::vector<C>& matrix, int n, int p, const InverseRootOptions& options,
                              std::vector<C>& root, GemmCount& count) {
  EighOutcome outcome;
  const std::size_t nn = std::size_t(n) * n;
  for (std::size_t k = 0; k < nn; ++k) {
    if (!std::isfinite(matrix[k])) {
      outcome.status = RootStatus::non_finite;
      outcome.error = std::numeric_limits<double>::infinity();
      outcome.lambda_max = outcome.ridge = std::nan("");
      return outcome;
    }
  }
  const std::vector<C> original = matrix;

  // Row-major symmetric input read as column-major is the same matrix; the eigenvectors come back
  // as the columns of the column-major result, i.e. as the rows of `vectors` below.
  std::vector<C> eigenvalues(n);
  int info = 0;
  syevd(n, matrix.data(), eigenvalues.data(), info);
  if (info != 0) {
    outcome.status = RootStatus::non_finite;
    outcome.error = std::numeric_limits<double>::infinity();
    outcome.lambda_max = outcome.ridge = std::nan("");
    return outcome;
  }
  const double lambda_max = double(eigenvalues[n - 1]);
  const double ridge = options.relative_ridge ? options.ridge_epsilon * std::max(lambda_max, 1e-6)
                                              : options.ridge_epsilon;
  outcome.lambda_max = lambda_max;
  outcome.ridge = double(C(ridge));

  // vectors(k, i) = component i of eigenvector k.
  HostMatrix<C> vectors(matrix.data(), n, n);
  std::vector<C> scaled_storage(nn), power_storage(nn);
  HostMatrix<C> scaled(scaled_storage.data(), n, n);  // (V diag(mu))^T rows
  root.assign(nn, C(0));
  HostMatrix<C> root_view(root.data(), n, n);

  std::vector<C> mu(n);
  for (int k = 0; k < n; ++k) {
    // A is PSD, so lambda_k + ridge >= ridge; negative rounding noise is dropped, while a truly
    // indefinite input shows up in the residual below.
    const double shifted = std::max(double(eigenvalues[k]), 0.0) + double(C(ridge));
    mu[k] = C(std::pow(shifted, -1.0 / p));
  }
  // root = V diag(mu) V^T: with W(k, :) = mu_k V(k, :), root = V_rows^T W.
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < n; ++i) scaled(k, i) = mu[k] * vectors(k, i);
  ::lather::Impl::gemm(Kokkos::DefaultHostExecutionSpace(), "T", "N", C(1), vectors, scaled, C(0), root_view);
  count.add(n, 1);

  if (!std::all_of(root.begin(), root.end(), [](C x) { return std::isfinite(x); })) {
    outcome.status = RootStatus::non_finite;
    outcome.error = std::numeric_limits<double>::infinity();
    return outcome;
  }

  // Residual: H^p = V diag(mu^p) V^T, then M = H^p (A + ridge I), error = max |M - I|.
  for (int k = 0; k < n; ++k) {
    const C mu_p = C(std::pow(double(mu[k]), p));
    for (int i = 0; i < n; ++i) scaled(k, i) = mu_p * vectors(k, i);
  }
  HostMatrix<C> power(power_storage.data(), n, n);
  ::lather::Impl::gemm(Kokkos::DefaultHostExecutionSpace(), "T", "N", C(1), vectors, scaled, C(0), power);
  std::vector<C> damped_storage = original;
  HostMatrix<C> damped(damped_storage.data(), n, n);
  for (int i = 0; i < n; ++i) damped(i, i) += C(ridge);
  HostMatrix<C> residual(matrix.data(), n, n);  // the eigenvectors are no longer needed
  ::lather::Impl::gemm(Kokkos::DefaultHostExecutionSpace(), "N", "N", C(1), power, damped, C(0), residual);
  count.add(n, 2);
  double worst = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const double d = std::fabs(double(residual(i, j)) - (i == j ? 1.0 : 0.0));
      worst = std::isfinite(d) ? std::max(worst, d) : std::numeric_limits<double>::infinity();
    }
  outcome.error = worst;
  outcome.status = RootStatus::converged;
  return outcome;
}

template EighOutcome eigh_inverse_root<float>(std::vector<float>&, int, int, const InverseRootOptions&,
                                              std::vector<float>&, GemmCount&);
template EighOutcome eigh_inverse_root<double>(std::vector<double>&, int, int,
                                               const InverseRootOptions&, std::vector<double>&,
                                               GemmCount&);

}  // namespace lather::linalg::Impl
