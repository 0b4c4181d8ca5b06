#pragma once
// This process's rank and the number of ranks in MPI_COMM_WORLD, for the MPI tests of every area,
// and a barrier for ranks that wait while others work.

#include <mpi.h>

#include <unistd.h>

namespace lather::test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

/// A communicator of world ranks [0, n) (MPI_COMM_NULL on the others); collective over the world.
inline MPI_Comm first_ranks(int n) {
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &comm);
  return comm;
}

/// A barrier over the world that sleeps between polls: ranks that wait for a run on fewer ranks
/// leave it their cores. MPICH's blocking calls poll without yielding, and even a yielding wait
/// takes a core from the run on an oversubscribed machine (7 ranks waiting in MPI_Comm_split made
/// a 1-rank training run ten times slower on 2 cores).
inline void sleeping_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    usleep(1000);
  }
}

}  // namespace lather::test
