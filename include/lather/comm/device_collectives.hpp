#pragma once
// Whether the collectives of device Views go through NCCL or through MPI.
//
// A build configured with LATHER_ENABLE_NCCL=ON (CUDA only) can hand the sum-type reductions, the
// all-gathers and the pairwise exchanges of Views in CUDA memory to NCCL, enqueued on the stream of
// the caller's execution space instance, as Horovod does; the agreements before them, and every
// other transfer, stay on MPI (docs/reference/collectives.md lists which go where). Which applies
// is decided once per process, at the first collective of Views that asks:
//  1. a mode set by set_device_collectives(), else the environment variable
//     LATHER_DEVICE_COLLECTIVES (`auto`, `nccl` or `mpi`);
//  2. `mpi` keeps MPI; `auto` takes NCCL where the build has it and the View's memory is CUDA's;
//     `nccl` too, and in a build without NCCL it is an error naming LATHER_ENABLE_NCCL (on every
//     build, at the first collective of Views, as a bad value is).
// Unlike comm/device_mpi.hpp's choice, the ranks of a group must agree (an NCCL call matches no
// MPI call): a group checks that over MPI before it moves data through NCCL.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/config.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace lather::comm {

enum class DeviceCollectives { automatic, nccl, mpi };

std::string device_collectives_name(DeviceCollectives mode);  ///< "auto", "nccl" or "mpi"
/// "auto", "nccl" or "mpi"; anything else throws naming `source` (e.g. the variable).
DeviceCollectives parse_device_collectives(const std::string& text, const std::string& source);

/// The rule above, given the mode, whether the build has NCCL and whether the data is in CUDA
/// memory: true where the collective goes through NCCL. `nccl` in a build without NCCL throws,
/// whatever the memory.
bool resolve_device_collectives(DeviceCollectives mode, bool built_with_nccl, bool cuda_memory);

/// Sets the mode for this process (`automatic` goes back to the environment's), and forgets the
/// mode read so far. Not while collectives are in flight; an existing Transport keeps the mode it
/// was built with. Every rank of a group must set the same.
void set_device_collectives(DeviceCollectives mode);

/// The mode in force: the one set, else LATHER_DEVICE_COLLECTIVES (read once; a bad value throws
/// naming the variable), else automatic.
DeviceCollectives device_collectives();

namespace Impl {

/// Whether `ExecutionSpace` runs on CUDA (so that its instances have a stream NCCL can use) with
/// its memory in CUDA memory NCCL reads (device or unified, not host-pinned).
template <class ExecutionSpace>
inline constexpr bool cuda_execution =
#if defined(KOKKOS_ENABLE_CUDA)
    std::is_same_v<ExecutionSpace, Kokkos::Cuda> &&
    (std::is_same_v<typename ExecutionSpace::memory_space, Kokkos::CudaSpace> ||
     std::is_same_v<typename ExecutionSpace::memory_space, Kokkos::CudaUVMSpace>);
#else
    false;
#endif

/// NCCL's element types, as Lather names them (none: NCCL cannot reduce that type, e.g. the 16-bit
/// wire words, which NCCL would read as numbers).
enum class NcclType : std::int8_t { none, int8, uint8, int32, uint32, int64, uint64, float32, float64 };

template <class T>
constexpr NcclType nccl_type() {
  if constexpr (std::is_same_v<T, std::int8_t>) return NcclType::int8;
  if constexpr (std::is_same_v<T, std::uint8_t>) return NcclType::uint8;
  if constexpr (std::is_same_v<T, std::int32_t>) return NcclType::int32;
  if constexpr (std::is_same_v<T, std::uint32_t>) return NcclType::uint32;
  if constexpr (std::is_same_v<T, std::int64_t>) return NcclType::int64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return NcclType::uint64;
  if constexpr (std::is_same_v<T, float>) return NcclType::float32;
  if constexpr (std::is_same_v<T, double>) return NcclType::float64;
  return NcclType::none;
}

/// Collectives of Views of `ExecutionSpace` may go through NCCL in this build: moving data (any
/// element type) and reducing it (the element types NCCL reduces).
template <class ExecutionSpace>
inline constexpr bool nccl_moves = (LATHER_ENABLE_NCCL != 0) && (cuda_execution<ExecutionSpace>);
template <class ExecutionSpace, class T>
inline constexpr bool nccl_reduces = nccl_moves<ExecutionSpace> && (nccl_type<T>() != NcclType::none);

/// This rank's choice for Views of `ExecutionSpace`, and what NCCL needs of the caller's instance.
struct NcclChoice {
  bool wanted = false;     ///< NCCL, by the rule above
  bool required = false;   ///< the mode is `nccl`: falling back to MPI is an error
  void* stream = nullptr;  ///< the instance's cudaStream_t
  int device = -1;         ///< its CUDA device
};

/// The mode's choice for Views of `ExecutionSpace` (every build: a bad mode throws here).
template <class ExecutionSpace>
NcclChoice nccl_choice() {
  const DeviceCollectives mode = device_collectives();
  NcclChoice choice;
  choice.wanted = resolve_device_collectives(mode, LATHER_ENABLE_NCCL != 0, cuda_execution<ExecutionSpace>);
  choice.required = choice.wanted && mode == DeviceCollectives::nccl;
  return choice;
}

/// The cudaStream_t of a CUDA execution space instance (nullptr for any other space).
template <class ExecutionSpace>
void* cuda_stream([[maybe_unused]] const ExecutionSpace& space) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (cuda_execution<ExecutionSpace>) return static_cast<void*>(space.cuda_stream());
#endif
  return nullptr;
}

/// `choice` with the stream and device of `space`.
template <class ExecutionSpace>
NcclChoice on_instance(NcclChoice choice, [[maybe_unused]] const ExecutionSpace& space) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (cuda_execution<ExecutionSpace>) {
    choice.stream = static_cast<void*>(space.cuda_stream());
    choice.device = space.cuda_device();
  }
#endif
  return choice;
}

}  // namespace Impl

}  // namespace lather::comm
