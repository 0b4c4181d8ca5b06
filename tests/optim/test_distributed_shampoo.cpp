// Shampoo on a group of ranks gives the parameters one rank computes alone, in both step modes:
// replicated (every rank updates every block, the roots are split and exchanged) and distributed
// (each rank updates its share of the blocks, one all-gather of the new values ends the step:
// through node-shared memory, as here where all ranks share a node, or MPI_Allgatherv);
// with int8 quantized state, and with weight shards (tensor-parallel slices of some parameters,
// whose norms are summed over the shard group), and with fully sharded parameters (each rank the
// rows of blocks it owns). Every rank computes the single-rank reference on the whole (unsplit)
// model itself.
#include <lather/comm/mesh.hpp>
#include <lather/comm/parameter_shards.hpp>
#include <lather/optim/sharding.hpp>
#include <lather/optim/shampoo.hpp>

#include "common/host_copies.hpp"
#include "common/split_step_tolerance.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <ostream>

namespace {

using namespace lather;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

/// The whole model: "wide" is split along its columns and "tall" along its rows when sharded
/// (slice boundaries on block boundaries, block_size 8).
std::vector<optim::ParameterSpec> global_specs() {
  return {{"bias", {9}},     {"dense", {20, 12}}, {"conv", {3, 3, 4, 6}}, {"wide", {8, 16}},
          {"tall", {32, 5}}, {"scale", {}},       {"long", {70}}};
}

/// This shard's view of the model: split parameters ("wide" and "broad" along their columns,
/// "tall" along its rows) become their slice.
std::vector<optim::ParameterSpec> local_specs(int shards, int shard,
                                              std::vector<optim::ParameterSpec> specs = global_specs()) {
  if (shards == 1) return specs;
  for (auto& s : specs) {
    const int axis = s.name == "wide" || s.name == "broad" ? 1 : s.name == "tall" ? 0 : -1;
    if (axis < 0) continue;
    s.global_shape = s.shape;
    s.shape[axis] /= shards;
    s.split_axis = axis;
    s.split_offset = s.shape[axis] * shard;
  }
  return specs;
}

/// Deterministic values of the whole model at `phase`.
std::vector<std::vector<float>> global_values(double phase,
                                              const std::vector<optim::ParameterSpec>& specs = global_specs()) {
  std::vector<std::vector<float>> out;
  for (const auto& s : specs) {
    std::vector<float> v(std::size_t(element_count(s.shape)));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(std::cos(0.3 * double(k) + phase + double(out.size())));
    out.push_back(v);
  }
  return out;
}

/// The elements of a global tensor that a local spec holds, in its row-major order (a band of a
/// column slice: its rows [row_offset, row_offset + shape[0]) only).
std::vector<float> slice(const optim::ParameterSpec& s, const std::vector<float>& global) {
  if (!s.split()) return global;
  const auto& g = s.global();
  std::int64_t outer = 1, inner = 1;
  for (int d = 1; d < s.split_axis; ++d) outer *= g[d];
  for (std::size_t d = std::size_t(s.split_axis) + 1; d < g.size(); ++d) inner *= g[d];
  const std::int64_t along = s.shape[s.split_axis], global_along = g[s.split_axis];
  // The outer index runs over the dimensions before the split axis, the rows first.
  const std::int64_t first_outer = s.split_axis > 0 ? s.row_offset * outer : 0;
  const std::int64_t end_outer = s.split_axis > 0 ? (s.row_offset + s.shape[0]) * outer : 1;
  std::vector<float> out;
  for (std::int64_t o = first_outer; o < end_outer; ++o)
    for (std::int64_t a = 0; a < along; ++a)
      for (std::int64_t i = 0; i < inner; ++i)
        out.push_back(global[std::size_t((o * global_along + s.split_offset + a) * inner + i)]);
  return out;
}

TensorList<float, Mem> device_tensors(const std::vector<optim::ParameterSpec>& specs,
                                      const std::vector<std::vector<float>>& global) {
  TensorList<float, Mem> out;
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const auto values = slice(specs[p], global[p]);
    FlatTensor<float, Mem> v("t", values.size());
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t k = 0; k < values.size(); ++k) h(k) = values[k];
    Kokkos::deep_copy(v, h);
    out.push_back(v);
  }
  return out;
}

/// The options every case starts from: 8 x 8 blocks, small dimensions merged up to 16, roots from
/// the first step and every second, a graft normalized by each tensor's norm.
optim::ShampooOptions small_block_options() {
  optim::ShampooOptions o;
  o.learning_rate = optim::LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.merge_small_dims_block_size = 16;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;
  o.graft_type = optim::GraftType::rmsprop_normalized;
  return o;
}

struct Mode {
  const char* name;
  optim::StepMode step_mode;
  bool balanced, quantized;
  int shards;
  optim::PreconditionerType side = optim::PreconditionerType::all;
  bool async_roots = false;
  bool mpi_gather = false;               // the parameter all-gather through MPI even on one node
  int host_threads = 0;                  // product_host_threads (0: from the node; the element-wise passes follow)
  long unpreconditioned_block_size = 0;  // one-sided blocks' extent along the dimensions without a statistic
  optim::GraftGranularity graft_granularity = optim::GraftGranularity::tensor;
  bool kl = false;  // KL-Shampoo's statistics; grafted per tensor, with no graft at all
};

class DistributedShampoo : public ::testing::TestWithParam<Mode> {};

// Each block is updated by exactly one rank with the single-rank kernels on the same data, and
// each root by one rank; the values travel as raw bytes. What may differ is the order of the
// double-precision sums of the per-tensor norms (over units and ranks), which moves a float
// grafting multiplier by at most an ulp: the assertion allows 1e-6 relative, well below the
// 1e-2 an update of lr 0.02 makes.
TEST_P(DistributedShampoo, EqualsSingleRank) {
  const Mode mode = GetParam();
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks % mode.shards != 0) GTEST_SKIP() << mode.shards << " weight shards need a multiple of ranks";
  optim::ShampooOptions o = small_block_options();
  o.step_mode = mode.step_mode;
  o.balance_root_work = mode.balanced;
  o.best_effort_memory_usage_reduction = mode.quantized;
  o.preconditioner_type = mode.side;
  if (mode.async_roots) {
    o.async_roots = true;
    o.root.method = linalg::RootMethod::eigh;
  }
  o.root.workspace_bytes = 8 << 10;  // several root chunks and gram batches
  o.shared_memory_gather = !mode.mpi_gather;
  o.product_host_threads = mode.host_threads;
  o.unpreconditioned_block_size = mode.unpreconditioned_block_size;
  o.graft_granularity = mode.graft_granularity;
  // Per block, RMSProp without the normalization (which divides by the whole tensor's norm).
  if (mode.graft_granularity == optim::GraftGranularity::block) o.graft_type = optim::GraftType::rmsprop;
  o.kl_shampoo = mode.kl;
  if (mode.kl && mode.graft_granularity == optim::GraftGranularity::tensor) o.graft_type = optim::GraftType::none;
  const comm::Mesh mesh(MPI_COMM_WORLD, mode.shards);
  const auto specs = local_specs(mode.shards, mesh.shard());
  optim::Shampoo<Space, float> distributed(Space(), specs, o, mesh);
  optim::Shampoo<Space, float> single(Space(), global_specs(), o);
  EXPECT_EQ(distributed.distributed(), mode.step_mode == optim::StepMode::distributed && mesh.replicas() > 1);
  auto p1 = device_tensors(specs, global_values(0.0)), p2 = device_tensors(global_specs(), global_values(0.0));
  for (int step = 0; step < 5; ++step) {
    const auto g = global_values(1.0 + step);
    distributed.step(Space(), p1, device_tensors(specs, g));
    single.step(Space(), p2, device_tensors(global_specs(), g));
  }
  const auto a = test::host_vectors(p1), b = test::host_vectors(p2);
  // Device builds: how far one rank's own steps move when its gradients move by one ulp
  // (split_step_tolerance.hpp: quantized codes flip under last-bit changes).
  std::vector<double> sensitivity(b.size(), 0.0);
  if constexpr (!test::bits_reproduce_across_splits<Mem>) {
    std::vector<std::vector<std::vector<float>>> nudged;
    for (std::uint64_t pattern : test::nudge_patterns) {
      optim::Shampoo<Space, float> rerun(Space(), global_specs(), o);
      auto p3 = device_tensors(global_specs(), global_values(0.0));
      for (int step = 0; step < 5; ++step) {
        const auto g = device_tensors(global_specs(), global_values(1.0 + step));
        test::nudge_last_bits(g, pattern * 100 + std::uint64_t(step));
        rerun.step(Space(), p3, g);
      }
      nudged.push_back(test::host_vectors(p3));
    }
    sensitivity = test::rounding_sensitivity(nudged, b, mode.quantized);
  }
  for (std::size_t p = 0; p < a.size(); ++p) {
    const auto expected = slice(specs[p], b[p]);
    test::expect_split_close<Space::memory_space>(
        a[p], expected, std::string(mode.name) + " " + specs[p].name + " on " + std::to_string(ranks) + " ranks",
        sensitivity[p]);
  }
  // Every statistic of this shard has one root owner in the group, and all agree on the metrics.
  const int replicas = mesh.replicas();
  double error_sum = 0;
  for (const auto& m : distributed.metrics()) {
    if (m.owner_rank < 0) continue;  // another shard's
    ASSERT_LT(m.owner_rank, replicas);
    error_sum += m.error;
  }
  EXPECT_EQ(mesh.data_parallel().allreduce(error_sum, comm::Combine::min),
            mesh.data_parallel().allreduce(error_sum, comm::Combine::max));
  // Distributed, a rank stores the statistics and per-element state of its share only.
  if (distributed.distributed()) {
    const auto mine = distributed.memory_report();
    const auto all = single.memory_report();
    EXPECT_LT(mine.stack_bytes + mine.quantized_bytes, all.stack_bytes + all.quantized_bytes);
    EXPECT_LT(mine.local_bytes + mine.quantized_bytes, all.local_bytes + all.quantized_bytes);
  }
}

using optim::StepMode;
INSTANTIATE_TEST_SUITE_P(
    Modes, DistributedShampoo,
    ::testing::Values(
        Mode{"replicated_balanced", StepMode::replicated, true, false, 1},
        Mode{"replicated_even_quantized", StepMode::replicated, false, true, 1},
        Mode{"distributed", StepMode::distributed, true, false, 1},
        Mode{"distributed_quantized", StepMode::distributed, true, true, 1},
        Mode{"distributed_mpi_gather", StepMode::distributed, true, false, 1, optim::PreconditionerType::all, false,
             true},
        Mode{"replicated_shards2", StepMode::replicated, true, false, 2},
        Mode{"distributed_shards2", StepMode::distributed, true, false, 2},
        Mode{"distributed_shards2_quantized", StepMode::distributed, true, true, 2},
        Mode{"distributed_one_sided_input", StepMode::distributed, true, false, 1, optim::PreconditionerType::input},
        Mode{"replicated_shards2_one_sided_output", StepMode::replicated, true, false, 2,
             optim::PreconditionerType::output},
        Mode{"replicated_async_roots", StepMode::replicated, true, false, 1, optim::PreconditionerType::all, true},
        Mode{"distributed_async_roots", StepMode::distributed, true, false, 1, optim::PreconditionerType::all, true},
        // On a serial host backend the products and the element-wise passes (the
        // gathered parameters' scatter among them) on 3 host threads.
        Mode{"distributed_quantized_host_threads3", StepMode::distributed, true, true, 1,
             optim::PreconditionerType::all, false, false, 3},
        // One-sided blocks whole along their last dimension ("dense" 8 x 12 blocks,
        // "tall" 8 x 5), and cut at 4 there with weight shards ("wide"'s slices of 8
        // columns hold two such blocks each).
        Mode{"distributed_one_sided_input_whole_rows", StepMode::distributed, true, false, 1,
             optim::PreconditionerType::input, false, false, 0, 1000},
        Mode{"distributed_shards2_quantized_one_sided_input_extent4", StepMode::distributed, true, true, 2,
             optim::PreconditionerType::input, false, false, 0, 4},
        // Grafted per block (Meta's): each block's norms are its owner's alone.
        Mode{"replicated_block_graft", StepMode::replicated, true, false, 1, optim::PreconditionerType::all, false,
             false, 0, 0, optim::GraftGranularity::block},
        Mode{"distributed_shards2_quantized_block_graft", StepMode::distributed, true, true, 2,
             optim::PreconditionerType::all, false, false, 0, 0, optim::GraftGranularity::block},
        // KL-Shampoo: each block's statistics read its own preconditioners, wherever they live.
        Mode{"replicated_kl_no_graft", StepMode::replicated, true, false, 1, optim::PreconditionerType::all, false,
             false, 0, 0, optim::GraftGranularity::tensor, true},
        Mode{"distributed_kl_one_sided_input", StepMode::distributed, true, false, 1, optim::PreconditionerType::input,
             false, false, 0, 0, optim::GraftGranularity::tensor, true},
        Mode{"distributed_shards2_quantized_kl_block_graft", StepMode::distributed, true, true, 2,
             optim::PreconditionerType::all, false, false, 0, 0, optim::GraftGranularity::block, true}),
    [](const auto& info) { return std::string(info.param.name); });

// A NaN or Inf in one rank's gradient only (replicas should agree, but nothing may hang when they
// do not). Every element of the last rank's gradient is Inf. Every rank throws the same error
// before any state moves (replicated, every rank reads every gradient it keeps a copy of;
// distributed, every rank scans its whole gradient before it packs its own blocks, even when the
// last rank owns none), and the optimizer goes on with the next, finite, gradient as if the bad
// step had not been tried. ctest's timeout catches a hang.
TEST_P(DistributedShampoo, OneRanksInfIsAnErrorOnEveryRank) {
  const Mode mode = GetParam();
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (ranks % mode.shards != 0) GTEST_SKIP() << mode.shards << " weight shards need a multiple of ranks";
  optim::ShampooOptions o;
  o.learning_rate = optim::LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;
  o.step_mode = mode.step_mode;
  o.best_effort_memory_usage_reduction = mode.quantized;
  const comm::Mesh mesh(MPI_COMM_WORLD, mode.shards);
  const auto specs = local_specs(mode.shards, mesh.shard());
  optim::Shampoo<Space, float> shampoo(Space(), specs, o, mesh);
  optim::Shampoo<Space, float> clean(Space(), specs, o, mesh);
  auto params = device_tensors(specs, global_values(0.0)), reference = device_tensors(specs, global_values(0.0));
  shampoo.step(Space(), params, device_tensors(specs, global_values(1.0)));
  clean.step(Space(), reference, device_tensors(specs, global_values(1.0)));
  auto bad = device_tensors(specs, global_values(2.0));
  if (rank == ranks - 1)
    for (auto& g : bad) Kokkos::deep_copy(g, std::numeric_limits<float>::infinity());
  int threw = 0;
  try {
    shampoo.step(Space(), params, bad);
  } catch (const Error& e) {
    threw = 1;
    EXPECT_NE(e.message().find("NaN or Inf"), std::string::npos) << e.message();
  }
  const comm::Group world(MPI_COMM_WORLD);
  ASSERT_EQ(world.allreduce(threw, comm::Combine::min), world.allreduce(threw, comm::Combine::max))
      << "ranks disagree on the failed step";
  ASSERT_EQ(threw, 1) << "rank " << rank;
  shampoo.step(Space(), params, device_tensors(specs, global_values(3.0)));
  clean.step(Space(), reference, device_tensors(specs, global_values(3.0)));
  const auto a = test::host_vectors(params), b = test::host_vectors(reference);
  for (std::size_t p = 0; p < a.size(); ++p)
    for (std::size_t k = 0; k < a[p].size(); ++k) ASSERT_EQ(a[p][k], b[p][k]) << specs[p].name << " " << k;
}

// Construction is collective: a rank given another parameter, an invalid parameter list, other
// options or invalid options throws, and so does every other rank (before, a rank that failed
// left the others waiting in the roots' thread count or the first step: ctest's timeout catches a
// hang). Replicated on the world, and distributed with two weight shards, where the ranks of a
// shard group hold other slices (local shapes) of the same global parameters.
TEST(DistributedShampooConstruction, WhatOneRankWasGivenOtherwiseIsAnErrorOnEveryRank) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  const bool last = world.rank() == world.size() - 1;
  for (const int shards : {1, 2}) {
    if (world.size() % shards != 0) continue;
    const comm::Mesh mesh(MPI_COMM_WORLD, shards);
    optim::ShampooOptions o;
    o.block_size = 8;
    o.step_mode = shards == 1 ? optim::StepMode::replicated : optim::StepMode::distributed;
    const auto specs = local_specs(shards, mesh.shard());
    const auto expect_everywhere = [&](const char* what, const std::vector<optim::ParameterSpec>& given,
                                       const optim::ShampooOptions& options, const std::string& said) {
      std::string message;
      try {
        optim::Shampoo<Space, float> shampoo(Space(), given, options, mesh);
      } catch (const Error& e) {
        message = e.message();
      }
      const int threw = message.empty() ? 0 : 1;
      EXPECT_EQ(world.allreduce(threw, comm::Combine::min), 1)
          << what << " (" << shards << " shards): rank " << world.rank() << (threw ? " threw" : " did not throw");
      EXPECT_NE(message.find(said), std::string::npos) << what << ": " << message;
    };
    auto other_shape = specs, invalid = specs;
    if (last) {
      other_shape[1].shape = {20, 11};    // "dense": never split
      invalid[2].name = invalid[0].name;  // a name used twice
    }
    expect_everywhere("another shape", other_shape, o, "other parameters");
    expect_everywhere("a name used twice", invalid, o, "is used twice");
    auto other_options = o, invalid_options = o;
    if (last) {
      other_options.root.host_threads = 1;  // its thread count needs no node count: the old hang
      invalid_options.block_size = 0;
    }
    expect_everywhere("other options", specs, other_options, "options than rank 0");
    expect_everywhere("invalid options", specs, invalid_options, "block_size");
    // Nothing was left in flight: an optimizer built next steps on every rank.
    optim::Shampoo<Space, float> shampoo(Space(), specs, o, mesh);
    auto params = device_tensors(specs, global_values(0.0));
    shampoo.step(Space(), params, device_tensors(specs, global_values(1.0)));
  }
}

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

/// Fully sharded parameters (comm::ParameterShards in Shampoo's layouts): each rank updates the
/// rows of blocks it owns, with Shampoo built on the slices and the group as its weight shards;
/// with two weight shards, the shards' slices are cut into bands over the replicas ("broad"'s
/// column slices into pieces cut along two axes) and Shampoo sums over the whole mesh, counting
/// the pieces that several ranks hold once. Every block sees the single rank's data, so its
/// statistics and roots are the same bits; the per-tensor norms of grafting are summed over the
/// pieces in another order, and the int8 column scales are maxima over them: the tolerance is the
/// weight-shard case's (1e-6 relative).
struct ShardedMode {
  bool quantized;
  int weight_shards;
};

std::ostream& operator<<(std::ostream& out, const ShardedMode& mode) {
  return out << (mode.quantized ? "int8 momentum, " : "") << mode.weight_shards << " weight shards";
}

class ShardedShampoo : public ::testing::TestWithParam<ShardedMode> {};

TEST_P(ShardedShampoo, EqualsSingleRank) {
  const ShardedMode mode = GetParam();
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() % mode.weight_shards != 0) GTEST_SKIP() << "weight shards need a multiple of ranks";
  optim::ShampooOptions o = small_block_options();  // its graft's norms span the bands
  o.best_effort_memory_usage_reduction = mode.quantized;
  // "pairs" [8, 2] is read as one vector of 16 (rows merged with their 2 columns), its 8-element
  // blocks 4 rows each; "broad" [24, 16] has three rows of blocks in each column slice.
  auto specs = global_specs();
  specs.push_back({"pairs", {8, 2}});
  specs.push_back({"broad", {24, 16}});
  const comm::Mesh mesh(world, mode.weight_shards);
  const auto slices = local_specs(mode.weight_shards, mesh.shard(), specs);  // this weight shard's
  const auto layouts = optim::shampoo_shard_layouts(slices, o);
  EXPECT_TRUE(layouts[5].replicated);  // "scale", a scalar: every rank
  EXPECT_EQ(layouts[1].unit_rows, 8);  // "dense": rows of 8-row blocks
  EXPECT_EQ(layouts[2].unit_rows, 8);  // "conv", [9, 4, 6]: 8 of its 3 rows, whole
  EXPECT_EQ(layouts[7].unit_rows, 4);  // "pairs": 4 rows, 8 elements
  EXPECT_EQ(layouts[8].unit_rows, 8);  // "broad", or its column slices: rows of 8-row blocks
  comm::ParameterShards<Space, float> shards(Space(), mesh.data_parallel(), slices, {{0, specs.size()}}, layouts);
  shards.scatter_values(Space(), device_tensors(slices, global_values(0.0, specs)));
  const comm::Group& pieces = mode.weight_shards > 1 ? mesh.world() : mesh.data_parallel();
  if (mode.quantized && mode.weight_shards > 1 && mesh.replicas() > 1) {
    // "broad"'s column slices are cut into bands of rows, whose int8 momentum is refused.
    const auto build = [&] {
      optim::Shampoo<Space, float> refused(Space(), shards.slices().specs(), o, comm::Group(), pieces);
    };
    EXPECT_THROW(build(), lather::Error);
    return;
  }
  optim::Shampoo<Space, float> sharded(Space(), shards.slices().specs(), o, comm::Group(), pieces);
  optim::Shampoo<Space, float> single(Space(), specs, o);
  auto whole = device_tensors(specs, global_values(0.0, specs));
  for (int step = 0; step < 5; ++step) {
    const auto g = global_values(1.0 + step, specs);
    const auto bands = device_tensors(shards.slices().specs(), g);  // this rank's piece of each gradient
    for (std::size_t p = 0; p < specs.size(); ++p) Kokkos::deep_copy(shards.slices().gradient(p), bands[p]);
    sharded.step(Space(), shards.slices());
    single.step(Space(), whole, device_tensors(specs, g));
  }
  auto gathered = device_tensors(slices, global_values(9.0, specs));
  shards.gather_values(Space(), gathered);
  const auto a = test::host_vectors(gathered), b = test::host_vectors(whole);
  for (std::size_t p = 0; p < a.size(); ++p)
    test::expect_split_close<Space::memory_space>(a[p], slice(slices[p], b[p]),
                                                  specs[p].name + " sharded over " + std::to_string(world.size()) +
                                                      " ranks, " + std::to_string(mode.weight_shards) +
                                                      " weight shards",
                                                  0.0);
}

// Pieces of a split tensor that overlap without being equal are refused on every rank.
TEST(ShardedShampooConstruction, PiecesThatOverlapAreAnErrorOnEveryRank) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  // The last rank claims rows [8, 24) of "dense" [24, 12], the others [0, 16): they overlap.
  const bool last = world.rank() == world.size() - 1;
  optim::ParameterSpec band{"dense", {16, 12}};
  band.split_axis = 0, band.split_offset = last ? 8 : 0, band.global_shape = {24, 12}, band.band_of_whole = true;
  try {
    optim::Shampoo<Space, float> shampoo(Space(), {band}, small_block_options(), comm::Group(), world);
    ADD_FAILURE() << "overlapping pieces were accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("pieces of parameter 'dense'"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardedShampoo,
                         ::testing::Values(ShardedMode{false, 1}, ShardedMode{true, 1}, ShardedMode{false, 2},
                                           ShardedMode{true, 2}));

}  // namespace
