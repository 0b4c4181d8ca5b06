#pragma once
// Moving View data through MPI. Where MPI may touch the memory space (host memory, or a
// GPU-aware MPI declared at build time) the View's own pointer goes to MPI after a fence;
// otherwise every transfer is staged through host buffers in chunks of a fixed size, copied
// with deep_copy on the caller's execution space instance. Both sides of a point-to-point transfer
// use the same chunking (it is a function of the agreed options only), so messages always match.

#include "mpi_support.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace lather::comm::Impl {

/// Counters of what a collective object handed to MPI (for tests and benchmarks).
struct TransportCounters {
  long data_calls = 0;  ///< MPI calls carrying tensor data
  double bytes = 0;     ///< bytes of tensor data this rank sent or contributed
};

template <class ExecutionSpace, class T>
class Transport {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using view = Kokkos::View<T*, memory_space>;
  using const_view = Kokkos::View<const T*, memory_space>;
  using host_view = Kokkos::View<T*, Kokkos::HostSpace>;
  static constexpr bool direct = mpi_accessible<memory_space>;

  Transport() = default;
  /// `staging_elements`: chunk size of host-staged transfers (ignored where MPI reads in place).
  Transport(MPI_Comm comm, std::size_t staging_elements, std::string label)
      : m_comm(comm),
        m_chunk(direct ? max_mpi_count : std::max<std::size_t>(1, std::min(staging_elements, max_mpi_count))),
        m_label(std::move(label)) {}

  MPI_Comm comm() const { return m_comm; }
  TransportCounters& counters() { return m_counters; }
  const TransportCounters& counters() const { return m_counters; }

  /// data := sum over the communicator of data (in place), MPI_Allreduce per chunk.
  void allreduce_sum(const ExecutionSpace& space, const view& data) {
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      T* buffer = stage_out(space, data, begin, count, m_send);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, buffer, int(count), mpi_datatype<T>(), MPI_SUM, m_comm),
                "MPI_Allreduce");
      stage_in(space, data, begin, count, m_send);
      m_counters.data_calls += 1;
      m_counters.bytes += double(count) * sizeof(T);
    });
  }

  /// out := sum over the communicator of in (out of place; in and out must not overlap).
  void allreduce_sum(const ExecutionSpace& space, const view& in, const view& out) {
    for_chunks(in.extent(0), [&](std::size_t begin, std::size_t count) {
      T* send_buffer = stage_out(space, in, begin, count, m_send);
      T* receive_buffer_ = receive_buffer(space, out, begin, count, m_receive);
      check_mpi(MPI_Allreduce(send_buffer, receive_buffer_, int(count), mpi_datatype<T>(), MPI_SUM, m_comm),
                "MPI_Allreduce");
      stage_in(space, out, begin, count, m_receive);
      m_counters.data_calls += 1;
      m_counters.bytes += double(count) * sizeof(T);
    });
  }

  /// data := root's data, MPI_Bcast per chunk.
  void broadcast(const ExecutionSpace& space, const view& data, int root, int rank) {
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      T* buffer = rank == root ? stage_out(space, data, begin, count, m_send)
                               : receive_buffer(space, data, begin, count, m_send);
      check_mpi(MPI_Bcast(buffer, int(count), mpi_datatype<T>(), root, m_comm), "MPI_Bcast");
      if (rank != root) stage_in(space, data, begin, count, m_send);
      m_counters.data_calls += 1;
      m_counters.bytes += double(count) * sizeof(T);
    });
  }

  void send(const ExecutionSpace& space, const view& data, int destination, int tag) {
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      T* buffer = stage_out(space, data, begin, count, m_send);
      check_mpi(MPI_Send(buffer, int(count), mpi_datatype<T>(), destination, tag, m_comm), "MPI_Send");
      m_counters.data_calls += 1;
      m_counters.bytes += double(count) * sizeof(T);
    });
  }

  void receive(const ExecutionSpace& space, const view& data, int source, int tag) {
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      T* buffer = receive_buffer(space, data, begin, count, m_receive);
      check_mpi(MPI_Recv(buffer, int(count), mpi_datatype<T>(), source, tag, m_comm, MPI_STATUS_IGNORE),
                "MPI_Recv");
      stage_in(space, data, begin, count, m_receive);
    });
  }

  /// Sends `outgoing` to `partner` and receives `incoming` from it; the partner makes the mirror
  /// call, so its outgoing size is our incoming size. Chunk k of both directions travels together.
  void exchange(const ExecutionSpace& space, const view& outgoing, const view& incoming,
                int partner, int tag) {
    const std::size_t n_out = outgoing.extent(0), n_in = incoming.extent(0);
    const std::size_t chunks = std::max((n_out + m_chunk - 1) / m_chunk, (n_in + m_chunk - 1) / m_chunk);
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::size_t out_begin = std::min(n_out, k * m_chunk), in_begin = std::min(n_in, k * m_chunk);
      const std::size_t out_count = std::min(m_chunk, n_out - out_begin);
      const std::size_t in_count = std::min(m_chunk, n_in - in_begin);
      T* send_buffer = stage_out(space, outgoing, out_begin, out_count, m_send);
      T* receive_buffer_ = receive_buffer(space, incoming, in_begin, in_count, m_receive);
      check_mpi(MPI_Sendrecv(send_buffer, int(out_count), mpi_datatype<T>(), partner, tag,
                             receive_buffer_, int(in_count), mpi_datatype<T>(), partner, tag, m_comm,
                             MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
      stage_in(space, incoming, in_begin, in_count, m_receive);
      m_counters.data_calls += 1;
      m_counters.bytes += double(out_count) * sizeof(T);
    }
  }

  /// MPI_Alltoall of `per_rank` elements to every rank (sizes bounded by the caller: no chunking).
  void alltoall(const ExecutionSpace& space, const view& outgoing, const view& incoming,
                std::size_t per_rank) {
    const std::size_t total = outgoing.extent(0);
    T* send_buffer = stage_out(space, outgoing, 0, total, m_send);
    T* receive_buffer_ = receive_buffer(space, incoming, 0, incoming.extent(0), m_receive);
    check_mpi(MPI_Alltoall(send_buffer, int(per_rank), mpi_datatype<T>(), receive_buffer_,
                           int(per_rank), mpi_datatype<T>(), m_comm),
              "MPI_Alltoall");
    stage_in(space, incoming, 0, incoming.extent(0), m_receive);
    m_counters.data_calls += 1;
    m_counters.bytes += double(total) * sizeof(T);
  }

  /// MPI_Allgatherv: rank r's `mine` lands at all[displacements[r], + counts[r]).
  void allgatherv(const ExecutionSpace& space, const view& mine, const view& all,
                  const std::vector<int>& counts, const std::vector<int>& displacements) {
    T* send_buffer = stage_out(space, mine, 0, mine.extent(0), m_send);
    T* receive_buffer_ = receive_buffer(space, all, 0, all.extent(0), m_receive);
    check_mpi(MPI_Allgatherv(send_buffer, int(mine.extent(0)), mpi_datatype<T>(), receive_buffer_,
                             counts.data(), displacements.data(), mpi_datatype<T>(), m_comm),
              "MPI_Allgatherv");
    stage_in(space, all, 0, all.extent(0), m_receive);
    m_counters.data_calls += 1;
    m_counters.bytes += double(mine.extent(0)) * sizeof(T);
  }

  /// MPI_Allreduce with `op` over a small View (no chunking).
  void allreduce(const ExecutionSpace& space, const view& data, MPI_Op op) {
    T* buffer = stage_out(space, data, 0, data.extent(0), m_send);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, buffer, int(data.extent(0)), mpi_datatype<T>(), op, m_comm),
              "MPI_Allreduce");
    stage_in(space, data, 0, data.extent(0), m_send);
    m_counters.data_calls += 1;
    m_counters.bytes += double(data.extent(0)) * sizeof(T);
  }

 private:
  template <class Body>
  void for_chunks(std::size_t n, Body&& body) const {
    for (std::size_t begin = 0; begin < n; begin += m_chunk) body(begin, std::min(m_chunk, n - begin));
  }

  static auto range(std::size_t begin, std::size_t count) {
    return std::make_pair(begin, begin + count);
  }

  void ensure(host_view& host, std::size_t count) {
    if (host.extent(0) < count)
      host = host_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, m_label + "::host_staging"),
                       count);
  }

  /// Pointer MPI may read data[begin, begin + count) from, with the data ready.
  T* stage_out(const ExecutionSpace& space, const view& data, std::size_t begin, std::size_t count,
               host_view& host) {
    if constexpr (direct) {
      (void)host;
      fence(space, "Lather::comm: data ready before sending");
      return data.data() + begin;
    } else {
      ensure(host, count);
      Kokkos::deep_copy(space, Kokkos::subview(host, range(0, count)),
                        Kokkos::subview(data, range(begin, count)));
      fence(space, "Lather::comm: staged data ready before sending");
      return host.data();
    }
  }

  /// Pointer MPI may write data[begin, begin + count) to, with earlier work on it finished.
  T* receive_buffer(const ExecutionSpace& space, const view& data, std::size_t begin,
                    std::size_t count, host_view& host) {
    fence(space, "Lather::comm: buffer free before receiving");
    if constexpr (direct) {
      (void)host;
      (void)count;
      return data.data() + begin;
    } else {
      ensure(host, count);
      return host.data();
    }
  }

  void stage_in(const ExecutionSpace& space, const view& data, std::size_t begin, std::size_t count,
                host_view& host) {
    if constexpr (!direct) {
      Kokkos::deep_copy(space, Kokkos::subview(data, range(begin, count)),
                        Kokkos::subview(host, range(0, count)));
    } else {
      (void)space, (void)data, (void)begin, (void)count, (void)host;
    }
  }

  MPI_Comm m_comm = MPI_COMM_NULL;
  std::size_t m_chunk = max_mpi_count;
  std::string m_label;
  host_view m_send, m_receive;
  TransportCounters m_counters;
};

}  // namespace lather::comm::Impl
