#pragma once
// MPI plumbing shared by the collectives: datatypes from value types, error checks, and whether
// MPI may touch a memory space directly.

#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

namespace lather::comm::Impl {

using ::lather::Impl::fence;
using ::lather::Impl::host_accessible;
using ::lather::Impl::mpi_accessible;
using ::lather::Impl::ScopedRegion;

/// Largest element count handed to one MPI call: counts are `int`.
inline constexpr std::size_t max_mpi_count = std::size_t(1) << 30;

inline void check_mpi(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(status, text, &length);
  LATHER_FAIL(call, " failed: ", std::string(text, std::size_t(length)));
}

template <class T>
MPI_Datatype mpi_datatype();
template <>
inline MPI_Datatype mpi_datatype<float>() { return MPI_FLOAT; }
template <>
inline MPI_Datatype mpi_datatype<double>() { return MPI_DOUBLE; }
template <>
inline MPI_Datatype mpi_datatype<int>() { return MPI_INT; }
template <>
inline MPI_Datatype mpi_datatype<std::int64_t>() { return MPI_INT64_T; }
template <>
inline MPI_Datatype mpi_datatype<std::uint16_t>() { return MPI_UINT16_T; }
template <>
inline MPI_Datatype mpi_datatype<std::uint32_t>() { return MPI_UINT32_T; }
template <>
inline MPI_Datatype mpi_datatype<std::uint64_t>() { return MPI_UINT64_T; }

/// A 64-bit FNV-1a hash, for signatures of size lists.
inline std::uint64_t fnv1a(std::uint64_t hash, std::uint64_t value) {
  for (int byte = 0; byte < 8; ++byte) {
    hash ^= (value >> (8 * byte)) & 0xffu;
    hash *= 1099511628211ull;
  }
  return hash;
}
inline constexpr std::uint64_t fnv1a_start = 1469598103934665603ull;

}  // namespace lather::comm::Impl
