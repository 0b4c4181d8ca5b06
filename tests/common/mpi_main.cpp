// main() of the tests that run under mpiexec: MPI and Kokkos live for the whole program, only rank
// 0 prints GoogleTest's report, and every rank exits with the same code (a failure on any rank
// fails the test everywhere).
#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

namespace {
/// Barriers around the whole run, so no rank starts or finishes alone.
class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { MPI_Barrier(MPI_COMM_WORLD); }
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    const int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return status;
}
