#pragma once
// The GEMM calls of Lather: C = alpha op(A) op(B) + beta C through Kokkos Kernels (the BLAS TPL
// on the host, cuBLAS on CUDA), on the caller's execution space instance where Kokkos Kernels
// takes one (>= 4.1), and its strided-batched form for many products of one shape. Empty products
// are handled here, so no BLAS sees a zero dimension. Both forms also come with their inputs
// rounded to a ProductPrecision (TF32 or bfloat16, accumulation in float32): tensor cores through
// cuBLAS on CUDA, rounded copies of the inputs elsewhere.

#include <lather/core/error.hpp>
#include <lather/core/host_blas_threads.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/product_precision.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>
#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
#include <KokkosBlas_tpl_spec.hpp>
#include <cublas_v2.h>
#define LATHER_BATCHED_GEMM_CUBLAS 1
#else
#define LATHER_BATCHED_GEMM_CUBLAS 0
#endif

#include <cstdint>
#include <type_traits>

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

#if LATHER_BATCHED_GEMM_CUBLAS
/// cuBLAS is column-major: the row-major product C = op(A) op(B) is the column-major product
/// C^T = op(B)^T op(A)^T, so the operands swap and keep their transposition flags. A float
/// product at `precision` TF32 or bfloat16 is cublasGemmStridedBatchedEx with the tensor-core
/// compute type of that format (float32 in and out: cuBLAS converts the inputs itself).
template <class T>
void cublas_strided_batched(const Kokkos::Cuda& space, char ta, char tb, int m, int n, int k, T alpha, const T* a,
                            std::int64_t stride_a, const T* b, std::int64_t stride_b, T beta, T* c,
                            std::int64_t stride_c, int count, ProductPrecision precision = ProductPrecision::float32) {
  auto& singleton = KokkosBlas::Impl::CudaBlasSingleton::singleton();
  if (cublasSetStream(singleton.handle, space.cuda_stream()) != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cublasSetStream failed");
  const auto op = [](char t) { return (t == 'N' || t == 'n') ? CUBLAS_OP_N : CUBLAS_OP_T; };
  const int lda = (ta == 'N' || ta == 'n') ? k : m;  // row-major leading dimensions
  const int ldb = (tb == 'N' || tb == 'n') ? n : k;
  cublasStatus_t status;
  if constexpr (std::is_same<T, float>::value) {
    if (precision == ProductPrecision::float32) {
      status = cublasSgemmStridedBatched(singleton.handle, op(tb), op(ta), n, m, k, &alpha, b, ldb, stride_b, a, lda,
                                         stride_a, &beta, c, n, stride_c, count);
    } else {
      const cublasComputeType_t compute =
          precision == ProductPrecision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_FAST_16BF;
      status = cublasGemmStridedBatchedEx(singleton.handle, op(tb), op(ta), n, m, k, &alpha, b, CUDA_R_32F, ldb,
                                          stride_b, a, CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F, n, stride_c,
                                          count, compute, CUBLAS_GEMM_DEFAULT);
    }
  } else {
    status = cublasDgemmStridedBatched(singleton.handle, op(tb), op(ta), n, m, k, &alpha, b, ldb, stride_b, a, lda,
                                       stride_a, &beta, c, n, stride_c, count);
  }
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(precision == ProductPrecision::float32 ? "cublas<t>gemmStridedBatched failed"
                                                                    : "cublasGemmStridedBatchedEx failed");
}
#endif

/// True where a product of T at a reduced ProductPrecision goes to hardware that rounds the
/// inputs itself (cuBLAS's tensor-core compute types, float data on CUDA); elsewhere the inputs
/// are rounded into copies first, which needs scratch (gemm_strided_batched below).
template <class ExecutionSpace, class T>
constexpr bool rounds_inputs_itself() {
#if LATHER_BATCHED_GEMM_CUBLAS
  return std::is_same<ExecutionSpace, Kokkos::Cuda>::value && std::is_same<T, float>::value;
#else
  return false;
#endif
}

/// The upper triangle (row-major) of C = alpha X X^T + beta C for X [n, k] row-major, or of
/// C = alpha X^T X + beta C for X [k, n] (`transpose`), C n x n with rows ldc apart: BLAS syrk on
/// the host, half the flops of the GEMM (the lower triangle is left as it was). Host memory only.
void host_gram_upper(bool transpose, int n, int k, float alpha, const float* x, float beta, float* c, int ldc);
void host_gram_upper(bool transpose, int n, int k, double alpha, const double* x, double beta, double* c, int ldc);

/// C = alpha op(A) op(B) + beta C, row-major, m x n of inner size k, with leading dimensions (row
/// strides) lda, ldb, ldc; op is 'N' or 'T'. The host BLAS called directly, with no Kokkos call,
/// so host threads may run several at once (Shampoo's products on host threads). Host memory only.
void host_gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc);
void host_gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b, int ldb,
               double beta, double* c, int ldc);

/// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count: row-major m x n products of inner size k,
/// A_i at a + i stride_a (m x k, or k x m when ta is 'T'), B_i at b + i stride_b (k x n, or n x k),
/// C_i at c + i stride_c, all in the execution space's memory. One cuBLAS strided-batched call
/// where Kokkos Kernels has cuBLAS; elsewhere one GEMM per product (on the host, a BLAS call per
/// product is as fast as any batched kernel at the sizes Shampoo uses). On a host backend
/// `host_threads` above 1 shares the products out among that many host threads, each on one BLAS
/// thread (where `by_work`, no more than one per flops_per_host_thread; a threaded backend lends
/// its own, see for_each_on_host_threads): at these sizes a threaded BLAS gains less by splitting
/// one product.
/// Returns the launches made.
template <class ExecutionSpace, class T>
long gemm_strided_batched(const ExecutionSpace& space, char ta, char tb, int m, int n, int k, T alpha, const T* a,
                          std::int64_t stride_a, const T* b, std::int64_t stride_b, T beta, T* c, std::int64_t stride_c,
                          int count, int host_threads = 1, bool by_work = true) {
  using memory_space = typename ExecutionSpace::memory_space;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  using Const = Kokkos::View<const T**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  using Mutable = Kokkos::View<T**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  if (count <= 0 || m == 0 || n == 0) return 0;
#if LATHER_BATCHED_GEMM_CUBLAS
  if constexpr (std::is_same<ExecutionSpace, Kokkos::Cuda>::value) {
    if (k > 0) {
      cublas_strided_batched(space, ta, tb, m, n, k, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count);
      return 1;
    }
  }
#endif
  const bool a_normal = ta == 'N' || ta == 'n', b_normal = tb == 'N' || tb == 'n';
  if constexpr (runs_on_host<ExecutionSpace>) {
    const double flops = 2.0 * double(m) * double(n) * double(k) * double(count);
    const int threads = host_threads_for_products(host_threads, by_work, std::size_t(count), flops);
    if (threads > 1 && k > 0) {
      fence(space, "Lather::gemm_strided_batched: inputs ready");
      const ScopedHostBlasThreads one_blas_thread(1);
      for_each_on_host_threads(space, threads, std::size_t(count), [&](int, std::size_t i) {
        host_gemm(a_normal ? 'N' : 'T', b_normal ? 'N' : 'T', m, n, k, alpha, a + std::int64_t(i) * stride_a,
                  a_normal ? k : m, b + std::int64_t(i) * stride_b, b_normal ? n : k, beta,
                  c + std::int64_t(i) * stride_c, n);
      });
      return count;
    }
  }
  const char op_a[2] = {a_normal ? 'N' : 'T', 0}, op_b[2] = {b_normal ? 'N' : 'T', 0};
  for (int i = 0; i < count; ++i) {
    const Const ai(a + i * stride_a, a_normal ? m : k, a_normal ? k : m);
    const Const bi(b + i * stride_b, b_normal ? k : n, b_normal ? n : k);
    gemm(space, op_a, op_b, alpha, ai, bi, beta, Mutable(c + i * stride_c, m, n));
  }
  return count;
}

/// copy[i size + e] = round_to(from[i stride + e], precision) for i < copies, e < size: the
/// rounded inputs of a reduced-precision product, each matrix contiguous.
template <class ExecutionSpace>
void round_inputs(const ExecutionSpace& space, ProductPrecision precision, const float* from, std::int64_t stride,
                  std::int64_t size, int copies, float* copy) {
  const int kept = significand_bits(precision) - 1;
  Kokkos::parallel_for(
      "Lather::gemm::round_inputs", Kokkos::RangePolicy<ExecutionSpace>(space, 0, size * copies),
      KOKKOS_LAMBDA(std::int64_t f) {
        const std::int64_t i = f / size, e = f - i * size;
        copy[f] = round_significand(from[i * stride + e], kept);
      });
}

/// gemm_strided_batched with the inputs A_i and B_i rounded to `precision` and the products
/// accumulated in float32; C and beta C stay float32. On CUDA with cuBLAS (float data) one
/// cublasGemmStridedBatchedEx call on tensor cores, which convert the inputs themselves (cuBLAS
/// does not document its conversion's rounding). Elsewhere the inputs are rounded to nearest
/// even into `rounded` (grown as needed and kept for the next call; A's matrices once where B
/// holds the same ones, as for Gram matrices), then multiplied by the float32 call above: the
/// product of two rounded inputs is exact in float32, so this computes what a tensor core does
/// up to the order of the additions, at the cost of a pass over the inputs. float32 is the call
/// above, bit for bit, and needs no scratch. The reduced formats round float inputs: for double
/// data, anything but float32 throws lather::Error.
template <class ExecutionSpace, class T>
long gemm_strided_batched(const ExecutionSpace& space, ProductPrecision precision,
                          Kokkos::View<T*, typename ExecutionSpace::memory_space>& rounded, char ta, char tb, int m,
                          int n, int k, T alpha, const T* a, std::int64_t stride_a, const T* b, std::int64_t stride_b,
                          T beta, T* c, std::int64_t stride_c, int count, int host_threads = 1, bool by_work = true) {
  const auto plain = [&](const T* pa, std::int64_t sa, const T* pb, std::int64_t sb) {
    return gemm_strided_batched(space, ta, tb, m, n, k, alpha, pa, sa, pb, sb, beta, c, stride_c, count, host_threads,
                                by_work);
  };
  if (precision == ProductPrecision::float32 || count <= 0 || m == 0 || n == 0 || k == 0)
    return plain(a, stride_a, b, stride_b);
  if constexpr (!std::is_same<T, float>::value) {
    LATHER_FAIL("Lather::gemm: product precision ", to_string(precision),
                " rounds float inputs; these products are of double (use float32)");
  } else {
#if LATHER_BATCHED_GEMM_CUBLAS
    if constexpr (rounds_inputs_itself<ExecutionSpace, T>()) {
      cublas_strided_batched(space, ta, tb, m, n, k, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count,
                             precision);
      return 1;
    }
#endif
    const std::int64_t size_a = std::int64_t(m) * k, size_b = std::int64_t(k) * n;
    const int copies_a = stride_a == 0 ? 1 : count, copies_b = stride_b == 0 ? 1 : count;
    const bool same = a == b && stride_a == stride_b && size_a == size_b;
    const std::int64_t needed = copies_a * size_a + (same ? 0 : copies_b * size_b);
    if (std::int64_t(rounded.extent(0)) < needed) {
      // The old copies may still be read by a product in flight on `space`.
      fence(space, "Lather::gemm: rounded inputs no longer read");
      rounded = Kokkos::View<T*, typename ExecutionSpace::memory_space>(
          Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::gemm::rounded_inputs"), std::size_t(needed));
    }
    T* rounded_a = rounded.data();
    T* rounded_b = same ? rounded_a : rounded_a + copies_a * size_a;
    round_inputs(space, precision, a, stride_a, size_a, copies_a, rounded_a);
    if (!same) round_inputs(space, precision, b, stride_b, size_b, copies_b, rounded_b);
    return plain(rounded_a, stride_a == 0 ? 0 : size_a, rounded_b, stride_b == 0 ? 0 : size_b);
  }
}

/// gemm() with its inputs rounded to `precision` (gemm_strided_batched above, one product):
/// contiguous row-major Views only.
template <class ExecutionSpace, class AView, class BView, class CView>
void gemm(const ExecutionSpace& space, ProductPrecision precision,
          Kokkos::View<typename CView::non_const_value_type*, typename ExecutionSpace::memory_space>& rounded,
          const char* trans_a, const char* trans_b, typename CView::non_const_value_type alpha, const AView& a,
          const BView& b, typename CView::non_const_value_type beta, const CView& c) {
  if (precision == ProductPrecision::float32) {
    gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
    return;
  }
  static_assert(std::is_same<typename AView::array_layout, Kokkos::LayoutRight>::value &&
                    std::is_same<typename BView::array_layout, Kokkos::LayoutRight>::value &&
                    std::is_same<typename CView::array_layout, Kokkos::LayoutRight>::value,
                "Lather::gemm at a reduced precision takes row-major Views");
  LATHER_REQUIRE(a.span_is_contiguous() && b.span_is_contiguous() && c.span_is_contiguous(),
                 "Lather::gemm at a reduced precision takes contiguous Views");
  const bool a_normal = trans_a[0] == 'N' || trans_a[0] == 'n';
  const int k = int(a_normal ? a.extent(1) : a.extent(0));
  gemm_strided_batched(space, precision, rounded, a_normal ? 'N' : 'T',
                       (trans_b[0] == 'N' || trans_b[0] == 'n') ? 'N' : 'T', int(c.extent(0)), int(c.extent(1)), k,
                       alpha, a.data(), 0, b.data(), 0, beta, c.data(), 0, 1);
}

}  // namespace lather::Impl
