#pragma once
// This process's rank and the number of ranks in MPI_COMM_WORLD, for the MPI tests of every area.

#include <mpi.h>

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

}  // namespace lather::test
