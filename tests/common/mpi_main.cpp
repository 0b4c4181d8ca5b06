// main() of the tests that run under mpiexec: MPI and Kokkos live for the whole program, only rank
// 0 prints GoogleTest's report, and every rank exits with the same code (a failure on any rank
// fails the test everywhere).
#include <lather/comm/group.hpp>
#include <lather/comm/mpi_session.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <utility>

namespace {
/// Barriers around the whole run, so no rank starts or finishes alone.
class MpiEnvironment : public ::testing::Environment {
 public:
  explicit MpiEnvironment(lather::comm::Group world) : m_world(std::move(world)) {}
  void SetUp() override { m_world.barrier(); }
  void TearDown() override { m_world.barrier(); }

 private:
  lather::comm::Group m_world;
};
}  // namespace

int main(int argc, char** argv) {
  const lather::comm::MpiSession mpi(argc, argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    const lather::comm::Group world(MPI_COMM_WORLD);
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment(world));
    if (world.rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    status = world.allreduce(RUN_ALL_TESTS(), lather::comm::Combine::max);
  }
  return status;
}
