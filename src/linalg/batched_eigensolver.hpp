#pragma once
// A batched symmetric eigensolver on an execution space, in the manner of Kokkos Kernels' TPL
// layers: the vendor's solver where the backend has one, LAPACK where the memory is the host's.
//  * CUDA with cuSOLVER: cusolverDnXsyevBatched (cuSOLVER >= 11.7.1, CUDA 12.6 Update 2) for the
//    whole batch in one call, or cusolverDnXsyevd one matrix at a time on the space's stream;
//  * host backends: LAPACK syevd one matrix at a time;
//  * other devices (HIP without rocSOLVER, SYCL): none. The eigh roots then take the host path.

#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace lather::linalg::Impl {

/// Whether batched_syevd runs on `ExecutionSpace`'s own memory.
template <class ExecutionSpace>
constexpr bool has_batched_eigensolver() {
  if (::lather::Impl::host_accessible<typename ExecutionSpace::memory_space>) return true;
#if defined(LATHER_HAVE_CUSOLVER) && defined(KOKKOS_ENABLE_CUDA)
  return std::is_same<ExecutionSpace, Kokkos::Cuda>::value;
#else
  return false;
#endif
}

/// Whether the backend has a solver that takes a whole batch in one call (cusolverDnXsyevBatched);
/// without one, batched_syevd makes one call per matrix.
bool device_has_batched_syev();

/// Eigenvalues (ascending) and eigenvectors of `count` symmetric n x n matrices stored one after
/// another (n * n values each) at `a`, all in `space`'s memory. A symmetric matrix reads the same
/// row-major and column-major, so the layout does not matter on input; on return row k of matrix b,
/// read row-major, is its k-th eigenvector, w[b * n + k] its eigenvalue, and info[b] is 0 where the
/// solver succeeded. `batched`: one call for the whole batch where the backend has one (else one
/// call per matrix). Ordered on `space` like a kernel: the caller fences before reading the results
/// on the host.
template <class ExecutionSpace, class C>
void batched_syevd(const ExecutionSpace& space, int n, int count, C* a, C* w, int* info, bool batched);

}  // namespace lather::linalg::Impl
