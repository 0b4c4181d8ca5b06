#include "eigh_root.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

// LAPACK's Fortran symbols, with the hidden string-length arguments that gfortran and ifort pass.
extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info, std::size_t jobz_len, std::size_t uplo_len);
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w, float* work,
             const int* lwork, int* iwork, const int* liwork, int* info, std::size_t jobz_len, std::size_t uplo_len);
}

namespace lather::linalg::Impl {

namespace {

void syevd_call(int n, double* a, double* w, double* work, int lwork, int* iwork, int liwork, int& info) {
  dsyevd_("V", "L", &n, a, &n, w, work, &lwork, iwork, &liwork, &info, 1, 1);
}
void syevd_call(int n, float* a, float* w, float* work, int lwork, int* iwork, int liwork, int& info) {
  ssyevd_("V", "L", &n, a, &n, w, work, &lwork, iwork, &liwork, &info, 1, 1);
}

template <class C>
using HostMatrix = Kokkos::View<C**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// out = w^T w (n x n, row-major): BLAS syrk's upper triangle, mirrored into the lower one.
template <class C>
void symmetric_square(int n, const HostMatrix<C>& w, const HostMatrix<C>& out) {
  ::lather::Impl::host_gram_upper(true, n, n, C(1), w.data(), C(0), out.data(), n);
  for (int i = 1; i < n; ++i)
    for (int j = 0; j < i; ++j) out(i, j) = out(j, i);
}

}  // namespace

template <class C>
int host_syevd(int n, C* a, C* w, EighWorkspace<C>& ws) {
  int info = 0;
  if (ws.queried_n != n) {
    C work_query = 0;
    int iwork_query = 0;
    syevd_call(n, a, w, &work_query, -1, &iwork_query, -1, info);
    if (info != 0) return info;
    ws.work.resize(std::size_t(std::max(int(work_query), 1)));
    ws.iwork.resize(std::size_t(std::max(iwork_query, 1)));
    ws.queried_n = n;
  }
  syevd_call(n, a, w, ws.work.data(), int(ws.work.size()), ws.iwork.data(), int(ws.iwork.size()), info);
  return info;
}
template int host_syevd<float>(int, float*, float*, EighWorkspace<float>&);
template int host_syevd<double>(int, double*, double*, EighWorkspace<double>&);

template <class C>
EighOutcome eigh_inverse_root(std::vector<C>& matrix, int n, int p, const InverseRootOptions& options,
                              std::vector<C>& root, GemmCount& count, EighWorkspace<C>& ws) {
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
  ws.original = matrix;
  const std::vector<C>& original = ws.original;

  // Row-major symmetric input read as column-major is the same matrix; the eigenvectors come back
  // as the columns of the column-major result, i.e. as the rows of `vectors` below.
  ws.eigenvalues.resize(std::size_t(n));
  const std::vector<C>& eigenvalues = ws.eigenvalues;
  const int info = host_syevd(n, matrix.data(), ws.eigenvalues.data(), ws);
  if (info != 0) {
    outcome.status = RootStatus::non_finite;
    outcome.error = std::numeric_limits<double>::infinity();
    outcome.lambda_max = outcome.ridge = std::nan("");
    return outcome;
  }
  const double lambda_max = double(eigenvalues[n - 1]);
  const double ridge =
      options.relative_ridge ? options.ridge_epsilon * std::max(lambda_max, 1e-6) : options.ridge_epsilon;
  outcome.lambda_max = lambda_max;
  outcome.ridge = double(C(ridge));

  // vectors(k, i) = component i of eigenvector k.
  HostMatrix<C> vectors(matrix.data(), n, n);
  ws.scaled.resize(nn);
  ws.power.resize(nn);
  HostMatrix<C> scaled(ws.scaled.data(), n, n);  // (V diag(mu))^T rows
  root.assign(nn, C(0));
  HostMatrix<C> root_view(root.data(), n, n);

  std::vector<C>& mu = ws.mu;
  mu.resize(std::size_t(n));
  for (int k = 0; k < n; ++k) {
    // A is PSD, so lambda_k + ridge >= ridge; negative rounding noise is dropped, while a truly
    // indefinite input shows up in the residual below.
    const double shifted = std::max(double(eigenvalues[k]), 0.0) + double(C(ridge));
    mu[k] = C(std::pow(shifted, -1.0 / p));
  }
  // root = V diag(mu) V^T = W^T W with W(k, :) = sqrt(mu_k) V(k, :): a syrk, half the flops of
  // the GEMM, its upper triangle mirrored.
  for (int k = 0; k < n; ++k) {
    const C factor = C(std::sqrt(double(mu[k])));
    for (int i = 0; i < n; ++i) scaled(k, i) = factor * vectors(k, i);
  }
  symmetric_square(n, scaled, root_view);
  count.add(n, 1);

  if (!std::all_of(root.begin(), root.end(), [](C x) { return std::isfinite(x); })) {
    outcome.status = RootStatus::non_finite;
    outcome.error = std::numeric_limits<double>::infinity();
    return outcome;
  }

  // Residual: H^p = V diag(mu^p) V^T (a syrk as above), then M = H^p (A + ridge I), error =
  // max |M - I|.
  for (int k = 0; k < n; ++k) {
    const C factor = C(std::pow(double(mu[k]), 0.5 * p));
    for (int i = 0; i < n; ++i) scaled(k, i) = factor * vectors(k, i);
  }
  HostMatrix<C> power(ws.power.data(), n, n);
  symmetric_square(n, scaled, power);
  ws.damped = original;
  HostMatrix<C> damped(ws.damped.data(), n, n);
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
                                              std::vector<float>&, GemmCount&, EighWorkspace<float>&);
template EighOutcome eigh_inverse_root<double>(std::vector<double>&, int, int, const InverseRootOptions&,
                                               std::vector<double>&, GemmCount&, EighWorkspace<double>&);

}  // namespace lather::linalg::Impl
