// Whether collectives hand MPI device memory in place or stage it (comm/device_mpi.hpp): the rule
// against its truth table, the modes' names, host memory in place whatever the mode, and the
// collectives of Views giving the same bits both ways (on a device the two paths differ: device
// pointers to MPI, or host copies; on a host build both hand MPI the View's own memory).
#include <lather/comm/device_mpi.hpp>
#include <lather/comm/transport.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using lather::comm::DeviceMpi;
using lather::comm::MpiDeviceSupport;
using namespace lather::test;

/// Puts the automatic mode back when a test ends, whatever it set.
struct AutomaticAfterwards {
  ~AutomaticAfterwards() { lather::comm::set_device_mpi(DeviceMpi::automatic); }
};

TEST(DeviceMpi, TheModeWinsThenTheBuildThenTheLibrary) {
  using lather::comm::resolve_device_mpi;
  for (bool build : {false, true})
    for (auto library : {MpiDeviceSupport::yes, MpiDeviceSupport::no, MpiDeviceSupport::unknown}) {
      EXPECT_TRUE(resolve_device_mpi(DeviceMpi::direct, build, library));
      EXPECT_FALSE(resolve_device_mpi(DeviceMpi::staged, build, library));
      EXPECT_EQ(resolve_device_mpi(DeviceMpi::automatic, build, library), build || library == MpiDeviceSupport::yes)
          << "build " << build << ", library " << int(library);
    }
}

TEST(DeviceMpi, ModesHaveNamesAndABadOneIsNamed) {
  for (auto mode : {DeviceMpi::automatic, DeviceMpi::direct, DeviceMpi::staged})
    EXPECT_EQ(lather::comm::parse_device_mpi(lather::comm::device_mpi_name(mode), "x"), mode);
  try {
    lather::comm::parse_device_mpi("cuda", "LATHER_DEVICE_MPI");
    FAIL() << "a bad mode was accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("LATHER_DEVICE_MPI = 'cuda'"), std::string::npos) << e.what();
  }
}

// A bad LATHER_DEVICE_MPI is an error naming it where the collectives of Views first ask (here a
// Transport's construction), on a host build too (where it changes nothing).
TEST(DeviceMpi, ABadEnvironmentValueStopsTheFirstCollective) {
  const AutomaticAfterwards restore;
  const char* before = std::getenv("LATHER_DEVICE_MPI");
  const std::string kept = before ? before : "";
  setenv("LATHER_DEVICE_MPI", "gpu", 1);
  lather::comm::set_device_mpi(DeviceMpi::automatic);
  try {
    lather::comm::Transport<Exec, float> transport(lather::comm::Group(MPI_COMM_WORLD), 64, "test_device_mpi");
    ADD_FAILURE() << "LATHER_DEVICE_MPI=gpu was accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("LATHER_DEVICE_MPI = 'gpu'"), std::string::npos) << e.what();
  }
  if (before)
    setenv("LATHER_DEVICE_MPI", kept.c_str(), 1);
  else
    unsetenv("LATHER_DEVICE_MPI");
}

TEST(DeviceMpi, HostMemoryGoesInPlaceWhateverTheMode) {
  const AutomaticAfterwards restore;
  lather::comm::set_device_mpi(DeviceMpi::staged);
  EXPECT_FALSE(lather::comm::mpi_reads_device_memory());
  EXPECT_TRUE(lather::comm::mpi_reads_in_place<Kokkos::HostSpace>());
  lather::comm::set_device_mpi(DeviceMpi::direct);
  EXPECT_TRUE(lather::comm::mpi_reads_device_memory());
  EXPECT_TRUE(lather::comm::mpi_reads_in_place<Memory>());
}

/// The float bits of values read back from float Views (as doubles: exact).
std::vector<std::uint32_t> bits(const std::vector<double>& values) {
  std::vector<std::uint32_t> out(values.size());
  for (std::size_t k = 0; k < values.size(); ++k) {
    const float value = float(values[k]);
    std::memcpy(&out[k], &value, sizeof(float));
  }
  return out;
}

/// The all-reduce, all-gather and all-to-all of Views, and a chunked Transport all-reduce, of
/// values whose float sums depend on the order of addition.
std::vector<std::vector<std::uint32_t>> collectives_of_views() {
  const lather::comm::Group world(MPI_COMM_WORLD);
  const int n = world.size(), me = world.rank();
  std::vector<double> mine(1000);
  for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = 1.0 / (3.0 + double(k) + 7.0 * me) + 1e7 * (me % 2);
  std::vector<std::vector<std::uint32_t>> out;

  auto summed = make_view<float>(mine);
  world.allreduce(Exec(), summed, lather::comm::Combine::sum);
  out.push_back(bits(read_view(summed)));

  std::vector<std::size_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(std::size_t(10 + r));
  const auto part = make_view<float>(std::vector<double>(mine.begin(), mine.begin() + 10 + me));
  Kokkos::View<float*, Memory> gathered("gathered", 10 * n + n * (n - 1) / 2);
  world.allgatherv(Exec(), Kokkos::View<const float*, Memory>(part), gathered, counts);
  out.push_back(bits(read_view(gathered)));

  const std::vector<std::size_t> one_each(std::size_t(n), 1);
  const auto send = make_view<float>(std::vector<double>(mine.begin(), mine.begin() + n));
  Kokkos::View<float*, Memory> received("received", n);
  world.alltoallv(Exec(), Kokkos::View<const float*, Memory>(send), one_each, received, one_each, 1);
  out.push_back(bits(read_view(received)));

  lather::comm::Transport<Exec, float> transport(world, 64, "test_device_mpi");
  auto chunked = make_view<float>(mine);
  transport.allreduce(Exec(), chunked);
  out.push_back(bits(read_view(chunked)));
  return out;
}

TEST(DeviceMpi, DirectAndStagedCollectivesGiveTheSameBits) {
  const AutomaticAfterwards restore;
  lather::comm::set_device_mpi(DeviceMpi::staged);
  const auto staged = collectives_of_views();
  lather::comm::set_device_mpi(DeviceMpi::direct);
  const auto direct = collectives_of_views();
  ASSERT_EQ(direct.size(), staged.size());
  for (std::size_t c = 0; c < direct.size(); ++c) EXPECT_EQ(direct[c], staged[c]) << "collective " << c;
}

}  // namespace
