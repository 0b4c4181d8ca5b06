#include <lather/comm/device_mpi.hpp>

#include <lather/core/config.hpp>
#include <lather/core/error.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>

#if LATHER_ENABLE_MPI
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif
#endif

namespace lather::comm {

std::string device_mpi_name(DeviceMpi mode) {
  switch (mode) {
    case DeviceMpi::automatic:
      return "auto";
    case DeviceMpi::direct:
      return "direct";
    case DeviceMpi::staged:
      return "staged";
  }
  return "unknown";
}

DeviceMpi parse_device_mpi(const std::string& text, const std::string& source) {
  if (text == "auto") return DeviceMpi::automatic;
  if (text == "direct") return DeviceMpi::direct;
  if (text == "staged") return DeviceMpi::staged;
  LATHER_FAIL(source, " = '", text, "': expected auto, direct or staged");
}

bool resolve_device_mpi(DeviceMpi mode, bool build_declares, MpiDeviceSupport library) {
  if (mode == DeviceMpi::direct) return true;
  if (mode == DeviceMpi::staged) return false;
  return build_declares || library == MpiDeviceSupport::yes;
}

namespace {

/// The MPI library's answer for the Kokkos backend's kind of device memory.
MpiDeviceSupport ask_the_library() {
#if LATHER_ENABLE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return MpiDeviceSupport::unknown;
#if defined(MPICH_NUMVERSION) && defined(MPIX_GPU_SUPPORT_CUDA)
#if defined(KOKKOS_ENABLE_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) != MPI_SUCCESS) return MpiDeviceSupport::unknown;
  return supported ? MpiDeviceSupport::yes : MpiDeviceSupport::no;
#elif defined(KOKKOS_ENABLE_HIP)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_HIP, &supported) != MPI_SUCCESS) return MpiDeviceSupport::unknown;
  return supported ? MpiDeviceSupport::yes : MpiDeviceSupport::no;
#endif
#elif defined(OPEN_MPI) && OPEN_MPI
#if defined(KOKKOS_ENABLE_CUDA) && defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() ? MpiDeviceSupport::yes : MpiDeviceSupport::no;
#elif defined(KOKKOS_ENABLE_HIP) && defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
  return MPIX_Query_rocm_support() ? MpiDeviceSupport::yes : MpiDeviceSupport::no;
#endif
#endif
#endif
  return MpiDeviceSupport::unknown;
}

std::mutex mode_mutex;
DeviceMpi set_mode = DeviceMpi::automatic;
/// -1: not decided yet; else the decision.
std::atomic<int> decision{-1};

}  // namespace

void set_device_mpi(DeviceMpi mode) {
  const std::lock_guard<std::mutex> lock(mode_mutex);
  set_mode = mode;
  decision = -1;
}

bool mpi_reads_device_memory() {
  const int known = decision.load();
  if (known >= 0) return known == 1;
  const std::lock_guard<std::mutex> lock(mode_mutex);
  DeviceMpi mode = set_mode;
  if (mode == DeviceMpi::automatic) {
    if (const char* text = std::getenv("LATHER_DEVICE_MPI")) mode = parse_device_mpi(text, "LATHER_DEVICE_MPI");
  }
  const bool direct = resolve_device_mpi(mode, LATHER_ENABLE_CUDA_AWARE_MPI != 0,
                                         mode == DeviceMpi::automatic ? ask_the_library() : MpiDeviceSupport::unknown);
  decision = direct ? 1 : 0;
  return direct;
}

}  // namespace lather::comm
