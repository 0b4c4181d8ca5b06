#pragma once
// How a rank waits for MPI (MPI builds only). MPICH's blocking calls spin on the CPU until their
// messages arrive. With no more ranks on a node than its CPUs that is the fastest wait there is,
// but on an oversubscribed node (more ranks than CPUs: a laptop, a CI runner, `mpiexec -n 4` on
// two cores) a spinning rank holds its CPU until the scheduler preempts it, while the rank it
// waits for cannot run: an MPI_Barrier there takes milliseconds, about a hundred times as long as
// when every wait yields the CPU between tests (docs/reference/collectives.md). So where the node
// is oversubscribed, Lather's collectives start their nonblocking form and test it, yielding the
// CPU after every test; elsewhere they make the blocking call.
//
// LATHER_COLLECTIVE_WAIT=spin or =yield forces one way; unset or `auto`, the Group constructors
// decide (each one counts the ranks on its node against the CPUs they may run on, and one
// oversubscribed count is enough for the process).

#include "mpi_check.hpp"

#include <lather/comm/node_occupancy.hpp>

#include <mpi.h>

#include <optional>

namespace lather::comm::Impl {

/// Collective over `comm`: its ranks on this rank's node and the CPUs they may run on.
NodeOccupancy node_occupancy(MPI_Comm comm);

/// Collective over `comm` (where the wait is decided automatically and no group has been found
/// oversubscribed yet; otherwise nothing): notes whether the ranks of `comm` on this node
/// outnumber the CPUs their affinity masks allow (once true, true for the process). Returns the
/// occupancy where it counted it.
std::optional<NodeOccupancy> note_node_occupancy(MPI_Comm comm);

/// True when this process's waits yield the CPU (see above).
bool yield_while_waiting();

/// Completes `count` requests, testing and yielding the CPU between tests.
void wait_yielding(MPI_Request* requests, int count, const char* call);

/// A blocking MPI call, or where waits yield, its nonblocking form started by `start(&request)`
/// and completed by wait_yielding. Both return an MPI status code.
template <class Blocking, class Start>
void complete(const char* call, Blocking&& blocking, Start&& start) {
  if (!yield_while_waiting()) {
    check_mpi(blocking(), call);
    return;
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(start(&request), call);
  wait_yielding(&request, 1, call);
}

}  // namespace lather::comm::Impl
