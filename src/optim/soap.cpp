#include <lather/optim/impl/soap_impl.hpp>

#include <lather/core/error.hpp>
#include <lather/core/gemm.hpp>

#include "option_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>

// LAPACK's Fortran symbols, with the hidden string-length arguments that gfortran and ifort pass.
extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info, std::size_t jobz_len, std::size_t uplo_len);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork,
             int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
}

namespace lather::optim {

namespace {
using Impl::require_non_negative;
using Impl::require_unit_interval;
using HostMatrix =
    Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
}  // namespace

void SoapOptions::validate() const {
  learning_rate.validate();
  require_unit_interval(beta1, "SoapOptions::beta1");
  require_unit_interval(beta2, "SoapOptions::beta2");
  // Negative means "use beta2" (the reference's None); NaN is an error.
  LATHER_REQUIRE(shampoo_beta < 0 || (std::isfinite(shampoo_beta) && shampoo_beta < 1),
                 "SoapOptions::shampoo_beta must be in [0, 1) (or < 0 for beta2), got ", shampoo_beta);
  require_non_negative(epsilon, "SoapOptions::epsilon");
  require_non_negative(weight_decay, "SoapOptions::weight_decay");
  LATHER_REQUIRE(precondition_frequency >= 1, "SoapOptions::precondition_frequency must be >= 1, got ",
                 precondition_frequency);
  LATHER_REQUIRE(max_precond_dim >= 1, "SoapOptions::max_precond_dim must be >= 1, got ", max_precond_dim);
  LATHER_REQUIRE(host_threads >= 0 && host_threads <= 1024, "SoapOptions::host_threads must be in [0, 1024], got ",
                 host_threads);
}

double soap_block_cost(const std::vector<std::int64_t>& size, const std::vector<bool>& factored,
                       long precondition_frequency) {
  double elements = 1;
  for (auto n : size) elements *= double(n);
  double cost = 10 * elements;
  for (std::size_t d = 0; d < size.size(); ++d)
    if (d < factored.size() && factored[d]) {
      const double n = double(size[d]);
      cost += 8 * n * elements + 10 * n * n * n / double(std::max(1L, precondition_frequency));
    }
  return cost;
}

namespace Impl {

void soap_eigenbasis(int n, const double* factor, double* basis) {
  // A row-major symmetric matrix read as column-major is the same matrix.
  std::vector<double> a(factor, factor + std::size_t(n) * n), w(static_cast<std::size_t>(n));
  int info = 0, lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  dsyevd_("V", "L", &n, a.data(), &n, w.data(), &work_query, &lwork, &iwork_query, &liwork, &info, 1, 1);
  LATHER_REQUIRE(info == 0, "Soap: dsyevd workspace query failed (info ", info, ") for a factor of size ", n);
  lwork = std::max(1, int(work_query));
  liwork = std::max(1, iwork_query);
  std::vector<double> work(static_cast<std::size_t>(lwork));
  std::vector<int> iwork(static_cast<std::size_t>(liwork));
  dsyevd_("V", "L", &n, a.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info, 1, 1);
  LATHER_REQUIRE(info == 0, "Soap: dsyevd failed (info ", info, ") on a factor of size ", n,
                 " (non-finite gradients?)");
  // Column k of the column-major result is the eigenvector of the k-th smallest eigenvalue; the
  // reference flips them to descending order (torch.flip(q, [1])).
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) basis[std::size_t(i) * n + j] = a[std::size_t(n - 1 - j) * n + i];
}

void soap_power_qr(int n, const double* factor, double* basis, std::vector<int>& order) {
  const std::size_t nn = std::size_t(n) * n;
  std::vector<double> f(factor, factor + nn), q(basis, basis + nn), product(nn);
  const HostMatrix qv(q.data(), n, n), mv(product.data(), n, n);
  // The BLAS directly, no Kokkos call: refreshes run on host threads.
  ::lather::Impl::host_gemm('N', 'N', n, n, n, 1.0, f.data(), n, q.data(), n, 0.0, product.data(), n);
  std::vector<double> estimate(static_cast<std::size_t>(n), 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) estimate[std::size_t(j)] += qv(i, j) * mv(i, j);
  order.resize(std::size_t(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return estimate[std::size_t(a)] > estimate[std::size_t(b)]; });
  // Column-major F Q[:, order] = (F Q)[:, order] for LAPACK.
  std::vector<double> a(nn), tau(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i) a[std::size_t(j) * n + i] = mv(i, order[std::size_t(j)]);
  int info = 0, lwork = -1;
  double work_query = 0;
  dgeqrf_(&n, &n, a.data(), &n, tau.data(), &work_query, &lwork, &info);
  double orgqr_query = 0;
  dorgqr_(&n, &n, &n, a.data(), &n, tau.data(), &orgqr_query, &lwork, &info);
  lwork = std::max({1, int(work_query), int(orgqr_query)});
  std::vector<double> work(static_cast<std::size_t>(lwork));
  dgeqrf_(&n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  LATHER_REQUIRE(info == 0, "Soap: dgeqrf failed (info ", info, ") on a factor of size ", n);
  dorgqr_(&n, &n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  LATHER_REQUIRE(info == 0, "Soap: dorgqr failed (info ", info, ") on a factor of size ", n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) basis[std::size_t(i) * n + j] = a[std::size_t(j) * n + i];
}

}  // namespace Impl

template class Soap<DefaultExecutionSpace, float>;
template class Soap<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class Soap<DefaultHostExecutionSpace, float>;
template class Soap<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::optim
