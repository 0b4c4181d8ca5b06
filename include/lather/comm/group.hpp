#pragma once
// The ranks Lather communicates over. A Group owns a duplicate of an MPI communicator on which
// errors return instead of aborting (MPI_ERRORS_RETURN), and offers the collectives Lather's
// objects are built from; every MPI call in Lather goes through a Group (src/comm/group.cpp) or
// the agreement before a collective (src/comm/agreement.cpp), and every result is checked: a
// failing call throws lather::Error carrying MPI_Error_string.
//
// Copies of a Group share its communicator (freed with the last copy, never after
// MPI_Finalize). A default-constructed Group is one process on its own: every collective is a
// local copy and no MPI call is made, so code written against a Group runs unchanged in a build
// without MPI (LATHER_ENABLE_MPI=OFF) and in programs that never initialise MPI.
//
// Pointers handed to the collectives must be memory MPI can read: host memory, or device memory
// with a GPU-aware MPI (comm/device_mpi.hpp). The View overloads at the end stage device data
// through host buffers where MPI cannot read it, and in a build with NCCL hand the all-reduces and
// all-gathers of CUDA memory to NCCL (comm/device_collectives.hpp).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/device_collectives.hpp>
#include <lather/comm/device_mpi.hpp>
#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/hash.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/comm/node_occupancy.hpp>
#include <lather/comm/request.hpp>

#if LATHER_ENABLE_MPI
#include <mpi.h>
#endif

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lather::comm {

template <class ExecutionSpace, class T>
class Transport;

/// The element-wise operation of Group::allreduce.
enum class Combine { sum, min, max };

class Group {
 public:
  /// One process on its own (size 1, rank 0); needs no MPI.
  Group();
#if LATHER_ENABLE_MPI
  /// A duplicate of `comm` (MPI_Comm_dup: collective over `comm`) with MPI_ERRORS_RETURN. Implicit,
  /// so that MPI_COMM_WORLD can be passed wherever a Group is expected.
  Group(MPI_Comm comm);  // NOLINT(google-explicit-constructor)
  /// The duplicate itself, for libraries that take a communicator (parallel HDF5).
  MPI_Comm native() const;
#endif

  int size() const;
  int rank() const;
  /// False for a moved-from Group, or one returned by split() to a rank that joined no group.
  bool member() const noexcept;

  /// MPI_Comm_split: ranks passing the same color >= 0 form a group, ordered by key; a rank
  /// passing a negative color joins none (the result is not a member()). Collective.
  Group split(int color, int key) const;
  /// The rank in `other` of every rank of this group (-1 where a rank is not in `other`). Local.
  std::vector<int> ranks_in(const Group& other) const;

  // ---- collectives on memory MPI can read (counts in elements) ----------------------------------
  // T is one of char, std::int8_t, int, std::int64_t, std::uint16_t, std::uint32_t, std::uint64_t,
  // float, double (char moves bytes; reduce std::int8_t, not char). Counts of any size are split
  // into calls MPI's int counts can describe.

  void barrier() const;
  /// How many ranks of this group share this rank's node (memory): 1 for a local group.
  /// Collective, as node_occupancy().
  int ranks_on_node() const { return node_occupancy().ranks; }
  /// The ranks of this group on this rank's node and the CPUs they may run on. Collective the
  /// first time it is asked of a communicator (MPI_Comm_split_type; every rank asks at the same
  /// point), the answer kept for its copies after that.
  NodeOccupancy node_occupancy() const;
  /// values[0, count) := element-wise `op` over the group, in place.
  template <class T>
  void allreduce(T* values, std::size_t count, Combine op) const;
  /// receive[0, count) := element-wise `op` over the group of send[0, count) (no overlap).
  template <class T>
  void allreduce(const T* send, T* receive, std::size_t count, Combine op) const;
  template <class T>
  void allreduce(std::vector<T>& values, Combine op) const {
    allreduce(values.data(), values.size(), op);
  }
  /// One value: the group's sum, minimum or maximum of `value`.
  template <class T>
  T allreduce(T value, Combine op) const {
    allreduce(&value, 1, op);
    return value;
  }
  template <class T>
  void broadcast(T* values, std::size_t count, int root) const;
  /// text := root's text (its length first, then its characters).
  void broadcast(std::string& text, int root) const;
  /// receive[r * per_rank, (r + 1) * per_rank) := rank r's send[0, per_rank).
  template <class T>
  void allgather(const T* send, std::size_t per_rank, T* receive) const;
  /// Rank r contributes counts[r] elements; `receive` holds them all, rank 0's first. Every rank
  /// passes the same counts. `send` may point at this rank's place in `receive` (MPI_IN_PLACE).
  template <class T>
  void allgatherv(const T* send, T* receive, const std::vector<std::size_t>& counts) const;
  /// Every rank passes `send` of sum(counts) elements; rank r receives, in `receive`, the
  /// elementwise combination over the group of send[offset_r, offset_r + counts[r]), where
  /// offset_r is the sum of the counts before r (MPI_Reduce_scatter). Every rank passes the same
  /// counts; at most 2^31 - 1 elements in all. `send` may be `receive` (MPI_IN_PLACE): the input
  /// is read from it and this rank's result written at its start.
  template <class T>
  void reduce_scatter(const T* send, T* receive, const std::vector<std::size_t>& counts, Combine op) const;
  /// Rank r sends send[r * per_rank, (r + 1) * per_rank) to rank r.
  template <class T>
  void alltoall(const T* send, std::size_t per_rank, T* receive) const;
  /// Rank r receives send_counts[r] units (consecutive, in rank order) from this rank, and this
  /// rank receives receive_counts[r] units from rank r into `receive` in rank order; a unit is
  /// `unit_bytes` bytes (e.g. one row of an array).
  void alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* receive,
                 const std::vector<std::size_t>& receive_counts, std::size_t unit_bytes) const;
  template <class T>
  void send(const T* values, std::size_t count, int destination, int tag) const;
  template <class T>
  void receive(T* values, std::size_t count, int source, int tag) const;
  /// Nonblocking send and receive (MPI_Isend, MPI_Irecv) of at most 2^30 elements; the buffer must
  /// stay alive and untouched until the Request's wait() returns.
  template <class T>
  Request start_send(const T* values, std::size_t count, int destination, int tag) const;
  template <class T>
  Request start_receive(T* values, std::size_t count, int source, int tag) const;
  /// Nonblocking collectives (MPI_Ibarrier, MPI_Iallreduce in place, MPI_Ialltoall,
  /// MPI_Iallgatherv) of at most 2^30 elements (per rank, for the all-to-all; in all, for the
  /// all-gather), with the blocking forms' meaning: every rank of the group must start the same
  /// ones in the same order, and the buffers stay alive and untouched until wait() returns. On a
  /// local group they complete at once.
  Request start_barrier() const;
  template <class T>
  Request start_allreduce(T* values, std::size_t count, Combine op) const;
  template <class T>
  Request start_alltoall(const T* send, std::size_t per_rank, T* receive) const;
  template <class T>
  Request start_allgatherv(const T* send, T* receive, const std::vector<std::size_t>& counts) const;
  /// The same with rank r's values landing at receive + displacements[r] (any order, no overlap):
  /// pieces of several segments gathered in place. `send` may be receive + displacements[rank].
  template <class T>
  Request start_allgatherv(const T* send, T* receive, const std::vector<std::size_t>& counts,
                           const std::vector<std::size_t>& displacements) const;
  /// Sends `out` to `partner` and receives `in` from it (MPI_Sendrecv).
  template <class T>
  void exchange(const T* out, std::size_t out_count, T* in, std::size_t in_count, int partner, int tag) const;

  // ---- failure agreement --------------------------------------------------------------------------

  /// Collective: every rank learns whether any rank's `local_error` is non-empty. If one is, every
  /// rank throws the same lather::Error: "<context>: <message of the lowest failing rank> (on
  /// group rank k of n)". Ranks that succeeded need not know what failed elsewhere.
  void agree_on_failure(const std::string& context, const std::string& local_error) const;
  /// Runs `work` and agrees on its outcome: an exception on any rank becomes one on every rank.
  template <class Work>
  void run_agreed(const std::string& context, Work&& work) const {
    agree_on_failure(context, ::lather::Impl::local_failure(nullptr, std::forward<Work>(work)));
  }

  // ---- Views -----------------------------------------------------------------------------------------

  /// allreduce of a 1-D View of the execution space's memory, in place: handed to MPI directly
  /// where MPI can read that memory, else staged through a host copy made on `space`. CUDA memory
  /// goes through NCCL where comm/device_collectives.hpp says so (element types NCCL reduces),
  /// after the ranks agree over MPI on the path, the operation and the count.
  template <class ExecutionSpace, class T>
  void allreduce(const ExecutionSpace& space, const Kokkos::View<T*, typename ExecutionSpace::memory_space>& data,
                 Combine op) const;
  /// allgatherv of 1-D Views of the execution space's memory: handed to MPI in place where MPI
  /// can read that memory, else staged through host copies made on `space`. CUDA memory goes
  /// through NCCL where comm/device_collectives.hpp says so, after the ranks agree over MPI on the
  /// path and the counts (their arguments' faults too).
  template <class ExecutionSpace, class T>
  void allgatherv(const ExecutionSpace& space,
                  const Kokkos::View<const T*, typename ExecutionSpace::memory_space>& send,
                  const Kokkos::View<T*, typename ExecutionSpace::memory_space>& receive,
                  const std::vector<std::size_t>& counts) const;
  /// alltoallv of 1-D Views of the execution space's memory, counted in units of `unit`
  /// elements (one row of an array, say): handed to MPI in place where MPI can read that memory,
  /// else staged through host copies made on `space`.
  template <class ExecutionSpace, class T>
  void alltoallv(const ExecutionSpace& space, const Kokkos::View<const T*, typename ExecutionSpace::memory_space>& send,
                 const std::vector<std::size_t>& send_counts,
                 const Kokkos::View<T*, typename ExecutionSpace::memory_space>& receive,
                 const std::vector<std::size_t>& receive_counts, std::size_t unit) const;

 private:
  struct State;
  explicit Group(std::shared_ptr<State> state);
  const State& state() const;

  // ---- CUDA memory through NCCL (comm/device_collectives.hpp; src/comm/group_nccl.cpp) ----------
  // For the View overloads above and Transport. `stream` is an execution space instance's
  // cudaStream_t: the nccl_* transfers are enqueued on it and return at once (nccl_wait waits).
  // In a build without NCCL nothing calls them (they throw).
  template <class ExecutionSpace, class T>
  friend class Transport;
  /// Collective: whether this collective of CUDA memory goes through NCCL. Every rank passes its
  /// choice, `fields` (values every rank must pass alike: an operation, counts) and `local_error`
  /// (the fault of its own arguments); one Agreement over MPI makes a difference or a fault on any
  /// rank (or a failed NCCL communicator) the same lather::Error on every rank. Where the ranks
  /// want NCCL, the group's communicator is built by the first call (collective). False: take
  /// the MPI path (the ranks chose MPI, or share a device and the mode is `auto`).
  bool agree_on_nccl(const Impl::NcclChoice& choice, const std::string& context,
                     const std::vector<std::pair<std::string, std::int64_t>>& fields,
                     const std::string& local_error) const;
  /// ncclAllReduce of `count` elements (in place where send == receive).
  void nccl_allreduce(const void* send, void* receive, std::size_t count, Impl::NcclType type, Combine op,
                      void* stream) const;
  /// allgatherv's layout, moved as bytes: one ncclAllGather where the counts are equal, else one
  /// ncclBroadcast per rank with something to send, in one NCCL group.
  void nccl_allgatherv(const void* send, void* receive, const std::vector<std::size_t>& counts,
                       std::size_t element_bytes, void* stream) const;
  /// ncclSend of `out` and ncclRecv of `in`, with `partner`, in one NCCL group (exchange's meaning).
  void nccl_exchange(const void* out, std::size_t out_bytes, void* in, std::size_t in_bytes, int partner,
                     void* stream) const;
  /// Waits for `stream`, watching the communicator for NCCL's asynchronous errors (thrown on this
  /// rank, the communicator aborted).
  void nccl_wait(void* stream, const std::string& context) const;

  std::shared_ptr<State> m_state;
};

template <class ExecutionSpace, class T>
void Group::allreduce(const ExecutionSpace& space, const Kokkos::View<T*, typename ExecutionSpace::memory_space>& data,
                      Combine op) const {
  using memory_space = typename ExecutionSpace::memory_space;
  // On every build, so that a bad LATHER_DEVICE_COLLECTIVES is an error wherever it is set.
  [[maybe_unused]] const Impl::NcclChoice nccl = Impl::on_instance(Impl::nccl_choice<ExecutionSpace>(), space);
  if (size() == 1) return;
  if constexpr (Impl::nccl_reduces<ExecutionSpace, T>) {
    // Agreed even where every rank chose MPI: a rank on NCCL would wait for ever for one on MPI.
    const std::vector<std::pair<std::string, std::int64_t>> fields = {
        {"element type", std::int64_t(Impl::nccl_type<T>())},
        {"operation", std::int64_t(op)},
        {"element count", std::int64_t(data.extent(0))}};
    if (agree_on_nccl(nccl, "Group::allreduce", fields, std::string())) {
      if (data.extent(0) == 0) return;
      nccl_allreduce(data.data(), data.data(), data.extent(0), Impl::nccl_type<T>(), op, nccl.stream);
      nccl_wait(nccl.stream, "Group::allreduce");
      return;
    }
  }
  if (data.extent(0) == 0) return;
  if (mpi_reads_in_place<memory_space>()) {
    ::lather::Impl::fence(space, "Lather::comm::Group::allreduce: data ready before sending");
    allreduce(data.data(), data.extent(0), op);
  } else {
    Kokkos::View<T*, Kokkos::HostSpace> host(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::Group::allreduce::staging"), data.extent(0));
    Kokkos::deep_copy(space, host, data);
    ::lather::Impl::fence(space, "Lather::comm::Group::allreduce: staged data ready before sending");
    allreduce(host.data(), host.extent(0), op);
    Kokkos::deep_copy(space, data, host);
    ::lather::Impl::fence(space, "Lather::comm::Group::allreduce: result in place");
  }
}

template <class ExecutionSpace, class T>
void Group::allgatherv(const ExecutionSpace& space,
                       const Kokkos::View<const T*, typename ExecutionSpace::memory_space>& send,
                       const Kokkos::View<T*, typename ExecutionSpace::memory_space>& receive,
                       const std::vector<std::size_t>& counts) const {
  using memory_space = typename ExecutionSpace::memory_space;
  [[maybe_unused]] const Impl::NcclChoice nccl = Impl::on_instance(Impl::nccl_choice<ExecutionSpace>(), space);
  std::size_t total = 0;
  for (auto c : counts) total += c;
  const bool fits =
      int(counts.size()) == size() && counts[std::size_t(rank())] == send.extent(0) && receive.extent(0) >= total;
  const char* misfit = "counts do not match the group, this rank's View or the receiving View";
  if constexpr (Impl::nccl_moves<ExecutionSpace>) {
    ::lather::Impl::Fnv1a layout;
    for (auto c : counts) layout.add(std::uint64_t(c));
    const std::vector<std::pair<std::string, std::int64_t>> fields = {
        {"element size in bytes", std::int64_t(sizeof(T))},
        {"element count in all", std::int64_t(total)},
        {"hash of the counts", std::int64_t(layout.value())}};
    if (agree_on_nccl(nccl, "Group::allgatherv", fields, fits ? std::string() : std::string(misfit))) {
      nccl_allgatherv(send.data(), receive.data(), counts, sizeof(T), nccl.stream);
      nccl_wait(nccl.stream, "Group::allgatherv");
      return;
    }
  }
  LATHER_REQUIRE(fits, "Group::allgatherv: ", misfit);
  if (mpi_reads_in_place<memory_space>()) {
    ::lather::Impl::fence(space, "Lather::comm::Group::allgatherv: data ready before sending");
    allgatherv(send.data(), receive.data(), counts);
  } else {
    Kokkos::View<T*, Kokkos::HostSpace> send_host(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::Group::allgatherv::send"), send.extent(0));
    Kokkos::View<T*, Kokkos::HostSpace> receive_host(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::Group::allgatherv::staging"), total);
    Kokkos::deep_copy(space, send_host, send);
    ::lather::Impl::fence(space, "Lather::comm::Group::allgatherv: staged data ready before sending");
    allgatherv(send_host.data(), receive_host.data(), counts);
    Kokkos::deep_copy(space, Kokkos::subview(receive, std::make_pair(std::size_t(0), total)), receive_host);
    ::lather::Impl::fence(space, "Lather::comm::Group::allgatherv: received data in place");
  }
}

template <class ExecutionSpace, class T>
void Group::alltoallv(const ExecutionSpace& space,
                      const Kokkos::View<const T*, typename ExecutionSpace::memory_space>& send,
                      const std::vector<std::size_t>& send_counts,
                      const Kokkos::View<T*, typename ExecutionSpace::memory_space>& receive,
                      const std::vector<std::size_t>& receive_counts, std::size_t unit) const {
  using memory_space = typename ExecutionSpace::memory_space;
  std::size_t out = 0, in = 0;
  for (auto c : send_counts) out += c;
  for (auto c : receive_counts) in += c;
  LATHER_REQUIRE(int(send_counts.size()) == size() && int(receive_counts.size()) == size() &&
                     send.extent(0) >= out * unit && receive.extent(0) >= in * unit,
                 "Group::alltoallv: counts do not match the group, this rank's View or the receiving View");
  if (mpi_reads_in_place<memory_space>()) {
    ::lather::Impl::fence(space, "Lather::comm::Group::alltoallv: data ready before sending");
    alltoallv(send.data(), send_counts, receive.data(), receive_counts, unit * sizeof(T));
  } else {
    Kokkos::View<T*, Kokkos::HostSpace> send_host(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::Group::alltoallv::send"), out * unit);
    Kokkos::View<T*, Kokkos::HostSpace> receive_host(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::Group::alltoallv::staging"), in * unit);
    Kokkos::deep_copy(space, send_host, Kokkos::subview(send, std::make_pair(std::size_t(0), out * unit)));
    ::lather::Impl::fence(space, "Lather::comm::Group::alltoallv: staged data ready before sending");
    alltoallv(send_host.data(), send_counts, receive_host.data(), receive_counts, unit * sizeof(T));
    Kokkos::deep_copy(space, Kokkos::subview(receive, std::make_pair(std::size_t(0), in * unit)), receive_host);
    ::lather::Impl::fence(space, "Lather::comm::Group::alltoallv: received data in place");
  }
}

}  // namespace lather::comm
