// The collectives of CUDA memory through NCCL (comm/device_collectives.hpp; built only with
// LATHER_ENABLE_NCCL=ON, run where a GPU is): every one gives the bits the staged MPI path gives,
// and the exact values the host computes, where the operation is deterministic: the all-gathers
// (data movement: any values, uneven counts with zeros, and even ones, which take ncclAllGather),
// the sums of small integers (exact in floating point, so the order of addition cannot matter),
// the minima and maxima, the exchanges; through Group's View overloads, a chunked Transport (its
// blocking and nonblocking forms) and GradientReducer. Ranks that share a GPU (one GPU, two ranks:
// NCCL refuses them) check the other half: `auto` falls back to MPI on every rank, `nccl` is an
// error on every rank. Disagreements and bad counts are errors on every rank either way.
#include <lather/comm/device_collectives.hpp>
#include <lather/comm/device_mpi.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/comm/transport.hpp>

#include "comm_test_utils.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using lather::comm::Combine;
using lather::comm::DeviceCollectives;
using lather::comm::DeviceMpi;
using namespace lather::test;

static_assert(lather::comm::Impl::cuda_execution<Exec>, "test_nccl runs on the CUDA backend");

/// Puts the automatic modes back when a test ends, whatever it set.
struct AutomaticAfterwards {
  ~AutomaticAfterwards() {
    lather::comm::set_device_collectives(DeviceCollectives::automatic);
    lather::comm::set_device_mpi(DeviceMpi::automatic);
  }
};

/// Whether two ranks of the world share a CUDA device (by PCI bus id, on one node): the test's own
/// reckoning, not the library's, agreed over the world.
bool ranks_share_a_device() {
  char mine[32] = {};
  EXPECT_EQ(cudaDeviceGetPCIBusId(mine, sizeof(mine), Exec().cuda_device()), cudaSuccess);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1, me = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_rank(node, &me);
  std::vector<char> all(std::size_t(n) * sizeof(mine));
  MPI_Allgather(mine, sizeof(mine), MPI_CHAR, all.data(), sizeof(mine), MPI_CHAR, node);
  MPI_Comm_free(&node);
  int shared = 0;
  for (int r = 0; r < n; ++r)
    if (r != me && std::memcmp(mine, all.data() + std::size_t(r) * sizeof(mine), sizeof(mine)) == 0) shared = 1;
  MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return shared != 0;
}

/// The bits of a View's elements (each widened to 64 bits), read back to the host.
template <class T>
std::vector<std::uint64_t> bits(const Kokkos::View<T*, Memory>& view) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::vector<std::uint64_t> out(view.extent(0), 0);
  for (std::size_t k = 0; k < out.size(); ++k) std::memcpy(&out[k], &host(k), sizeof(T));
  return out;
}

/// The same bits for values the host computes.
template <class T>
std::vector<std::uint64_t> bits(const std::vector<double>& values) {
  std::vector<std::uint64_t> out(values.size(), 0);
  for (std::size_t k = 0; k < out.size(); ++k) {
    const T value = T(values[k]);
    std::memcpy(&out[k], &value, sizeof(T));
  }
  return out;
}

/// A small integer of rank r at index k: sums over up to 8 ranks stay exact (and within int8).
double small(int r, std::size_t k) { return double(int((k * 7 + std::size_t(r) * 3) % 7) - 3); }
/// Any value (for data movement, minima and maxima).
double any(int r, std::size_t k) { return input_value(r, 3, std::int64_t(k)); }

/// Counts of an uneven all-gather, with zeros (rank 1, 4, ...).
std::vector<std::size_t> uneven_counts(int ranks) {
  std::vector<std::size_t> counts;
  for (int r = 0; r < ranks; ++r) counts.push_back(r % 3 == 1 ? 0 : std::size_t(5 + 3 * r));
  return counts;
}

/// One outcome: what a collective gave, and what the host says it must give (nothing where only
/// the other path's bits are the reference).
struct Outcome {
  std::string name;
  std::vector<std::uint64_t> got, expected;
};

/// Group's all-gather of rank r's values(r, k), k < counts[r], rank 0's first.
template <class T, class Values>
Outcome gather(const lather::comm::Group& group, const std::string& name, const std::vector<std::size_t>& counts,
               Values values) {
  const int me = group.rank();
  std::vector<double> mine, all;
  for (int r = 0; r < group.size(); ++r)
    for (std::size_t k = 0; k < counts[std::size_t(r)]; ++k) {
      all.push_back(values(r, k));
      if (r == me) mine.push_back(values(r, k));
    }
  const auto send = make_view<T>(mine, "send");
  Kokkos::View<T*, Memory> receive("receive", all.size());
  group.allgatherv(Exec(), Kokkos::View<const T*, Memory>(send), receive, counts);
  return {name, bits(receive), bits<T>(all)};
}

/// Group's all-reduce of values(r, k), k < n, with the host's result.
template <class T, class Values>
Outcome reduce(const lather::comm::Group& group, const std::string& name, std::size_t n, Combine op, Values values) {
  std::vector<double> mine(n), expected(n);
  for (std::size_t k = 0; k < n; ++k) {
    mine[k] = values(group.rank(), k);
    for (int r = 0; r < group.size(); ++r) {
      const double v = values(r, k);
      expected[k] = r == 0               ? v
                    : op == Combine::sum ? expected[k] + v
                    : op == Combine::max ? std::max(expected[k], v)
                                         : std::min(expected[k], v);
    }
  }
  auto data = make_view<T>(mine, "reduced");
  group.allreduce(Exec(), data, op);
  return {name, bits(data), bits<T>(expected)};
}

/// Every collective of CUDA memory that NCCL may carry, in the modes in force, and how many of
/// the Transports' calls went through NCCL.
std::vector<Outcome> collectives(long& nccl_calls) {
  const lather::comm::Group world(MPI_COMM_WORLD);
  const int n = world.size(), me = world.rank();
  std::vector<Outcome> out;

  out.push_back(gather<float>(world, "allgatherv float, uneven counts with zeros", uneven_counts(n), any));
  out.push_back(gather<double>(world, "allgatherv double, even counts", std::vector<std::size_t>(n, 7), any));
  out.push_back(gather<char>(world, "allgatherv char, uneven counts", uneven_counts(n),
                             [](int r, std::size_t k) { return double(int((r * 31 + int(k)) % 100)); }));
  out.push_back(reduce<float>(world, "allreduce float sum", 1000, Combine::sum, small));
  out.push_back(reduce<double>(world, "allreduce double sum", 257, Combine::sum, small));
  out.push_back(reduce<double>(world, "allreduce double max", 257, Combine::max, any));
  out.push_back(reduce<float>(world, "allreduce float min", 100, Combine::min, any));
  out.push_back(reduce<int>(world, "allreduce int sum", 100, Combine::sum, small));
  out.push_back(reduce<std::int64_t>(world, "allreduce int64 max", 100, Combine::max, small));
  out.push_back(reduce<std::int8_t>(world, "allreduce int8 sum", 100, Combine::sum, small));

  // A Transport in chunks of 64: the blocking all-reduces (in place and not), the all-gather, the
  // nonblocking all-reduce, and the exchange of pairs (0, 1), (2, 3), ...
  lather::comm::Transport<Exec, float> transport(world, 64, "test_nccl");
  {
    const std::size_t count = 1000;
    std::vector<double> mine(count), expected(count, 0.0);
    for (std::size_t k = 0; k < count; ++k) {
      mine[k] = small(me, k);
      for (int r = 0; r < n; ++r) expected[k] += small(r, k);
    }
    auto data = make_view<float>(mine);
    transport.allreduce(Exec(), data);
    out.push_back({"Transport::allreduce", bits(data), bits<float>(expected)});
    const auto in = make_view<float>(mine);
    Kokkos::View<float*, Memory> total("total", count);
    transport.allreduce_sum(Exec(), in, total);
    out.push_back({"Transport::allreduce_sum", bits(total), bits<float>(expected)});
    auto chunk = make_view<float>(std::vector<double>(mine.begin(), mine.begin() + 64));
    auto request = transport.start_allreduce(Exec(), chunk);
    request.wait();
    transport.finish_allreduce(Exec(), chunk);
    out.push_back({"Transport::start_allreduce", bits(chunk),
                   bits<float>(std::vector<double>(expected.begin(), expected.begin() + 64))});
  }
  {
    const auto counts = uneven_counts(n);
    std::vector<double> mine, all;
    for (int r = 0; r < n; ++r)
      for (std::size_t k = 0; k < counts[std::size_t(r)]; ++k) {
        all.push_back(any(r, k));
        if (r == me) mine.push_back(any(r, k));
      }
    const auto send = make_view<float>(mine);
    Kokkos::View<float*, Memory> receive("receive", all.size());
    transport.allgatherv(Exec(), send, receive, counts);
    out.push_back({"Transport::allgatherv", bits(receive), bits<float>(all)});
  }
  const int partner = me ^ 1;
  if (partner < n) {
    // 150 out, the partner's 150 in (three chunks each way).
    std::vector<double> mine(150), theirs(150);
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = any(me, k), theirs[k] = any(partner, k);
    const auto outgoing = make_view<float>(mine);
    Kokkos::View<float*, Memory> incoming("incoming", theirs.size());
    transport.exchange(Exec(), outgoing, incoming, partner, 7);
    out.push_back({"Transport::exchange", bits(incoming), bits<float>(theirs)});
  }
  nccl_calls = transport.counters().nccl_calls;

  // GradientReducer: two tensors summed; their mean where 1/n is exact (n a power of two).
  for (auto op : {lather::comm::ReduceOp::sum, lather::comm::ReduceOp::mean}) {
    if (op == lather::comm::ReduceOp::mean && (n & (n - 1)) != 0) continue;
    const std::vector<std::size_t> sizes = {300, 77};
    lather::TensorList<float, Memory> tensors;
    std::vector<double> expected;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::vector<double> mine(sizes[t]);
      for (std::size_t k = 0; k < sizes[t]; ++k) {
        mine[k] = small(me, k + 1000 * t);
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += small(r, k + 1000 * t);
        expected.push_back(op == lather::comm::ReduceOp::mean ? sum / n : sum);
      }
      tensors.push_back(make_view<float>(mine));
    }
    lather::comm::GradientReducer<Exec, float> reducer(world);
    reducer.reduce(Exec(), tensors, op);
    std::vector<std::uint64_t> got;
    for (const auto& tensor : tensors) {
      const auto b = bits(Kokkos::View<float*, Memory>(tensor));
      got.insert(got.end(), b.begin(), b.end());
    }
    out.push_back({"GradientReducer::" + lather::comm::to_string(op), got, bits<float>(expected)});
  }
  if (n <= 2) {
    // Two ranks sum pairwise, each element by one rank in the same kernel, whatever carries the
    // halves: any values give MPI's bits (the reference is the other path's).
    std::vector<double> mine(1000);
    for (std::size_t k = 0; k < mine.size(); ++k) mine[k] = any(me, k);
    lather::TensorList<float, Memory> tensors = {make_view<float>(mine)};
    lather::comm::GradientReducer<Exec, float> reducer(world);
    reducer.reduce(Exec(), tensors, lather::comm::ReduceOp::mean);
    out.push_back({"GradientReducer::mean of any values", bits(Kokkos::View<float*, Memory>(tensors[0])), {}});
  }
  return out;
}

TEST(Nccl, TheChoiceForDeviceAndHostViews) {
  const AutomaticAfterwards restore;
  using lather::comm::Impl::nccl_choice;
  lather::comm::set_device_collectives(DeviceCollectives::automatic);
  EXPECT_TRUE(nccl_choice<Exec>().wanted);
  EXPECT_FALSE(nccl_choice<Exec>().required);
  EXPECT_FALSE(nccl_choice<Kokkos::DefaultHostExecutionSpace>().wanted);
  lather::comm::set_device_collectives(DeviceCollectives::nccl);
  EXPECT_TRUE(nccl_choice<Exec>().wanted);
  EXPECT_TRUE(nccl_choice<Exec>().required);
  lather::comm::set_device_collectives(DeviceCollectives::mpi);
  EXPECT_FALSE(nccl_choice<Exec>().wanted);
  const auto on = lather::comm::Impl::on_instance(nccl_choice<Exec>(), Exec());
  EXPECT_EQ(on.device, Exec().cuda_device());
  EXPECT_EQ(on.stream, static_cast<void*>(Exec().cuda_stream()));
}

// NCCL against the staged MPI path (device memory copied to the host and back), and both against
// the host's exact values, element for element.
TEST(Nccl, SameBitsAsTheStagedMpiPath) {
  if (ranks_share_a_device()) GTEST_SKIP() << "ranks share a GPU: NCCL cannot serve them (SharedDevice below)";
  const AutomaticAfterwards restore;
  lather::comm::set_device_mpi(DeviceMpi::staged);
  lather::comm::set_device_collectives(DeviceCollectives::mpi);
  long mpi_nccl_calls = -1, nccl_calls = -1;
  const auto staged = collectives(mpi_nccl_calls);
  lather::comm::set_device_collectives(DeviceCollectives::nccl);
  const auto nccl = collectives(nccl_calls);
  EXPECT_EQ(mpi_nccl_calls, 0);
  EXPECT_GT(nccl_calls, 0) << "the Transport's collectives did not go through NCCL";
  ASSERT_EQ(nccl.size(), staged.size());
  for (std::size_t c = 0; c < nccl.size(); ++c) {
    if (!staged[c].expected.empty()) {
      EXPECT_EQ(staged[c].got, staged[c].expected) << staged[c].name << " (staged MPI) against the host's values";
      EXPECT_EQ(nccl[c].got, nccl[c].expected) << nccl[c].name << " (NCCL) against the host's values";
    }
    EXPECT_EQ(nccl[c].got, staged[c].got) << nccl[c].name << ": NCCL against staged MPI";
  }
}

// Ranks sharing a GPU: `auto` takes MPI on every rank (same bits, no NCCL call); `nccl` is the same
// error on every rank, naming the device, again at the next call, and no rank hangs.
TEST(Nccl, SharedDeviceFallsBackToMpiOrFailsOnEveryRank) {
  if (!ranks_share_a_device()) GTEST_SKIP() << "every rank has a GPU of its own";
  const AutomaticAfterwards restore;
  lather::comm::set_device_mpi(DeviceMpi::staged);
  lather::comm::set_device_collectives(DeviceCollectives::automatic);
  long nccl_calls = -1;
  for (const auto& outcome : collectives(nccl_calls))
    if (!outcome.expected.empty()) EXPECT_EQ(outcome.got, outcome.expected) << outcome.name;
  EXPECT_EQ(nccl_calls, 0);
  lather::comm::set_device_collectives(DeviceCollectives::nccl);
  const lather::comm::Group world(MPI_COMM_WORLD);
  auto values = make_view<float>(std::vector<double>(16, 1.0));
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string message;
    try {
      world.allreduce(Exec(), values, Combine::sum);
    } catch (const lather::Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("NCCL cannot serve this group"), std::string::npos) << message;
    EXPECT_NE(message.find("shares CUDA device"), std::string::npos) << message;
    EXPECT_EQ(world.allreduce(message.empty() ? 0 : 1, Combine::min), 1) << "a rank did not fail";
  }
}

// Ranks that disagree on the path (one on MPI, the others on NCCL) or on the call fail alike,
// before any data moves: an NCCL call would wait for ever for an MPI one.
TEST(Nccl, DisagreementsAreErrorsOnEveryRank) {
  const lather::comm::Group world(MPI_COMM_WORLD);
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  const AutomaticAfterwards restore;
  const auto error_of = [&](auto&& work) {
    std::string message;
    try {
      work();
    } catch (const lather::Error& e) {
      message = e.what();
    }
    EXPECT_EQ(world.allreduce(message.empty() ? 0 : 1, Combine::min), 1) << "a rank did not fail";
    return message;
  };
  lather::comm::set_device_collectives(world.rank() == 0 ? DeviceCollectives::mpi : DeviceCollectives::automatic);
  auto values = make_view<float>(std::vector<double>(16, 1.0));
  std::string message = error_of([&] { world.allreduce(Exec(), values, Combine::sum); });
  EXPECT_NE(message.find("the path of CUDA memory"), std::string::npos) << message;

  lather::comm::set_device_collectives(DeviceCollectives::automatic);
  auto uneven = make_view<float>(std::vector<double>(16 + std::size_t(world.rank()), 1.0));
  message = error_of([&] { world.allreduce(Exec(), uneven, Combine::sum); });
  EXPECT_NE(message.find("Group::allreduce: element count differs"), std::string::npos) << message;

  // Rank 1's View does not hold the count it claims: its fault, every rank's error.
  const std::vector<std::size_t> counts(std::size_t(world.size()), 4);
  const auto part = make_view<float>(std::vector<double>(world.rank() == 1 ? 3 : 4, 1.0));
  Kokkos::View<float*, Memory> all("all", 4 * std::size_t(world.size()));
  message = error_of([&] { world.allgatherv(Exec(), Kokkos::View<const float*, Memory>(part), all, counts); });
  EXPECT_NE(message.find("counts do not match the group"), std::string::npos) << message;
  EXPECT_NE(message.find("(on group rank 1 of"), std::string::npos) << message;
}

}  // namespace
