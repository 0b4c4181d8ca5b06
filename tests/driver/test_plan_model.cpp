// The cost model of lather-bench plan (perf/plan_model.hpp) against its closed forms: the
// alpha-beta collectives, and a step assembled from them by hand for each kind of layout.
#include "plan_model.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using namespace lather::plan;

const Network net{2e-6, 1e-10, "test"};

TEST(PlanModel, CollectivesFollowTheAlphaBetaForms) {
  EXPECT_EQ(log2_ceil(1), 0);
  EXPECT_EQ(log2_ceil(2), 1);
  EXPECT_EQ(log2_ceil(3), 2);
  EXPECT_EQ(log2_ceil(4096), 12);
  EXPECT_EQ(allreduce_seconds(net, 1, 1e9), 0.0);
  // 8 ranks, 1 MB: 2 * 3 messages and 2 * 7/8 of the bytes.
  EXPECT_DOUBLE_EQ(allreduce_seconds(net, 8, 1e6), 6 * 2e-6 + 1.75 * 1e6 * 1e-10);
  EXPECT_DOUBLE_EQ(allgather_seconds(net, 8, 1e6), 3 * 2e-6 + 0.875 * 1e6 * 1e-10);
  EXPECT_DOUBLE_EQ(send_seconds(net, 1e6), 2e-6 + 1e-4);
}

ModelCosts costs() {
  ModelCosts c;
  c.model = "transformer";
  c.rows_per_sample = 64;
  // 1e-3 + 1e-5 rows, measured at 256, 512 and 2048 rows.
  c.pass_rows = {256, 512, 2048};
  c.pass_seconds = {1e-3 + 1e-5 * 256, 1e-3 + 1e-5 * 512, 1e-3 + 1e-5 * 2048};
  c.optimizer_seconds = 4e-3;
  c.parameters = 1e6;
  c.optimizer_state_bytes = 8e6;
  c.activation_bytes_per_row = 1000;
  c.tensor_parallel_allreduces = 19;
  c.tensor_parallel_bytes_per_row = 19 * 512;
  c.stream_bytes_per_row = 512;
  c.layers = 4;
  return c;
}

TEST(PlanModel, PassesInterpolateBetweenTheMeasuredRows) {
  ModelCosts c;
  c.pass_rows = {100, 200, 400};
  c.pass_seconds = {1.0, 1.5, 3.5};
  EXPECT_DOUBLE_EQ(c.passes_seconds(100), 1.0);
  EXPECT_DOUBLE_EQ(c.passes_seconds(150), 1.25);
  EXPECT_DOUBLE_EQ(c.passes_seconds(300), 2.5);
  EXPECT_DOUBLE_EQ(c.passes_seconds(800), 7.5);  // the last segment, extended
  EXPECT_DOUBLE_EQ(c.passes_seconds(50), 0.75);  // the first, extended
  EXPECT_DOUBLE_EQ(c.passes_seconds(0), 0.5);
}

TEST(PlanModel, OneRankIsItsPassesAndItsOptimizer) {
  const auto p = predict(costs(), net, Layout(), 32);
  EXPECT_DOUBLE_EQ(p.compute, 1e-3 + 1e-5 * 32 * 64);
  EXPECT_EQ(p.reduction, 0.0);
  EXPECT_EQ(p.tensor_parallel, 0.0);
  EXPECT_DOUBLE_EQ(p.step, p.compute + 4e-3);
  EXPECT_DOUBLE_EQ(p.memory_bytes, 2 * 4e6 + 8e6 + 32 * 64 * 1000);
}

TEST(PlanModel, ReplicasAddTheReductionAndOverlapHidesAllButTheLastBucket) {
  Layout l;
  l.replicas = 4;
  const auto p = predict(costs(), net, l, 32);
  const double reduction = 2 * 2 * 2e-6 + 2 * 0.75 * 4e6 * 1e-10;  // one 4 MB bucket
  EXPECT_DOUBLE_EQ(p.reduction, reduction);
  EXPECT_DOUBLE_EQ(p.step, p.compute + reduction + 4e-3 + 2 * allreduce_seconds(net, 4, 8));
  l.overlap = true;
  l.bucket_bytes = 1e6;  // four buckets
  const auto q = predict(costs(), net, l, 32);
  EXPECT_DOUBLE_EQ(q.reduction, 4 * 2 * 2 * 2e-6 + 2 * 0.75 * 4e6 * 1e-10);
  EXPECT_DOUBLE_EQ(q.exposed, q.reduction / 4);  // the backward is far longer than the rest
  EXPECT_NEAR(scaling_efficiency(predict(costs(), net, Layout(), 32), q, l), (p.compute + 4e-3) / q.step, 1e-12);
}

TEST(PlanModel, ShardsAndStagesSplitTheWorkAndAddTheirTransfers) {
  Layout l;
  l.shards = 2;
  const auto s = predict(costs(), net, l, 32);
  const double rows = 32 * 64;
  EXPECT_DOUBLE_EQ(s.compute, (1e-3 + 1e-5 * rows) / 2);
  EXPECT_DOUBLE_EQ(s.tensor_parallel, 19 * 2 * 2e-6 + 2 * 0.5 * rows * 19 * 512 * 1e-10);
  EXPECT_DOUBLE_EQ(s.optimizer, 2e-3);
  Layout p;
  p.stages = 2;
  p.micro_batches = 4;
  const auto t = predict(costs(), net, p, 32);
  const double micro = (1e-3 + 1e-5 * rows / 4) / 2;
  EXPECT_DOUBLE_EQ(t.compute, 5 * micro);  // M + P - 1 slots
  EXPECT_DOUBLE_EQ(t.pipeline, 2 * send_seconds(net, rows / 4 * 512));
  EXPECT_DOUBLE_EQ(t.memory_bytes, 2 * 2e6 + 4e6 + 2 * (rows / 4) * 1000 / 2);
}

TEST(PlanModel, ADistributedStepSplitsTheOptimizerAndGathersTheParameters) {
  auto c = costs();
  c.distributed_step = true;
  c.optimizer_split_bytes = 6e6;  // 2e6 of the 8e6 stays on every replica
  Layout l;
  l.replicas = 8;
  const auto p = predict(c, net, l, 32);
  EXPECT_DOUBLE_EQ(p.optimizer, 4e-3 / 8 + allgather_seconds(net, 8, 4e6));
  EXPECT_DOUBLE_EQ(p.memory_bytes, 2 * 4e6 + 2e6 + 6e6 / 8 + 32 * 64 * 1000);
}

TEST(PlanModel, ShardedParametersGatherEveryLayerAndSplitTheOptimizerWithoutAnAllGather) {
  auto c = costs();
  // Four layers of 1e5, 4e5, 3e5 and 2e5 parameters (1e6 in all), two tensors each.
  c.layer_parameters = {1e5, 4e5, 3e5, 2e5};
  Layout l;
  l.replicas = 4;
  l.sharded = true;
  l.micro_batches = 2;
  const auto p = predict(c, net, l, 32);
  // A layer of n parameters: two tensors of 2n bytes each over 4 ranks.
  const auto layer = [](double n) { return 2 * allgather_seconds(net, 4, 4 * n / 2); };
  const double all = layer(1e5) + layer(4e5) + layer(3e5) + layer(2e5);
  // First pass: 4 layers forward, the 2 before the last two backward; second pass: 2 and 2.
  const double gathers = (all + layer(1e5) + layer(4e5)) + (layer(3e5) + layer(2e5) + layer(1e5) + layer(4e5));
  EXPECT_NEAR(p.reduction, gathers + 2 * all, 1e-15);
  EXPECT_DOUBLE_EQ(p.exposed, p.reduction);
  EXPECT_DOUBLE_EQ(p.optimizer, 4e-3 / 4);
  const double rows = 32 * 64;
  EXPECT_DOUBLE_EQ(p.compute, 2 * (1e-3 + 1e-5 * rows / 2));
  EXPECT_NEAR(p.step, p.compute + p.reduction + 4e-3 / 4 + 3 * allreduce_seconds(net, 4, 8), 1e-15);
  // Bands of values, gradients and state, two buffers (the largest even and odd layers: 3e5 and
  // 4e5) of values and gradients, one micro-batch's activations.
  EXPECT_DOUBLE_EQ(p.memory_bytes, (2 * 4e6 + 8e6) / 4 + 2 * 4 * (3e5 + 4e5) + rows / 2 * 1000);
}

TEST(PlanModel, ShardedLayersGatherTheirTensorsAndShardedMuonExchangesItsMatrices) {
  auto c = costs();
  // An embedding of 2 tensors, two blocks of 16, a head of 4; Muon's 3 matrices, 3e6 bytes.
  c.layer_parameters = {1e5, 4e5, 3e5, 2e5};
  c.layer_tensors = {2, 16, 16, 4};
  c.sharded_matrix_exchanges = 3;
  c.sharded_matrix_bytes = 3e6;
  Layout l;
  l.replicas = 4;
  l.sharded = true;
  const auto p = predict(c, net, l, 32);
  const auto layer = [](double n, double tensors) { return tensors * allgather_seconds(net, 4, 4 * n / tensors); };
  const double all = layer(1e5, 2) + layer(4e5, 16) + layer(3e5, 16) + layer(2e5, 4);
  // One pass: every layer forward, the two before the last two backward; every layer reduced.
  EXPECT_NEAR(p.reduction, (all + layer(1e5, 2) + layer(4e5, 16)) + all, 1e-15);
  EXPECT_NEAR(p.optimizer, 4e-3 / 4 + 2 * (3 * net.alpha + 3.0 / 4 * 3e6 * net.beta), 1e-15);
  // One rank: no exchange.
  l.replicas = 1;
  EXPECT_DOUBLE_EQ(predict(c, net, l, 32).optimizer, 4e-3);
}

// Muon with weight shards: each matrix whole on one shard of the replica, so the shards split
// whole matrices ({3, 1, 1, 1} over 2: half the work) and each matrix's slices go to its owner
// and back; every replica does the same, so no distributed step over the replicas.
TEST(PlanModel, MuonWithWeightShardsSplitsWholeMatricesOverTheShards) {
  auto c = costs();
  c.distributed_step = true;
  c.optimizer_unit_costs = {3, 1, 1, 1};
  c.sharded_matrix_exchanges = 4;
  c.sharded_matrix_bytes = 3e6;
  Layout l;
  l.replicas = 2;
  l.shards = 2;
  EXPECT_NEAR(predict(c, net, l, 32).optimizer, 4e-3 * 0.5 + 2 * (4 * net.alpha + 0.5 * 3e6 * net.beta), 1e-15);
  l.stages = 2;  // each stage's half of the matrices
  EXPECT_NEAR(predict(c, net, l, 32).optimizer, (4e-3 / 2 * 0.5 + 2 * (4 * net.alpha + 0.5 * 3e6 * net.beta) / 2),
              1e-15);
  // Without weight shards Muon is a distributed step over the replicas, as before.
  l.stages = 1;
  l.shards = 1;
  EXPECT_DOUBLE_EQ(predict(c, net, l, 32).optimizer,
                   4e-3 * largest_share({3, 1, 1, 1}, 2) + allgather_seconds(net, 2, 4.0 * c.parameters));
}

TEST(PlanModel, TheOptimizerTakesTheMostLoadedRanksShareOfWholeUnits) {
  // Greedy longest-processing-time: {3, 1, 1, 1} on 2 ranks is 3 | 1 1 1, on 4 ranks 3 | 1 | 1 | 1.
  EXPECT_DOUBLE_EQ(largest_share({3, 1, 1, 1}, 2), 0.5);
  EXPECT_DOUBLE_EQ(largest_share({3, 1, 1, 1}, 4), 0.5);
  EXPECT_DOUBLE_EQ(largest_share({1, 1, 1, 1}, 4), 0.25);
  EXPECT_DOUBLE_EQ(largest_share({}, 8), 1.0 / 8);
  auto c = costs();
  c.distributed_step = true;
  c.optimizer_unit_costs = {3, 1, 1, 1};
  Layout l;
  l.replicas = 4;
  EXPECT_DOUBLE_EQ(predict(c, net, l, 32).optimizer, 4e-3 * 0.5 + allgather_seconds(net, 4, 4e6));
  c.layer_parameters = {1e5, 4e5, 3e5, 2e5};
  l.sharded = true;
  EXPECT_DOUBLE_EQ(predict(c, net, l, 32).optimizer, 4e-3 * 0.5);
}

}  // namespace
