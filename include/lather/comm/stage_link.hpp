#pragma once
// Point-to-point transfers between neighbouring pipeline stages: activations forward to the next
// stage, their gradients back to the previous one, over Mesh::pipeline() (each shard of a stage
// talks only to the same shard of its neighbours).
//
// Every transfer is two messages on one tag: a status word, then, when the status says so, the
// payload. The status carries the element count (checked against what the receiver expects) or
// `failed`: a rank whose work failed, or that received a failure, still sends a status for every
// transfer of its schedule, so its neighbours never wait for a message that will not come, and
// the failure travels along the pipeline to every stage; the ranks then agree on it once
// (Group::agree_on_failure) at the end of the schedule. Sends are nonblocking (the data must stay
// unchanged until the Outgoing is waited for); receives block. MPI keeps the order of messages
// on one tag between two ranks, and each direction carries the micro-batches in order, so a tag
// per direction is enough.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/device_mpi.hpp>
#include <lather/comm/mesh.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>

namespace lather::comm {

enum class StageDirection { forward, backward };

template <class ExecutionSpace, class T>
class StageLink {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using view = Kokkos::View<T*, memory_space>;
  using host_view = Kokkos::View<T*, Kokkos::HostSpace>;
  static constexpr std::int64_t failed = -1;

  /// A send in flight: its status and payload requests and, where MPI cannot read the memory
  /// space, the host copy it sends from.
  struct Outgoing {
    std::int64_t status = 0;
    Request status_request, payload_request;
    host_view staging;
    void wait() {
      status_request.wait();
      payload_request.wait();
    }
    /// Progress without blocking (Request::test); true when both messages are sent.
    bool test() {
      const bool status_sent = status_request.test();
      return payload_request.test() && status_sent;
    }
  };

  StageLink() = default;
  explicit StageLink(const Mesh& mesh) : m_pipeline(mesh.pipeline()), m_stage(mesh.stage()) {}

  int stage() const { return m_stage; }
  int stages() const { return m_pipeline.size(); }

  /// Starts sending `data` to the neighbour in `direction` (the next stage forward, the previous
  /// one backward), or only a failed status when `ok` is false. Fences `space` first.
  void start_send(const ExecutionSpace& space, StageDirection direction, const view& data, bool ok, Outgoing& out) {
    out.wait();
    const int to = neighbour(direction);
    out.status = ok ? std::int64_t(data.extent(0)) : failed;
    const T* payload = data.data();
    if (ok) {
      if (mpi_reads_in_place<memory_space>()) {
        ::lather::Impl::fence(space, "Lather::comm::StageLink: data ready before sending");
      } else {
        if (out.staging.extent(0) < data.extent(0))
          out.staging =
              host_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::StageLink::send"), data.extent(0));
        const auto into = Kokkos::subview(out.staging, std::make_pair(std::size_t(0), data.extent(0)));
        Kokkos::deep_copy(space, into, data);
        ::lather::Impl::fence(space, "Lather::comm::StageLink: staged data ready before sending");
        payload = out.staging.data();
      }
    }
    out.status_request = m_pipeline.start_send(&out.status, 1, to, tag(direction));
    if (ok) out.payload_request = m_pipeline.start_send(payload, data.extent(0), to, tag(direction));
  }

  /// Receives into `into` from the neighbour the data comes from in `direction` (the previous
  /// stage forward, the next one backward). Returns false, leaving `into` unchanged, when that
  /// neighbour sent a failed status; throws when it sent a different element count (which the
  /// caller treats as a local failure). With `keep` false (a rank that failed already and must
  /// still take its neighbour's messages) the payload is received and dropped.
  bool receive(const ExecutionSpace& space, StageDirection direction, const view& into, bool keep = true) {
    const int from =
        neighbour(direction == StageDirection::forward ? StageDirection::backward : StageDirection::forward);
    std::int64_t status = 0;
    m_pipeline.start_receive(&status, 1, from, tag(direction)).wait();
    if (status == failed) return false;
    const std::size_t count = into.extent(0);
    // The count is sent before the payload, so a mismatch is found before the payload's receive
    // (which would fail or truncate). A payload not kept, or of another size, is taken into a
    // scratch buffer and dropped.
    if (!keep || status != std::int64_t(count)) {
      host_view sink(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::StageLink::sink"),
                     std::size_t(std::max<std::int64_t>(status, 0)));
      m_pipeline.start_receive(sink.data(), sink.extent(0), from, tag(direction)).wait();
      LATHER_REQUIRE(!keep, "StageLink: stage ", from, " sent ", status, " elements, stage ", m_stage, " expected ",
                     count);
      return true;
    }
    if (mpi_reads_in_place<memory_space>()) {
      m_pipeline.start_receive(into.data(), count, from, tag(direction)).wait();
    } else {
      if (m_receive.extent(0) < count)
        m_receive = host_view(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::StageLink::receive"), count);
      m_pipeline.start_receive(m_receive.data(), count, from, tag(direction)).wait();
      Kokkos::deep_copy(space, into, Kokkos::subview(m_receive, std::make_pair(std::size_t(0), count)));
    }
    return true;
  }

 private:
  Group m_pipeline;
  int m_stage = 0;
  host_view m_receive;

  int neighbour(StageDirection direction) const {
    const int to = direction == StageDirection::forward ? m_stage + 1 : m_stage - 1;
    LATHER_REQUIRE(to >= 0 && to < m_pipeline.size(), "StageLink: stage ", m_stage, " of ", m_pipeline.size(),
                   " has no ", direction == StageDirection::forward ? "next" : "previous", " stage");
    return to;
  }
  static int tag(StageDirection direction) { return direction == StageDirection::forward ? 71 : 72; }
};

}  // namespace lather::comm
