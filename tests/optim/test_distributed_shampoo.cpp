// Distributed Shampoo under mpiexec: the root work split over the ranks (replicated mode: roots
// all-gathered; sharded mode: each rank keeps its share and gathers preconditioners to apply them)
// gives the same parameters as one rank computing everything, for both assignments and quantized
// state. Every rank computes the single-rank reference itself.
#include <lather/comm/group.hpp>
#include <lather/optim/shampoo.hpp>

#include "common/host_copies.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

namespace {

using namespace lather;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

std::vector<optim::ParameterSpec> specs() {
  return {{"bias", {9}}, {"dense", {20, 12}}, {"conv", {3, 3, 4, 6}}, {"tall", {30, 5}}, {"scale", {}}};
}

TensorList<float, Mem> tensors(double phase) {
  TensorList<float, Mem> out;
  for (const auto& s : specs()) {
    const auto n = element_count(s.shape);
    FlatTensor<float, Mem> v("t", n);
    auto h = Kokkos::create_mirror_view(v);
    for (std::int64_t k = 0; k < n; ++k) h(k) = float(std::cos(0.3 * k + phase + out.size()));
    Kokkos::deep_copy(v, h);
    out.push_back(v);
  }
  return out;
}

struct Mode {
  const char* name;
  bool sharded, balanced, quantized;
};

class DistributedShampoo : public ::testing::TestWithParam<Mode> {};

// Each root is computed by exactly one rank with the single-rank code on the same statistics and
// travels as raw bytes, so the result is bit-for-bit the single-rank one; the assertion allows
// float rounding (1e-6 relative) in case a BLAS picks another kernel for another call pattern.
TEST_P(DistributedShampoo, EqualsSingleRank) {
  const Mode mode = GetParam();
  optim::ShampooOptions o;
  o.learning_rate = optim::LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.merge_small_dims_block_size = 16;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;
  o.graft_type = optim::GraftType::rmsprop_normalized;
  o.shard_optimizer_states = mode.sharded;
  o.balance_root_work = mode.balanced;
  o.best_effort_memory_usage_reduction = mode.quantized;
  o.root.workspace_bytes = 8 << 10;  // several root chunks and, in sharded mode, gather chunks
  optim::Shampoo<Space, float> distributed(Space(), specs(), o, comm::Group(MPI_COMM_WORLD));
  optim::Shampoo<Space, float> single(Space(), specs(), o);
  auto p1 = tensors(0.0), p2 = tensors(0.0);
  for (int step = 0; step < 5; ++step) {
    const auto g = tensors(1.0 + step);
    distributed.step(Space(), p1, g);
    single.step(Space(), p2, g);
  }
  const auto a = test::host_vectors(p1), b = test::host_vectors(p2);
  for (std::size_t p = 0; p < a.size(); ++p)
    for (std::size_t k = 0; k < a[p].size(); ++k)
      ASSERT_NEAR(a[p][k], b[p][k], 1e-6f * (1 + std::fabs(b[p][k]))) << mode.name << " parameter " << p;
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Every statistic has one owner, and all ranks agree on the metrics.
  const auto metrics = distributed.metrics();
  std::vector<int> owned(ranks, 0);
  for (const auto& m : metrics) {
    ASSERT_GE(m.owner_rank, 0);
    ASSERT_LT(m.owner_rank, ranks);
    ++owned[m.owner_rank];
  }
  double error_sum = 0;
  for (const auto& m : metrics) error_sum += m.error;
  double low = 0, high = 0;
  MPI_Allreduce(&error_sum, &low, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&error_sum, &high, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(low, high);
  // Sharded mode stores only this rank's share.
  if (mode.sharded && ranks > 1) {
    const auto mine = distributed.memory_report();
    const auto all = single.memory_report();
    EXPECT_LT(mine.stack_bytes + mine.quantized_bytes, all.stack_bytes + all.quantized_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, DistributedShampoo,
                         ::testing::Values(Mode{"replicated_balanced", false, true, false},
                                           Mode{"replicated_even", false, false, false},
                                           Mode{"sharded_balanced", true, true, false},
                                           Mode{"sharded_even_quantized", true, false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// Balanced (LPT on n^3) assignment is never worse than the reference's even split by count, and
// for mixed sizes much better.
TEST(RootAssignment, BalancedBeatsEven) {
  std::vector<int> sizes;
  for (int k = 0; k < 40; ++k) sizes.push_back(k % 5 == 0 ? 128 : (k % 3 == 0 ? 64 : 9));
  for (int ranks : {2, 3, 4, 8}) {
    const auto even = optim::assign_statistics(sizes, ranks, optim::RootAssignment::even);
    const auto balanced = optim::assign_statistics(sizes, ranks, optim::RootAssignment::balanced);
    EXPECT_LE(optim::load_imbalance(sizes, balanced, ranks), optim::load_imbalance(sizes, even, ranks) + 1e-12);
    EXPECT_LT(optim::load_imbalance(sizes, balanced, ranks), 1.25) << ranks;
  }
}

}  // namespace
