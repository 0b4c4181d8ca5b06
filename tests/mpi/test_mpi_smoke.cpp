// The MPI launch itself: every rank sees the same world and a sum over ranks is the closed form.
#include <gtest/gtest.h>
#include <mpi.h>

TEST(MpiSmoke, AllreduceSumOfRanksIsClosedForm) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long sum = 0, mine = rank;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, long(size) * (size - 1) / 2);
}
