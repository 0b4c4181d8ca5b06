#pragma once
// What the files of comm::Group share (group.cpp: the blocking collectives; group_requests.cpp:
// the ones that return a Request): a group's state, and Lather's types and counts as MPI takes
// them.

#include <lather/comm/group.hpp>

#if LATHER_ENABLE_MPI
#include "mpi_check.hpp"
#endif

#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lather::comm {

namespace Impl {
class NcclCommunicator;  // src/comm/nccl_communicator.hpp (NCCL builds)
}

// A group is a communicator we own (MPI builds) or one process on its own (`local`): then every
// collective is a copy and MPI is never called, so a Group works before MPI_Init and without MPI.
struct Group::State {
#if LATHER_ENABLE_MPI
  MPI_Comm comm = MPI_COMM_NULL;
#endif
  int size = 1, rank = 0;
  bool local = true;
  // Counted once per communicator (MPI_Comm_split_type and an allgather: up to a tenth of a second
  // where ranks outnumber cores), by the first to ask.
  mutable std::optional<NodeOccupancy> occupancy;
  // NCCL builds (src/comm/group_nccl.cpp): the group's NCCL communicator, built by the first
  // collective of CUDA memory that goes through NCCL, or why NCCL cannot serve the group (ranks
  // sharing a device), found by that first one. A shared_ptr: its deleter is fixed where it is
  // made, so this header needs no NCCL.
  mutable std::shared_ptr<Impl::NcclCommunicator> nccl;
  mutable std::string nccl_unusable;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    nccl.reset();  // before its MPI communicator, as it was made after it
#if LATHER_ENABLE_MPI
    if (comm == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm);  // nothing to report from a destructor
#endif
  }
};

namespace Impl {

/// MPI counts are int: pieces of at most this many elements per call.
constexpr std::size_t max_count = std::size_t(1) << 30;

/// Counts and displacements as MPI takes them, refusing what int cannot hold.
inline std::pair<std::vector<int>, std::vector<int>> int_counts(const std::vector<std::size_t>& counts,
                                                                const char* call) {
  std::vector<int> count(counts.size()), displacement(counts.size());
  std::size_t at = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    LATHER_REQUIRE(counts[r] <= std::size_t(INT_MAX) && at <= std::size_t(INT_MAX), call, ": ", counts[r],
                   " elements at offset ", at, " exceed what MPI's int counts describe");
    count[r] = int(counts[r]);
    displacement[r] = int(at);
    at += counts[r];
  }
  return {std::move(count), std::move(displacement)};
}

#if LATHER_ENABLE_MPI
template <class T>
MPI_Datatype datatype();
template <>
inline MPI_Datatype datatype<char>() {
  return MPI_BYTE;
}
template <>
inline MPI_Datatype datatype<std::int8_t>() {
  return MPI_INT8_T;
}
template <>
inline MPI_Datatype datatype<int>() {
  return MPI_INT;
}
template <>
inline MPI_Datatype datatype<std::int64_t>() {
  return MPI_INT64_T;
}
template <>
inline MPI_Datatype datatype<std::uint16_t>() {
  return MPI_UINT16_T;
}
template <>
inline MPI_Datatype datatype<std::uint32_t>() {
  return MPI_UINT32_T;
}
template <>
inline MPI_Datatype datatype<std::uint64_t>() {
  return MPI_UINT64_T;
}
template <>
inline MPI_Datatype datatype<float>() {
  return MPI_FLOAT;
}
template <>
inline MPI_Datatype datatype<double>() {
  return MPI_DOUBLE;
}

inline MPI_Op operation(Combine op) {
  switch (op) {
    case Combine::sum:
      return MPI_SUM;
    case Combine::min:
      return MPI_MIN;
    case Combine::max:
      return MPI_MAX;
  }
  return MPI_SUM;
}
#endif

}  // namespace Impl

// The Group's files call them unqualified, as members of comm.
using Impl::int_counts;
using Impl::max_count;
#if LATHER_ENABLE_MPI
using Impl::datatype;
using Impl::operation;
#endif

}  // namespace lather::comm
