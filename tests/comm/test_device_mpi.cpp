// Whether collectives hand MPI device memory in place or stage it (comm/device_mpi.hpp): the rule
// against its truth table, the modes' names, host memory in place whatever the mode, and the
// collectives of Views giving the same bits both ways (on a device the two paths differ: device
// pointers to MPI, or host copies; on a host build both hand MPI the View's own memory). And
// whether they go through NCCL (comm/device_collectives.hpp): the rule and its errors, which are
// host logic and hold on every build (tests/comm/test_nccl.cpp moves data where NCCL is built).
#include <lather/comm/device_collectives.hpp>
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

using lather::comm::DeviceCollectives;

/// Puts the automatic device collectives back when a test ends, whatever it set.
struct AutomaticCollectivesAfterwards {
  ~AutomaticCollectivesAfterwards() { lather::comm::set_device_collectives(DeviceCollectives::automatic); }
};

/// Sets an environment variable for a scope, and puts back what was there.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : m_name(name) {
    if (const char* before = std::getenv(name)) m_before = before, m_had = true;
    setenv(name, value, 1);
  }
  ~ScopedEnvironment() {
    if (m_had)
      setenv(m_name, m_before.c_str(), 1);
    else
      unsetenv(m_name);
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* m_name;
  std::string m_before;
  bool m_had = false;
};

/// The message of the lather::Error `work` throws ("" where it throws none).
template <class Work>
std::string error_of(Work&& work) {
  try {
    work();
  } catch (const lather::Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceCollectives, MpiWinsThenTheBuildAndTheMemoryDecide) {
  using lather::comm::resolve_device_collectives;
  for (bool built : {false, true})
    for (bool cuda : {false, true}) {
      EXPECT_FALSE(resolve_device_collectives(DeviceCollectives::mpi, built, cuda));
      EXPECT_EQ(resolve_device_collectives(DeviceCollectives::automatic, built, cuda), built && cuda)
          << "built " << built << ", CUDA memory " << cuda;
      if (built) EXPECT_EQ(resolve_device_collectives(DeviceCollectives::nccl, built, cuda), cuda);
    }
}

TEST(DeviceCollectives, NcclWithoutNcclIsAnErrorNamingTheBuildOption) {
  for (bool cuda : {false, true}) {
    const std::string message =
        error_of([&] { lather::comm::resolve_device_collectives(DeviceCollectives::nccl, false, cuda); });
    EXPECT_NE(message.find("LATHER_ENABLE_NCCL=ON"), std::string::npos) << message;
    EXPECT_NE(message.find("LATHER_DEVICE_COLLECTIVES = 'nccl'"), std::string::npos) << message;
  }
}

TEST(DeviceCollectives, ModesHaveNamesAndABadOneIsNamed) {
  for (auto mode : {DeviceCollectives::automatic, DeviceCollectives::nccl, DeviceCollectives::mpi})
    EXPECT_EQ(lather::comm::parse_device_collectives(lather::comm::device_collectives_name(mode), "x"), mode);
  const std::string message =
      error_of([] { lather::comm::parse_device_collectives("NCCL", "LATHER_DEVICE_COLLECTIVES"); });
  EXPECT_NE(message.find("LATHER_DEVICE_COLLECTIVES = 'NCCL': expected auto, nccl or mpi"), std::string::npos)
      << message;
}

TEST(DeviceCollectives, TheSetModeWinsOverTheEnvironment) {
  const AutomaticCollectivesAfterwards restore;
  const ScopedEnvironment environment("LATHER_DEVICE_COLLECTIVES", "mpi");
  lather::comm::set_device_collectives(DeviceCollectives::automatic);
  EXPECT_EQ(lather::comm::device_collectives(), DeviceCollectives::mpi);
  lather::comm::set_device_collectives(DeviceCollectives::nccl);
  EXPECT_EQ(lather::comm::device_collectives(), DeviceCollectives::nccl);
  lather::comm::set_device_collectives(DeviceCollectives::automatic);
  EXPECT_EQ(lather::comm::device_collectives(), DeviceCollectives::mpi);
}

// Host memory never goes to NCCL, whatever the mode; `nccl` asked of a build without NCCL stops the
// first collective of Views (a Transport's construction, Group's View overloads), naming the
// option.
TEST(DeviceCollectives, HostMemoryStaysOnMpiAndMissingNcclStopsTheFirstCollective) {
  const AutomaticCollectivesAfterwards restore;
  const lather::comm::Group world(MPI_COMM_WORLD);
  for (auto mode : {DeviceCollectives::automatic, DeviceCollectives::mpi}) {
    lather::comm::set_device_collectives(mode);
    EXPECT_FALSE(lather::comm::Impl::nccl_choice<Kokkos::DefaultHostExecutionSpace>().wanted);
    lather::comm::Transport<Kokkos::DefaultHostExecutionSpace, float> transport(world, 64, "test_device_mpi");
    EXPECT_FALSE(transport.through_nccl(Kokkos::DefaultHostExecutionSpace()));
  }
  lather::comm::set_device_collectives(DeviceCollectives::nccl);
  if (LATHER_ENABLE_NCCL) {
    EXPECT_FALSE(lather::comm::Impl::nccl_choice<Kokkos::DefaultHostExecutionSpace>().wanted);
    return;
  }
  auto values = make_view<float>(std::vector<double>(4, 1.0));
  for (const std::string& message :
       {error_of([&] { lather::comm::Transport<Exec, float> transport(world, 64, "test_device_mpi"); }),
        error_of([&] { world.allreduce(Exec(), values, lather::comm::Combine::sum); })})
    EXPECT_NE(message.find("-DLATHER_ENABLE_NCCL=ON"), std::string::npos) << message;
}

// A bad LATHER_DEVICE_COLLECTIVES is an error naming it where the collectives of Views first ask,
// on every build, before any message: here on every rank alike.
TEST(DeviceCollectives, ABadEnvironmentValueStopsTheFirstCollective) {
  const AutomaticCollectivesAfterwards restore;
  const ScopedEnvironment environment("LATHER_DEVICE_COLLECTIVES", "gpu");
  lather::comm::set_device_collectives(DeviceCollectives::automatic);
  const lather::comm::Group world(MPI_COMM_WORLD);
  auto values = make_view<float>(std::vector<double>(4, 1.0));
  const auto part = make_view<float>(std::vector<double>(2, 1.0));
  Kokkos::View<float*, Memory> gathered("gathered", 2 * std::size_t(world.size()));
  const std::vector<std::size_t> counts(std::size_t(world.size()), 2);
  for (const std::string& message :
       {error_of([&] { lather::comm::Transport<Exec, float> transport(world, 64, "test_device_mpi"); }),
        error_of([&] { world.allreduce(Exec(), values, lather::comm::Combine::sum); }),
        error_of([&] { world.allgatherv(Exec(), Kokkos::View<const float*, Memory>(part), gathered, counts); })})
    EXPECT_NE(message.find("LATHER_DEVICE_COLLECTIVES = 'gpu'"), std::string::npos) << message;
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
