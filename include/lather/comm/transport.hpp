#pragma once
// Moving View data through a Group. Where MPI may touch the memory (host memory, or device memory
// with a GPU-aware MPI: comm/device_mpi.hpp) the View's own pointer goes to MPI after a fence;
// otherwise every transfer is staged through host buffers, copied with deep_copy on the caller's
// execution space instance. Device memory moves in chunks of a fixed size either way, host
// memory in one piece: both sides of a point-to-point transfer use the same chunking (a function
// of the memory space and the agreed options only, not of whether this rank stages), so messages
// always match.
//
// In a build with NCCL, the all-reduces, all-gathers and exchanges of CUDA memory go through NCCL
// where comm/device_collectives.hpp says so (decided with the group: through_nccl()), chunk for
// chunk as through MPI, enqueued on the caller's instance and not waited for: what follows on
// that instance sees the result, as it sees a staged copy's.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/device_collectives.hpp>
#include <lather/comm/device_mpi.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <lather/comm/group.hpp>
#include <lather/comm/request.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace lather::comm {

/// Counters of what a collective object handed to MPI (for tests and benchmarks).
struct TransportCounters {
  long data_calls = 0;  ///< MPI (or NCCL) calls carrying tensor data
  double bytes = 0;     ///< bytes of tensor data this rank sent or contributed
  long nccl_calls = 0;  ///< of data_calls, those made through NCCL
};

template <class ExecutionSpace, class T>
class Transport {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using view = Kokkos::View<T*, memory_space>;
  using host_view = Kokkos::View<T*, Kokkos::HostSpace>;
  /// Host-staged transfers never move more than this many elements at once.
  static constexpr std::size_t max_chunk = std::size_t(1) << 30;

  Transport() = default;
  /// `staging_elements`: chunk size of transfers of device memory (host memory moves whole).
  Transport(Group group, std::size_t staging_elements, std::string label)
      : m_group(std::move(group)),
        m_direct(mpi_reads_in_place<memory_space>()),
        m_nccl_choice(Impl::nccl_choice<ExecutionSpace>()),
        m_chunk(::lather::Impl::host_accessible<memory_space>
                    ? max_chunk
                    : std::max<std::size_t>(1, std::min(staging_elements, max_chunk))),
        m_label(std::move(label)) {}

  const Group& group() const { return m_group; }
  TransportCounters& counters() { return m_counters; }
  const TransportCounters& counters() const { return m_counters; }

  /// Whether this Transport's all-reduces, all-gathers and exchanges go through NCCL
  /// (comm/device_collectives.hpp), decided once with the group by the first call that asks, which
  /// is collective: the blocking all-reduces and all-gathers ask (every rank of the group makes
  /// them at the same point), and GradientReducer asks before it moves data. The nonblocking forms
  /// and the exchanges, which are not all the group's, take NCCL once it has been decided, MPI
  /// before. False for memory that is not CUDA's, and in builds without NCCL.
  bool through_nccl(const ExecutionSpace& space) {
    if constexpr (Impl::nccl_moves<ExecutionSpace>) {
      if (m_nccl < 0)
        m_nccl = m_group.agree_on_nccl(Impl::on_instance(m_nccl_choice, space), m_label + " (NCCL or MPI)", {},
                                       std::string())
                     ? 1
                     : 0;
      return m_nccl == 1;
    } else {
      (void)space;
      return false;
    }
  }

  /// data := `op` over the group of data (in place), one allreduce per chunk.
  void allreduce(const ExecutionSpace& space, const view& data, Combine op = Combine::sum) {
    if constexpr (Impl::nccl_reduces<ExecutionSpace, T>) {
      if (through_nccl(space)) {
        for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
          m_group.nccl_allreduce(data.data() + begin, data.data() + begin, count, Impl::nccl_type<T>(), op,
                                 Impl::cuda_stream(space));
          count_call(count, true);
        });
        return;
      }
    }
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      T* buffer = stage_out(space, data, begin, count, m_send);
      m_group.allreduce(buffer, count, op);
      stage_in(space, data, begin, count, m_send);
      count_call(count);
    });
  }

  /// out := sum over the group of in (out of place; in and out must not overlap).
  void allreduce_sum(const ExecutionSpace& space, const view& in, const view& out) {
    if constexpr (Impl::nccl_reduces<ExecutionSpace, T>) {
      if (through_nccl(space)) {
        for_chunks(in.extent(0), [&](std::size_t begin, std::size_t count) {
          m_group.nccl_allreduce(in.data() + begin, out.data() + begin, count, Impl::nccl_type<T>(), Combine::sum,
                                 Impl::cuda_stream(space));
          count_call(count, true);
        });
        return;
      }
    }
    for_chunks(in.extent(0), [&](std::size_t begin, std::size_t count) {
      T* send_buffer = stage_out(space, in, begin, count, m_send);
      T* receive_buffer_ = receive_buffer(space, out, begin, count, m_receive);
      m_group.allreduce(send_buffer, receive_buffer_, count, Combine::sum);
      stage_in(space, out, begin, count, m_receive);
      count_call(count);
    });
  }

  /// data := root's data, one broadcast per chunk.
  void broadcast(const ExecutionSpace& space, const view& data, int root) {
    const bool sends = m_group.rank() == root;
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      T* buffer =
          sends ? stage_out(space, data, begin, count, m_send) : receive_buffer(space, data, begin, count, m_send);
      m_group.broadcast(buffer, count, root);
      if (!sends) stage_in(space, data, begin, count, m_send);
      count_call(count);
    });
  }

  void send(const ExecutionSpace& space, const view& data, int destination, int tag) {
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      m_group.send(stage_out(space, data, begin, count, m_send), count, destination, tag);
      count_call(count);
    });
  }

  void receive(const ExecutionSpace& space, const view& data, int source, int tag) {
    for_chunks(data.extent(0), [&](std::size_t begin, std::size_t count) {
      m_group.receive(receive_buffer(space, data, begin, count, m_receive), count, source, tag);
      stage_in(space, data, begin, count, m_receive);
    });
  }

  /// Sends `outgoing` to `partner` and receives `incoming` from it; the partner makes the mirror
  /// call, so its outgoing size is our incoming size. Chunk k of both directions travels together.
  void exchange(const ExecutionSpace& space, const view& outgoing, const view& incoming, int partner, int tag) {
    const std::size_t n_out = outgoing.extent(0), n_in = incoming.extent(0);
    const std::size_t chunks = std::max((n_out + m_chunk - 1) / m_chunk, (n_in + m_chunk - 1) / m_chunk);
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::size_t out_begin = std::min(n_out, k * m_chunk), in_begin = std::min(n_in, k * m_chunk);
      const std::size_t out_count = std::min(m_chunk, n_out - out_begin);
      const std::size_t in_count = std::min(m_chunk, n_in - in_begin);
      if (nccl_decided()) {
        m_group.nccl_exchange(outgoing.data() + out_begin, out_count * sizeof(T), incoming.data() + in_begin,
                              in_count * sizeof(T), partner, Impl::cuda_stream(space));
        count_call(out_count, true);
        continue;
      }
      T* send_buffer = stage_out(space, outgoing, out_begin, out_count, m_send);
      T* receive_buffer_ = receive_buffer(space, incoming, in_begin, in_count, m_receive);
      m_group.exchange(send_buffer, out_count, receive_buffer_, in_count, partner, tag);
      stage_in(space, incoming, in_begin, in_count, m_receive);
      count_call(out_count);
    }
  }

  /// Alltoall of `per_rank` elements to every rank (sizes bounded by the caller: no chunking).
  void alltoall(const ExecutionSpace& space, const view& outgoing, const view& incoming, std::size_t per_rank) {
    const std::size_t total = outgoing.extent(0);
    T* send_buffer = stage_out(space, outgoing, 0, total, m_send);
    T* receive_buffer_ = receive_buffer(space, incoming, 0, incoming.extent(0), m_receive);
    m_group.alltoall(send_buffer, per_rank, receive_buffer_);
    stage_in(space, incoming, 0, incoming.extent(0), m_receive);
    count_call(total);
  }

  /// Allgatherv: rank r's `mine` lands at all[sum of counts before r, + counts[r]).
  void allgatherv(const ExecutionSpace& space, const view& mine, const view& all,
                  const std::vector<std::size_t>& counts) {
    if (through_nccl(space)) {
      m_group.nccl_allgatherv(mine.data(), all.data(), counts, sizeof(T), Impl::cuda_stream(space));
      count_call(mine.extent(0), true);
      return;
    }
    T* send_buffer = stage_out(space, mine, 0, mine.extent(0), m_send);
    T* receive_buffer_ = receive_buffer(space, all, 0, all.extent(0), m_receive);
    m_group.allgatherv(send_buffer, receive_buffer_, counts);
    stage_in(space, all, 0, all.extent(0), m_receive);
    count_call(mine.extent(0));
  }

  // ---- nonblocking forms, one transfer in flight at a time per Transport (one set of host
  // staging buffers): start_* hands the data to MPI (staged out first where MPI cannot read it)
  // and returns the Requests; once they complete, finish_* brings a staged result into place.
  // At most chunk() elements per call (per rank for the all-to-all).

  /// Elements of one transfer: the blocking calls above split larger Views into chunks of this.
  std::size_t chunk() const { return m_chunk; }

  /// allreduce() of one chunk, in place.
  Request start_allreduce(const ExecutionSpace& space, const view& data, Combine op = Combine::sum) {
    require_chunk(data.extent(0), "start_allreduce");
    m_in_flight_nccl = false;
    if constexpr (Impl::nccl_reduces<ExecutionSpace, T>) {
      if (nccl_decided()) {
        m_group.nccl_allreduce(data.data(), data.data(), data.extent(0), Impl::nccl_type<T>(), op,
                               Impl::cuda_stream(space));
        count_call(data.extent(0), true);
        m_in_flight_nccl = true;
        return Request();  // nothing for MPI to complete: the instance's stream orders what follows
      }
    }
    T* buffer = stage_out(space, data, 0, data.extent(0), m_send);
    count_call(data.extent(0));
    return m_group.start_allreduce(buffer, data.extent(0), op);
  }
  void finish_allreduce(const ExecutionSpace& space, const view& data) {
    if (!m_in_flight_nccl) stage_in(space, data, 0, data.extent(0), m_send);
  }

  /// exchange() of one chunk each way: the receive, then the send.
  std::vector<Request> start_exchange(const ExecutionSpace& space, const view& outgoing, const view& incoming,
                                      int partner, int tag) {
    require_chunk(std::max(outgoing.extent(0), incoming.extent(0)), "start_exchange");
    m_in_flight_nccl = nccl_decided();
    if (m_in_flight_nccl) {
      m_group.nccl_exchange(outgoing.data(), outgoing.extent(0) * sizeof(T), incoming.data(),
                            incoming.extent(0) * sizeof(T), partner, Impl::cuda_stream(space));
      count_call(outgoing.extent(0), true);
      return {};
    }
    T* send_buffer = stage_out(space, outgoing, 0, outgoing.extent(0), m_send);
    T* receive_buffer_ = receive_buffer(space, incoming, 0, incoming.extent(0), m_receive);
    std::vector<Request> requests;
    requests.push_back(m_group.start_receive(receive_buffer_, incoming.extent(0), partner, tag));
    requests.push_back(m_group.start_send(send_buffer, outgoing.extent(0), partner, tag));
    count_call(outgoing.extent(0));
    return requests;
  }
  void finish_exchange(const ExecutionSpace& space, const view& incoming) {
    if (!m_in_flight_nccl) stage_in(space, incoming, 0, incoming.extent(0), m_receive);
  }

  /// alltoall() (per_rank elements to every rank).
  Request start_alltoall(const ExecutionSpace& space, const view& outgoing, const view& incoming,
                         std::size_t per_rank) {
    T* send_buffer = stage_out(space, outgoing, 0, outgoing.extent(0), m_send);
    T* receive_buffer_ = receive_buffer(space, incoming, 0, incoming.extent(0), m_receive);
    count_call(outgoing.extent(0));
    return m_group.start_alltoall(send_buffer, per_rank, receive_buffer_);
  }
  void finish_alltoall(const ExecutionSpace& space, const view& incoming) {
    stage_in(space, incoming, 0, incoming.extent(0), m_receive);
  }

  /// allgatherv().
  Request start_allgatherv(const ExecutionSpace& space, const view& mine, const view& all,
                           const std::vector<std::size_t>& counts) {
    m_in_flight_nccl = nccl_decided();
    if (m_in_flight_nccl) {
      m_group.nccl_allgatherv(mine.data(), all.data(), counts, sizeof(T), Impl::cuda_stream(space));
      count_call(mine.extent(0), true);
      return Request();
    }
    T* send_buffer = stage_out(space, mine, 0, mine.extent(0), m_send);
    T* receive_buffer_ = receive_buffer(space, all, 0, all.extent(0), m_receive);
    count_call(mine.extent(0));
    return m_group.start_allgatherv(send_buffer, receive_buffer_, counts);
  }
  void finish_allgatherv(const ExecutionSpace& space, const view& all) {
    if (!m_in_flight_nccl) stage_in(space, all, 0, all.extent(0), m_receive);
  }

 private:
  void require_chunk(std::size_t count, const char* call) const {
    LATHER_REQUIRE(count <= m_chunk, "Transport::", call, ": ", count, " elements; at most ", m_chunk, " at once");
  }

  template <class Body>
  void for_chunks(std::size_t n, Body&& body) const {
    for (std::size_t begin = 0; begin < n; begin += m_chunk) body(begin, std::min(m_chunk, n - begin));
  }

  void count_call(std::size_t elements, bool nccl = false) {
    m_counters.data_calls += 1;
    m_counters.bytes += double(elements) * sizeof(T);
    m_counters.nccl_calls += nccl ? 1 : 0;
  }

  /// NCCL decided on for this Transport (by a collective through_nccl() before).
  bool nccl_decided() const { return Impl::nccl_moves<ExecutionSpace> && m_nccl == 1; }

  static auto range(std::size_t begin, std::size_t count) { return std::make_pair(begin, begin + count); }

  void ensure(host_view& host, std::size_t count) {
    if (host.extent(0) < count)
      host = host_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, m_label + "::host_staging"), count);
  }

  /// Pointer MPI may read data[begin, begin + count) from, with the data ready.
  T* stage_out(const ExecutionSpace& space, const view& data, std::size_t begin, std::size_t count, host_view& host) {
    if (m_direct) {
      (void)host;
      ::lather::Impl::fence(space, "Lather::comm: data ready before sending");
      return data.data() + begin;
    } else {
      ensure(host, count);
      Kokkos::deep_copy(space, Kokkos::subview(host, range(0, count)), Kokkos::subview(data, range(begin, count)));
      ::lather::Impl::fence(space, "Lather::comm: staged data ready before sending");
      return host.data();
    }
  }

  /// Pointer MPI may write data[begin, begin + count) to, with earlier work on it finished.
  T* receive_buffer(const ExecutionSpace& space, const view& data, std::size_t begin, std::size_t count,
                    host_view& host) {
    ::lather::Impl::fence(space, "Lather::comm: buffer free before receiving");
    if (m_direct) {
      (void)host, (void)count;
      return data.data() + begin;
    } else {
      ensure(host, count);
      return host.data();
    }
  }

  void stage_in(const ExecutionSpace& space, const view& data, std::size_t begin, std::size_t count, host_view& host) {
    if (!m_direct) {
      Kokkos::deep_copy(space, Kokkos::subview(data, range(begin, count)), Kokkos::subview(host, range(0, count)));
    } else {
      (void)space, (void)data, (void)begin, (void)count, (void)host;
    }
  }

  Group m_group;
  /// MPI reads and writes the Views in place (else host staging): taken once at construction, so
  /// that a start_* and its finish_* take the same path even if comm::set_device_mpi is called
  /// between them.
  bool m_direct = true;
  /// This rank's choice of NCCL, taken at construction as m_direct is; m_nccl: the group's
  /// decision (-1 until through_nccl() first asks, then 0 or 1, for good).
  Impl::NcclChoice m_nccl_choice;
  int m_nccl = -1;
  /// The nonblocking transfer in flight went through NCCL: its finish_* has nothing to copy.
  bool m_in_flight_nccl = false;
  std::size_t m_chunk = max_chunk;
  std::string m_label;
  host_view m_send, m_receive;
  TransportCounters m_counters;
};

}  // namespace lather::comm
