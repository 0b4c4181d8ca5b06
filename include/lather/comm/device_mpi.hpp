#pragma once
// Whether the collectives hand MPI device memory in place or stage it through host buffers.
//
// Host memory always goes to MPI in place. Device memory (a View of a CUDA or HIP memory space)
// does where the MPI library reads it -- a GPU-aware MPI -- and is otherwise copied to host
// buffers and back (chunked and overlapped with the reduction where the collective is chunked).
// Which applies is decided once per process, at the first collective that asks:
//  1. a mode set by set_device_mpi(), else the environment variable LATHER_DEVICE_MPI
//     (`auto`, `direct` or `staged`);
//  2. `direct` and `staged` are obeyed as they are; with `auto`, a build configured with
//     LATHER_ENABLE_CUDA_AWARE_MPI=ON passes device memory in place, and otherwise the MPI library
//     is asked: MPICH's MPIX_GPU_query_support (CUDA or HIP, as the Kokkos backend), Open MPI's
//     MPIX_Query_cuda_support / MPIX_Query_rocm_support. An MPI that cannot be asked, or says no,
//     gets staged copies.
// The ranks need not agree: each rank hands MPI its own kind of buffer.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/kokkos_compat.hpp>

#include <string>

namespace lather::comm {

enum class DeviceMpi { automatic, direct, staged };

std::string device_mpi_name(DeviceMpi mode);  ///< "auto", "direct" or "staged"
/// "auto", "direct" or "staged"; anything else throws naming `source` (e.g. the variable).
DeviceMpi parse_device_mpi(const std::string& text, const std::string& source);

/// What the MPI library says of device memory: it reads it, it does not, or it cannot be asked.
enum class MpiDeviceSupport { yes, no, unknown };

/// The rule above, given the mode, whether the build declares a GPU-aware MPI, and the library's
/// answer: true where device memory goes to MPI in place.
bool resolve_device_mpi(DeviceMpi mode, bool build_declares, MpiDeviceSupport library);

/// Sets the mode for this process (`automatic` goes back to the environment's), and forgets the
/// decision taken so far: the next collective decides again. Not while collectives are in flight.
void set_device_mpi(DeviceMpi mode);

/// The decision for this process (taken at the first call, MPI initialized or not: without MPI,
/// or before MPI_Init, the library is not asked).
bool mpi_reads_device_memory();

/// Whether MPI is handed Views of `MemorySpace` in place (else through host buffers). The
/// decision is taken for host memory too, so that a bad LATHER_DEVICE_MPI is an error on every
/// build, at the first collective of Views.
template <class MemorySpace>
bool mpi_reads_in_place() {
  const bool device = mpi_reads_device_memory();
  return ::lather::Impl::host_accessible<MemorySpace> || device;
}

}  // namespace lather::comm
