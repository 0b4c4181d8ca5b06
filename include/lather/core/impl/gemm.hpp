#pragma once
// The one GEMM call of Lather: C = alpha op(A) op(B) + beta C through Kokkos Kernels (the BLAS TPL
// on the host, cuBLAS on CUDA), on the caller's execution space instance where Kokkos Kernels
// takes one (>= 4.1). Empty products are handled here, so no BLAS sees a zero dimension.

#include <lather/core/kokkos_compat.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>
#include <Kokkos_Core.hpp>

namespace lather::Impl {

template <class ExecutionSpace, class AView, class BView, class CView>
void gemm(const ExecutionSpace& space, const char* trans_a, const char* trans_b,
          typename CView::non_const_value_type alpha, const AView& a, const BView& b,
          typename CView::non_const_value_type beta, const CView& c) {
  using value_type = typename CView::non_const_value_type;
  if (c.extent(0) == 0 || c.extent(1) == 0) return;
  const std::size_t inner = (trans_a[0] == 'N' || trans_a[0] == 'n') ? a.extent(1) : a.extent(0);
  if (inner == 0) {
    // op(A) op(B) is zero: C = beta C.
    if (beta == value_type(0))
      Kokkos::deep_copy(space, c, value_type(0));
    else if (beta != value_type(1))
      Kokkos::parallel_for(
          "Lather::gemm::scale",
          Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0}, {c.extent(0), c.extent(1)}),
          KOKKOS_LAMBDA(std::size_t i, std::size_t j) { c(i, j) *= beta; });
    return;
  }
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40100
  KokkosBlas::gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
#else
  // Older Kokkos Kernels run on the default instance: order it after the caller's work.
  fence(space, "Lather::gemm: inputs ready");
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
  fence(ExecutionSpace(), "Lather::gemm: product ready");
#endif
}

}  // namespace lather::Impl
