// lather-train --model transformer --shard-parameters under mpiexec -n 4, on the small model and
// text of language_model_runs.hpp: the sharded run's loss curve over 50 steps is the replicated
// run's for AdamW (2 ranks with accumulation, 4 ranks as 2 replicas of 2 weight shards), Shampoo
// (3 ranks, and 2 replicas of 2 weight shards), SOAP (2) and Muon (4 with accumulation); a Shampoo checkpoint crosses
// from a sharded run on 4 ranks to a replicated one on 2 and on to a sharded one on 3; a failure on one rank in a
// sharded step is an error on every rank (ctest's timeout catches a hang).
#include "language_model_runs.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <cstring>
#include <vector>

namespace {

using namespace lather::test;

/// Sharded and replicated runs sum the gradients in different orders (a reduce-scatter per layer
/// and micro-batch, against the reducer's sum of whole micro-batch sums): ~1e-7 relative per step,
/// which Adam carries into the parameters; over 50 steps the loss moves by far less than 1e-4 of
/// itself (test_sharded_training.cpp measures the same for the MLP). A wrong band, a lost
/// micro-batch or a stale gather moves it by percents. SOAP amplifies the same noise through its
/// rank-deficient factors, as between rank counts (test_training.cpp argues its 2e-3).
double tolerance_of(lather::train::OptimizerKind optimizer) {
  return optimizer == lather::train::OptimizerKind::soap ? 2e-3 : 1e-4;
}

TEST(ShardedTransformer, LossCurveIsTheReplicatedRuns) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  using lather::train::OptimizerKind;
  struct Layout {
    int ranks, shards, accumulate;
    OptimizerKind optimizer;
  };
  for (const Layout l : {Layout{2, 1, 2, OptimizerKind::adamw}, Layout{4, 2, 1, OptimizerKind::adamw},
                         Layout{3, 1, 1, OptimizerKind::shampoo}, Layout{4, 2, 1, OptimizerKind::shampoo},
                         Layout{2, 1, 1, OptimizerKind::soap}, Layout{4, 1, 2, OptimizerKind::muon},
                         Layout{4, 2, 1, OptimizerKind::soap}, Layout{4, 2, 1, OptimizerKind::muon}}) {
    auto o = small_run();
    o.optimizer = l.optimizer;
    o.weight_shards = l.shards;
    o.accumulate = l.accumulate;
    // Blocks inside the shards' slices, as lather-train chooses them.
    if (l.optimizer == OptimizerKind::shampoo || l.optimizer == OptimizerKind::soap)
      o.shampoo = {"block_size=" + std::to_string(lather::train::transformer_block_size(o.d_model, l.shards))};
    const std::string what = std::to_string(l.ranks) + " ranks, weight shards " + std::to_string(l.shards) +
                             ", accumulate " + std::to_string(l.accumulate) + ", " + to_string(l.optimizer);
    const Curve replicated = run(o, l.ranks, "replicated");
    o.shard_parameters = true;
    const Curve sharded = run(o, l.ranks, "sharded");
    if (world_rank() == 0) expect_same_curve(sharded, replicated, tolerance_of(l.optimizer), what);
  }
}

TEST(ShardedTransformer, CheckpointsCrossBetweenShardedAndReplicatedRunsAndRankCounts) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  auto o = small_run();
  o.optimizer = lather::train::OptimizerKind::shampoo;  // statistics by their number in the model
  const Curve whole = run(o, 2, "whole");
  // Every rank names the directory of rank 0 (the process ids differ).
  std::vector<char> name(4096, 0);
  if (world_rank() == 0) {
    const auto dir = fs::temp_directory_path() / ("lather-lm-sharded-ckpt-" + std::to_string(getpid()));
    std::strncpy(name.data(), dir.c_str(), name.size() - 1);
  }
  MPI_Bcast(name.data(), int(name.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  o.checkpoint_dir = name.data();
  // SIGTERM at a step's line stops after the next step: sharded on 4 ranks to step 16, replicated
  // on 2 to step 31, sharded on 3 to the end. The line after each resume averages a shorter
  // window, so the curves are compared from the last part's second line.
  o.shard_parameters = true;
  (void)run(o, 4, "cross", 15);
  o.resume = true;
  o.shard_parameters = false;
  (void)run(o, 2, "cross", 30);
  o.shard_parameters = true;
  const Curve last = run(o, 3, "cross");
  if (world_rank() == 0) {
    Curve tail = whole;
    tail.losses.erase(tail.losses.begin(), tail.losses.lower_bound(40));
    for (const auto& [step, loss] : tail.losses) {
      ASSERT_EQ(last.losses.count(step), 1u) << "no loss at step " << step;
      EXPECT_NEAR(last.losses.at(step), loss, 1e-4 * loss) << "sharded 4 -> replicated 2 -> sharded 3 at step " << step;
    }
    EXPECT_NEAR(last.validation, whole.validation, 1e-4 * whole.validation) << "validation loss";
    fs::remove_all(o.checkpoint_dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

void fail_on_the_last_rank(const char* point) {
  static int calls = 0;
  // The 12th gather: in the second step's passes (8 a step: 4 layers, forward and backward).
  if (std::strcmp(point, "parameter_shards.need") == 0 && world_rank() == world_size() - 1 && ++calls == 12)
    throw lather::Error("injected failure in a sharded step", nullptr, 0);
}

TEST(ShardedTransformer, AFailureOnOneRankIsAnErrorOnEveryRank) {
  auto o = small_run();
  o.shard_parameters = true;
  o.max_steps = 3;
  lather::Impl::set_fault_hook(&fail_on_the_last_rank);
  try {
    train(o, MPI_COMM_WORLD, [](const std::string&) {});
    ADD_FAILURE() << "no error on rank " << world_rank();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure in a sharded step"), std::string::npos) << e.what();
  }
  lather::Impl::set_fault_hook(nullptr);
}

TEST(ShardedTransformer, PipelineStagesAreRefused) {
  auto o = small_run();
  o.shard_parameters = true;
  o.pipeline_stages = 2;
  try {
    o.validate();
    ADD_FAILURE() << "no error";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--shard-parameters"), std::string::npos) << e.what();
  }
}

}  // namespace
