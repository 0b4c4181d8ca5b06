#pragma once
// A nonblocking transfer: point-to-point (Group::start_send, Group::start_receive) or collective
// (Group::start_barrier, start_allreduce, start_alltoall, start_allgatherv). wait() completes it,
// yielding the CPU between tests where the collectives do (src/comm/waiting.hpp). A Request
// destroyed before wait() completes it there: a receive is cancelled first, a send or a
// collective is waited for, so MPI never writes to or reads from a buffer its owner has freed. A
// collective cannot be cancelled: its owner's protocol must bring every rank of the group to it
// (GradientReducer's overlapped reduction starts every bucket on every rank, failed or not).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/config.hpp>

#if LATHER_ENABLE_MPI
#include <mpi.h>
#endif

#include <vector>

namespace lather::comm {

class Request {
 public:
  Request() = default;
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  /// Blocks until the transfer is complete; throws lather::Error with MPI's reason when it failed.
  /// Nothing to do for a Request that never started (or already completed).
  void wait();
  /// Lets MPI progress the transfer without blocking (MPI_Test): true once it is complete. A
  /// rank that computes for long between MPI calls tests its sends now and then, so that a large
  /// message, which MPI moves only inside MPI calls on both sides, reaches a receiver already
  /// waiting for it.
  bool test();
  /// True while a started transfer has not been waited for.
  bool active() const noexcept;

 private:
  friend class Group;
#if LATHER_ENABLE_MPI
  MPI_Request m_request = MPI_REQUEST_NULL;
#endif
  bool m_receive = false;
  const char* m_call = "MPI_Isend";  ///< the MPI call that started it, for error messages
  std::vector<int> m_arguments;      ///< counts and displacements MPI reads until completion
  void release() noexcept;
};

}  // namespace lather::comm
