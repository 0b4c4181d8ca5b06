// The mesh's groups against their definition (rank r = shard r mod S of replica r div S), the
// ranks a group has on this node and the CPUs they may run on, each rank's share of them for the
// BLAS, the all-gather of parts of any size, the all-to-all of Views, a bad LATHER_COLLECTIVE_WAIT, bad shard counts as
// errors on every rank, and the replica tools: broadcast, average, seeds and the divergence check
// naming the ranks that differ.
#include <lather/comm/blas_threads.hpp>
#include <lather/comm/mesh.hpp>
#include <lather/core/host_blas_threads.hpp>
#include <lather/comm/replicas.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace {

using lather::comm::Mesh;
using namespace lather::test;

TEST(Mesh, GroupsAreTheReferenceAxisIndexGroups) {
  const int n = world_size(), rank = world_rank();
  for (int shards = 1; shards <= n; ++shards) {
    if (n % shards != 0) continue;
    Mesh mesh(MPI_COMM_WORLD, shards);
    EXPECT_EQ(mesh.world_size(), n);
    EXPECT_EQ(mesh.world_rank(), rank);
    EXPECT_EQ(mesh.weight_shards(), shards);
    EXPECT_EQ(mesh.shard(), rank % shards);
    EXPECT_EQ(mesh.replica(), rank / shards);
    EXPECT_EQ(mesh.replicas(), n / shards);
    // data_parallel: {S i + d : i}, ordered by replica; shards: {S i + d : d}, ordered by shard.
    std::vector<int> data_parallel, replica;
    for (int i = 0; i < n / shards; ++i) data_parallel.push_back(shards * i + mesh.shard());
    for (int d = 0; d < shards; ++d) replica.push_back(shards * mesh.replica() + d);
    EXPECT_EQ(mesh.data_parallel().ranks_in(mesh.world()), data_parallel);
    EXPECT_EQ(mesh.shards().ranks_in(mesh.world()), replica);
    EXPECT_EQ(mesh.data_parallel().rank(), mesh.replica());
    EXPECT_EQ(mesh.shards().rank(), mesh.shard());
    if (shards == n) {
      Mesh moved(std::move(mesh));
      EXPECT_FALSE(mesh.world().member());  // NOLINT(bugprone-use-after-move): the contract
      EXPECT_TRUE(moved.world().member());
      EXPECT_EQ(moved.shards().size(), n);
    }
  }
}

// Three axes: r = (replica P + stage) S + shard. Every (stages, shards) pair that divides the
// world, each group checked against the ranks it must hold, in the order it must hold them.
TEST(Mesh, PipelineStagesSitBetweenReplicasAndShards) {
  const int n = world_size(), rank = world_rank();
  for (int stages = 1; stages <= n; ++stages)
    for (int shards = 1; shards * stages <= n; ++shards) {
      if (n % (stages * shards) != 0) continue;
      Mesh mesh(MPI_COMM_WORLD, shards, stages);
      const int replicas = n / (stages * shards);
      EXPECT_EQ(mesh.pipeline_stages(), stages);
      EXPECT_EQ(mesh.replicas(), replicas);
      EXPECT_EQ(mesh.shard(), rank % shards);
      EXPECT_EQ(mesh.stage(), (rank / shards) % stages);
      EXPECT_EQ(mesh.replica(), rank / (shards * stages));
      const auto at = [&](int i, int s, int d) { return (i * stages + s) * shards + d; };
      std::vector<int> data_parallel, replica_shards, pipeline, stage;
      for (int i = 0; i < replicas; ++i) data_parallel.push_back(at(i, mesh.stage(), mesh.shard()));
      for (int d = 0; d < shards; ++d) replica_shards.push_back(at(mesh.replica(), mesh.stage(), d));
      for (int s = 0; s < stages; ++s) pipeline.push_back(at(mesh.replica(), s, mesh.shard()));
      for (int i = 0; i < replicas; ++i)
        for (int d = 0; d < shards; ++d) stage.push_back(at(i, mesh.stage(), d));
      EXPECT_EQ(mesh.data_parallel().ranks_in(mesh.world()), data_parallel);
      EXPECT_EQ(mesh.shards().ranks_in(mesh.world()), replica_shards);
      EXPECT_EQ(mesh.pipeline().ranks_in(mesh.world()), pipeline);
      EXPECT_EQ(mesh.stage_ranks().ranks_in(mesh.world()), stage);
      EXPECT_EQ(mesh.pipeline().rank(), mesh.stage());
      EXPECT_EQ(mesh.first_stage(), mesh.stage() == 0);
      EXPECT_EQ(mesh.last_stage(), mesh.stage() == stages - 1);
    }
  expect_error([&] { Mesh(MPI_COMM_WORLD, 1, 0); }, "pipeline_stages must be >= 1, got 0");
  expect_error([&] { Mesh(MPI_COMM_WORLD, 1, n + 1); }, "does not divide the world size");
}

// The tests run every rank on one machine: the node holds the whole group, and each split of it.
TEST(Mesh, RanksOnNodeCountTheGroupOnThisMachine) {
  const int n = world_size();
  EXPECT_EQ(lather::comm::Group().ranks_on_node(), 1);
  EXPECT_EQ(lather::comm::Group(MPI_COMM_WORLD).ranks_on_node(), n);
  Mesh mesh(MPI_COMM_WORLD, n % 2 == 0 ? 2 : 1);
  EXPECT_EQ(mesh.data_parallel().ranks_on_node(), mesh.data_parallel().size());
  EXPECT_EQ(mesh.shards().ranks_on_node(), mesh.shards().size());
}

// This rank's affinity mask and the union of every rank's, gathered with plain MPI.
struct Masks {
  cpu_set_t mine, all;
};
Masks gather_masks() {
  Masks m;
  CPU_ZERO(&m.mine);
  CPU_ZERO(&m.all);
  EXPECT_EQ(sched_getaffinity(0, sizeof m.mine, &m.mine), 0);
  std::vector<cpu_set_t> masks(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&m.mine, int(sizeof m.mine), MPI_BYTE, masks.data(), int(sizeof m.mine), MPI_BYTE, MPI_COMM_WORLD);
  for (auto& set : masks) CPU_OR(&m.all, &m.all, &set);
  return m;
}

// The CPUs of the node's ranks: the union of their affinity masks, gathered here with plain MPI.
// Under `taskset -c 0` (test_comm_mesh_one_cpu_np2) every rank has one CPU: the node is
// oversubscribed and no rank has a CPU to spare for a helper thread.
TEST(Mesh, NodeOccupancyCountsTheRanksAffinityMasks) {
  const int n = world_size();
  auto [mine, all] = gather_masks();
  const auto occupancy = lather::comm::Group(MPI_COMM_WORLD).node_occupancy();
  EXPECT_EQ(occupancy.ranks, n);
  EXPECT_EQ(occupancy.cpus, CPU_COUNT(&all));
  EXPECT_EQ(occupancy.own_cpus, CPU_COUNT(&mine));
  EXPECT_EQ(occupancy.oversubscribed(), n > CPU_COUNT(&all));
  EXPECT_EQ(occupancy.spare_cpu(), n < CPU_COUNT(&all) && CPU_COUNT(&mine) > 1);
  const auto alone = lather::comm::Group().node_occupancy();
  EXPECT_EQ(alone.ranks, 1);
  EXPECT_EQ(alone.cpus, CPU_COUNT(&mine));
  if (std::getenv("LATHER_TEST_ONE_CPU")) {
    EXPECT_EQ(occupancy.cpus, 1);
    EXPECT_EQ(occupancy.own_cpus, 1);
    EXPECT_EQ(occupancy.spare_cpu(), false);
    EXPECT_EQ(occupancy.oversubscribed(), n > 1);
  }
}

// fit_host_blas_threads gives each rank its share of the node's CPUs (those of all ranks' masks,
// gathered here with plain MPI, over the ranks; at most its own), unless the environment names a
// count; ScopedHostBlasThreads sets a count for its lifetime only. The test harness sets
// OPENBLAS_NUM_THREADS=1: it is taken away for the first part and put back after.
TEST(Mesh, HostBlasThreadsAreTheRanksShareOfTheNode) {
  if (lather::host_blas_threads() == 0) GTEST_SKIP() << "this BLAS does not say how many threads it runs";
  const int n = world_size(), found = lather::host_blas_threads();
  auto [mine, all] = gather_masks();
  const int share = std::max(1, std::min(CPU_COUNT(&mine), CPU_COUNT(&all) / n));

  const char* names[] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "BLIS_NUM_THREADS", "MKL_NUM_THREADS",
                         "OMP_NUM_THREADS"};
  std::vector<std::optional<std::string>> saved;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    saved.push_back(value ? std::optional<std::string>(value) : std::nullopt);
    unsetenv(name);
  }
  const lather::comm::Group world(MPI_COMM_WORLD);
  EXPECT_FALSE(lather::host_blas_threads_from_environment());
  ASSERT_TRUE(lather::set_host_blas_threads(share + 1));
  EXPECT_EQ(lather::comm::fit_host_blas_threads(world), share);
  EXPECT_EQ(lather::host_blas_threads(), share);

  // A count in the environment is the user's: kept as the BLAS has it.
  setenv("OMP_NUM_THREADS", "7", 1);
  EXPECT_TRUE(lather::host_blas_threads_from_environment());
  ASSERT_TRUE(lather::set_host_blas_threads(share + 1));
  EXPECT_EQ(lather::comm::fit_host_blas_threads(world), share + 1);
  unsetenv("OMP_NUM_THREADS");

  {
    const lather::ScopedHostBlasThreads one(1);
    EXPECT_EQ(lather::host_blas_threads(), 1);
    {
      const lather::ScopedHostBlasThreads none(0);  // < 1: nothing changes
      EXPECT_EQ(lather::host_blas_threads(), 1);
    }
    EXPECT_EQ(lather::host_blas_threads(), 1);
  }
  EXPECT_EQ(lather::host_blas_threads(), share + 1);
  EXPECT_FALSE(lather::set_host_blas_threads(0));
  EXPECT_EQ(lather::host_blas_threads(), share + 1);

  for (std::size_t k = 0; k < saved.size(); ++k)
    if (saved[k]) setenv(names[k], saved[k]->c_str(), 1);
  lather::set_host_blas_threads(found);
}

// Rank r contributes r + 1 values (rank 1 none, to cover an empty part) of 1000 r + i, from its
// place in the result (in place) or from a buffer of its own; two ranks take the MPI_Sendrecv path.
template <class T>
void expect_allgatherv_places_every_part(bool in_place) {
  const lather::comm::Group group(MPI_COMM_WORLD);
  const int n = group.size(), rank = group.rank();
  std::vector<std::size_t> counts(static_cast<std::size_t>(n)), offsets(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r) counts[std::size_t(r)] = r == 1 ? 0 : std::size_t(r + 1);
  for (int r = 1; r < n; ++r) offsets[std::size_t(r)] = offsets[std::size_t(r - 1)] + counts[std::size_t(r - 1)];
  const std::size_t total = offsets.back() + counts.back();
  std::vector<T> all(total, T(-1)), mine(counts[std::size_t(rank)]);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = T(1000 * rank + int(i));
  if (in_place) std::copy(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(offsets[std::size_t(rank)]));
  group.allgatherv(in_place ? all.data() + offsets[std::size_t(rank)] : mine.data(), all.data(), counts);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < counts[std::size_t(r)]; ++i)
      EXPECT_EQ(all[offsets[std::size_t(r)] + i], T(1000 * r + int(i))) << "rank " << r << " value " << i;
}

TEST(Group, AllgathervPlacesEveryPart) {
  for (bool in_place : {true, false}) {
    expect_allgatherv_places_every_part<float>(in_place);
    expect_allgatherv_places_every_part<std::int64_t>(in_place);
  }
}

// The all-to-all of Views in rows of 3: rank s sends rank r (r + s) % 3 rows holding
// 1000 s + 100 r + k, and receives each rank's rows in rank order (through host copies where MPI
// cannot read the execution space's memory). Some ranks send some ranks nothing.
TEST(Group, AlltoallvOfViewsPlacesEveryRow) {
  const lather::comm::Group world(MPI_COMM_WORLD);
  const int n = world.size(), me = world.rank();
  constexpr std::size_t row = 3;
  std::vector<std::size_t> to(static_cast<std::size_t>(n), 0), from(static_cast<std::size_t>(n), 0);
  std::vector<double> send;
  for (int r = 0; r < n; ++r) {
    to[std::size_t(r)] = std::size_t((r + me) % 3);
    from[std::size_t(r)] = std::size_t((me + r) % 3);
    for (std::size_t k = 0; k < to[std::size_t(r)] * row; ++k) send.push_back(1000.0 * me + 100.0 * r + double(k));
  }
  std::size_t received = 0;
  for (auto c : from) received += c;
  const auto send_view = make_view<float>(send);
  Kokkos::View<float*, Memory> receive("receive", received * row);
  world.alltoallv(Exec(), Kokkos::View<const float*, Memory>(send_view), to, receive, from, row);
  const auto got = read_view(receive);
  std::size_t at = 0;
  for (int s = 0; s < n; ++s)
    for (std::size_t k = 0; k < from[std::size_t(s)] * row; ++k, ++at)
      EXPECT_EQ(got[at], 1000.0 * s + 100.0 * me + double(k)) << "from rank " << s << ", value " << k;
  EXPECT_THROW(world.alltoallv(Exec(), Kokkos::View<const float*, Memory>(send_view),
                               std::vector<std::size_t>(std::size_t(n) + 1), receive, from, row),
               lather::Error);
}

// Every rank's sum of its part, against a plain sum over the ranks' inputs: parts of every rank,
// none for rank 0 (MPICH's long-message in-place algorithm moves a later rank's part onto itself
// then; Group sums the whole buffer instead), only for the last rank, short and long (above
// MPICH's 512 KiB switch to its pairwise algorithm), in place and not.
TEST(Group, ReduceScatterSumsEveryPart) {
  const lather::comm::Group world(MPI_COMM_WORLD);
  const int n = world.size(), me = world.rank();
  const auto value = [](int rank, std::size_t k) { return float((rank + 1) * 0.5) + float(k % 97) * 0.25f; };
  for (const std::size_t per_rank : {std::size_t(40), std::size_t(1) << 18}) {
    std::vector<std::vector<std::size_t>> layouts = {std::vector<std::size_t>(std::size_t(n), per_rank)};
    layouts.push_back(layouts.front());
    layouts.back()[0] = 0;  // nothing for rank 0
    layouts.push_back(std::vector<std::size_t>(std::size_t(n), 0));
    layouts.back().back() = per_rank;  // everything for the last rank
    for (const auto& counts : layouts)
      for (bool in_place : {true, false}) {
        std::size_t total = 0, offset = 0;
        for (int r = 0; r < n; ++r) (r < me ? offset : total) += counts[std::size_t(r)];
        total += offset;
        std::vector<float> send(total), receive(in_place ? 0 : counts[std::size_t(me)]);
        for (std::size_t k = 0; k < total; ++k) send[k] = value(me, k);
        float* into = in_place ? send.data() : receive.data();
        world.reduce_scatter(send.data(), into, counts, lather::comm::Combine::sum);
        for (std::size_t k = 0; k < counts[std::size_t(me)]; ++k) {
          float expected = 0;  // the ranks' values in rank order: exact in float (multiples of 1/4)
          for (int r = 0; r < n; ++r) expected += value(r, offset + k);
          ASSERT_EQ(into[k], expected) << "element " << k << " of " << counts[std::size_t(me)]
                                       << (in_place ? ", in place" : "") << ", rank 0 holding " << counts[0];
        }
      }
  }
}

// src/comm/waiting.hpp: LATHER_COLLECTIVE_WAIT takes auto, spin or yield; anything else stops the
// (collective) Group constructor on every rank, naming the variable, before any collective of it.
// The suite runs under each value on some rank count (tests/comm/CMakeLists.txt).
TEST(Group, BadCollectiveWaitIsAnErrorOnEveryRank) {
  const char* before = std::getenv("LATHER_COLLECTIVE_WAIT");
  const std::string kept = before ? before : "";
  ::setenv("LATHER_COLLECTIVE_WAIT", "sleep", 1);
  std::string message;
  try {
    const lather::comm::Group group(MPI_COMM_WORLD);
  } catch (const lather::Error& e) {
    message = e.what();
  }
  if (before)
    ::setenv("LATHER_COLLECTIVE_WAIT", kept.c_str(), 1);
  else
    ::unsetenv("LATHER_COLLECTIVE_WAIT");
  EXPECT_NE(message.find("LATHER_COLLECTIVE_WAIT is 'sleep'; it takes auto, spin or yield"), std::string::npos)
      << message;
  // The collectives still work, whichever way this process waits.
  const lather::comm::Group group(MPI_COMM_WORLD);
  EXPECT_EQ(group.allreduce(1, lather::comm::Combine::sum), group.size());
}

TEST(Mesh, BadShardCountsAreAnErrorOnEveryRank) {
  const int n = world_size();
  expect_error([&] { Mesh(MPI_COMM_WORLD, n + 1); }, "does not divide the world size");
  expect_error([] { Mesh(MPI_COMM_WORLD, 0); }, "weight_shards must be >= 1, got 0");
  if (n == 8) expect_error([] { Mesh(MPI_COMM_WORLD, 3); }, "weight_shards 3 does not divide the world size 8");
}

TEST(Replicas, SeedBroadcastAndAverage) {
  const int n = world_size(), rank = world_rank();
  const int shards = n % 2 == 0 ? 2 : 1;
  Mesh mesh(MPI_COMM_WORLD, shards);
  // One seed per data-parallel group: that of its replica 0, world rank = shard.
  EXPECT_EQ(lather::comm::agree_seed(mesh, 1000u + rank), 1000u + mesh.shard());

  const std::vector<std::int64_t> sizes = {5, 0, 700, 3, 2};
  const int root = n - 1;
  lather::comm::ReduceOptions small;
  small.fusion_bytes = 256;  // several buckets and in-place single tensors
  auto parameters = make_inputs<double>(rank, sizes);
  lather::comm::broadcast_tensors(Exec(), MPI_COMM_WORLD, parameters, root, small);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto got = read_view(parameters[t]);
    for (std::int64_t i = 0; i < sizes[t]; ++i) ASSERT_EQ(got[i], input_value(root, int(t), i));
  }
  expect_error([&] { lather::comm::broadcast_tensors(Exec(), MPI_COMM_WORLD, parameters, n); },
               "root " + std::to_string(n) + " is not a rank of the group");
  auto state = make_inputs<float>(rank, sizes);
  lather::comm::average_tensors(Exec(), mesh.data_parallel(), state);
  const int replicas = mesh.replicas();
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto got = read_view(state[t]);
    for (std::int64_t i = 0; i < sizes[t]; ++i) {
      double mean = 0;
      for (int r = 0; r < replicas; ++r) mean += stored_input<float>(shards * r + mesh.shard(), int(t), i);
      // replicas values of magnitude <= 1 summed in float: (replicas + 1) eps relative to replicas.
      ASSERT_NEAR(got[i], mean / replicas, 2.0 * (replicas + 1) * 1.2e-7);
    }
  }
}

TEST(Replicas, DivergenceCheckNamesTheRanksThatDiffer) {
  const int n = world_size(), rank = world_rank();
  const std::vector<std::int64_t> sizes = {4, 100, 7};
  auto state = make_inputs<double>(0, sizes);  // the same on every rank
  const auto report = lather::comm::check_replicas(Exec(), MPI_COMM_WORLD, state);
  EXPECT_TRUE(report.consistent()) << report.describe();
  EXPECT_EQ(report.checksums, std::vector<std::uint32_t>(n, lather::comm::checksum(Exec(), state)));
  lather::comm::require_consistent_replicas(Exec(), MPI_COMM_WORLD, state);
  if (n == 1) return;

  // The last rank flips one element of tensor 1: it alone is named, with that tensor.
  if (rank == n - 1) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state[1]);
    host(42) += 1e-12;
    Kokkos::deep_copy(state[1], host);
  }
  const auto diverged = lather::comm::check_replicas(Exec(), MPI_COMM_WORLD, state);
  EXPECT_FALSE(diverged.consistent());
  EXPECT_EQ(diverged.divergent_world_ranks, std::vector<int>{n - 1});
  EXPECT_EQ(diverged.divergent_tensors, std::vector<int>{1});
  EXPECT_EQ(diverged.reference_rank, 0);
  expect_error([&] { lather::comm::require_consistent_replicas(Exec(), MPI_COMM_WORLD, state); },
               "replicas diverge: world ranks " + std::to_string(n - 1) + " differ");

  // A rank with a different layout is named too (no per-tensor comparison then).
  auto other = make_inputs<double>(0, rank == 0 && n > 2 ? std::vector<std::int64_t>{4, 100} : sizes);
  const auto layouts = lather::comm::check_replicas(Exec(), MPI_COMM_WORLD, other);
  if (n > 2) {
    EXPECT_EQ(layouts.divergent_world_ranks, std::vector<int>{0});
    EXPECT_NE(layouts.describe().find("2 tensors"), std::string::npos) << layouts.describe();
  } else {
    EXPECT_TRUE(layouts.consistent());
  }
}

}  // namespace
