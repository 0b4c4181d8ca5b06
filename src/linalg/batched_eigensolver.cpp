#include "batched_eigensolver.hpp"

#include "eigh_root.hpp"

#include <lather/core/error.hpp>

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(LATHER_HAVE_CUSOLVER) && defined(KOKKOS_ENABLE_CUDA)
#include <cusolverDn.h>
#define LATHER_CUSOLVER_EIGENSOLVER 1
// cusolverDnXsyevBatched first shipped with cuSOLVER 11.7.1 (CUDA 12.6 Update 2).
#if defined(CUSOLVER_VERSION) && CUSOLVER_VERSION >= 11701
#define LATHER_CUSOLVER_SYEV_BATCHED 1
#else
#define LATHER_CUSOLVER_SYEV_BATCHED 0
#endif
#else
#define LATHER_CUSOLVER_EIGENSOLVER 0
#define LATHER_CUSOLVER_SYEV_BATCHED 0
#endif

namespace lather::linalg::Impl {

bool device_has_batched_syev() { return LATHER_CUSOLVER_SYEV_BATCHED != 0; }

namespace {

template <class C>
void host_batched_syevd(int n, int count, C* a, C* w, int* info) {
  EighWorkspace<C> workspace;
  for (int b = 0; b < count; ++b)
    info[b] = host_syevd(n, a + std::size_t(b) * n * n, w + std::size_t(b) * n, workspace);
}

#if LATHER_CUSOLVER_EIGENSOLVER
void check(cusolverStatus_t status, const char* call) {
  LATHER_REQUIRE(status == CUSOLVER_STATUS_SUCCESS, "batched eigensolver: ", call, " failed with cuSOLVER status ",
                 int(status));
}

/// One cuSOLVER handle and parameter set for the process, and the solver's workspaces, kept from
/// one call to the next (a root step makes several); released when Kokkos finalizes.
struct CusolverState {
  cusolverDnHandle_t handle = nullptr;
  cusolverDnParams_t params = nullptr;
  Kokkos::View<char*, Kokkos::CudaSpace> device_workspace;
  std::vector<char> host_workspace;

  static CusolverState& get() {
    static CusolverState* state = [] {
      auto* created = new CusolverState;
      check(cusolverDnCreate(&created->handle), "cusolverDnCreate");
      check(cusolverDnCreateParams(&created->params), "cusolverDnCreateParams");
      Kokkos::push_finalize_hook([] {
        CusolverState& s = get();
        s.device_workspace = {};
        cusolverDnDestroyParams(s.params);
        cusolverDnDestroy(s.handle);
        s.params = nullptr;
        s.handle = nullptr;
      });
      return created;
    }();
    LATHER_REQUIRE(state->handle != nullptr, "batched eigensolver: called after Kokkos::finalize");
    return *state;
  }

  /// Workspaces of at least these sizes. Growing one waits for the space first: calls queued on it
  /// may still use the old buffers.
  void reserve(const Kokkos::Cuda& space, std::size_t device_bytes, std::size_t host_bytes) {
    if (device_bytes > device_workspace.extent(0) || host_bytes > host_workspace.size()) {
      fence(space, "Lather::batched_syevd: workspace grows");
      if (device_bytes > device_workspace.extent(0))
        device_workspace = Kokkos::View<char*, Kokkos::CudaSpace>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::batched_syevd::workspace"), device_bytes);
      if (host_bytes > host_workspace.size()) host_workspace.resize(host_bytes);
    }
  }
};

template <class C>
void cusolver_syevd(const Kokkos::Cuda& space, int n, int count, C* a, C* w, int* info, bool batched) {
  constexpr cudaDataType type = std::is_same<C, float>::value ? CUDA_R_32F : CUDA_R_64F;
  CusolverState& s = CusolverState::get();
  check(cusolverDnSetStream(s.handle, space.cuda_stream()), "cusolverDnSetStream");
  const auto jobz = CUSOLVER_EIG_MODE_VECTOR;
  const auto uplo = CUBLAS_FILL_MODE_LOWER;
  std::size_t device_bytes = 0, host_bytes = 0;
#if LATHER_CUSOLVER_SYEV_BATCHED
  // cusolverDnXsyevBatched is limited to n * lda * batch <= INT32_MAX: larger batches go in parts.
  // A size it refuses outright (its buffer query fails) takes the per-matrix solver below.
  const int most = int(std::min<std::int64_t>(std::numeric_limits<std::int32_t>::max() / (std::int64_t(n) * n),
                                              std::numeric_limits<int>::max()));
  if (batched && most >= 1 &&
      cusolverDnXsyevBatched_bufferSize(s.handle, s.params, jobz, uplo, n, type, a, n, type, w, type, &device_bytes,
                                        &host_bytes, std::min(count, most)) == CUSOLVER_STATUS_SUCCESS) {
    s.reserve(space, device_bytes, host_bytes);
    for (int first = 0; first < count; first += most) {
      const int part = std::min(most, count - first);
      check(cusolverDnXsyevBatched(s.handle, s.params, jobz, uplo, n, type, a + std::size_t(first) * n * n, n, type,
                                   w + std::size_t(first) * n, type, s.device_workspace.data(), device_bytes,
                                   s.host_workspace.data(), host_bytes, info + first, part),
            "cusolverDnXsyevBatched");
    }
    return;
  }
#else
  (void)batched;
#endif
  check(cusolverDnXsyevd_bufferSize(s.handle, s.params, jobz, uplo, n, type, a, n, type, w, type, &device_bytes,
                                    &host_bytes),
        "cusolverDnXsyevd_bufferSize");
  s.reserve(space, device_bytes, host_bytes);
  for (int b = 0; b < count; ++b)
    check(cusolverDnXsyevd(s.handle, s.params, jobz, uplo, n, type, a + std::size_t(b) * n * n, n, type,
                           w + std::size_t(b) * n, type, s.device_workspace.data(), device_bytes,
                           s.host_workspace.data(), host_bytes, info + b),
          "cusolverDnXsyevd");
}
#endif

}  // namespace

template <class ExecutionSpace, class C>
void batched_syevd(const ExecutionSpace& space, int n, int count, C* a, C* w, int* info, bool batched) {
  if (count <= 0 || n <= 0) return;
#if LATHER_CUSOLVER_EIGENSOLVER
  if constexpr (std::is_same<ExecutionSpace, Kokkos::Cuda>::value) {
    cusolver_syevd(space, n, count, a, w, info, batched);
    return;
  }
#endif
  if constexpr (::lather::Impl::host_accessible<typename ExecutionSpace::memory_space>) {
    (void)batched;
    fence(space, "Lather::batched_syevd: matrices ready for LAPACK");
    host_batched_syevd(n, count, a, w, info);
  } else {
    LATHER_REQUIRE(has_batched_eigensolver<ExecutionSpace>(), "batched_syevd: no eigensolver on ",
                   ExecutionSpace::name(), " (the eigh roots take the host path there)");
  }
}

#define LATHER_INSTANTIATE_SYEVD(Space)                                                          \
  template void batched_syevd<Space, float>(const Space&, int, int, float*, float*, int*, bool); \
  template void batched_syevd<Space, double>(const Space&, int, int, double*, double*, int*, bool);
LATHER_INSTANTIATE_SYEVD(Kokkos::DefaultExecutionSpace)
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
LATHER_INSTANTIATE_SYEVD(Kokkos::DefaultHostExecutionSpace)
#endif
#undef LATHER_INSTANTIATE_SYEVD

}  // namespace lather::linalg::Impl
