// lather-train --shard-parameters under mpiexec -n 8, on a small MLP and a slice of Fashion-MNIST:
// the sharded run's loss curve over 50 steps is the replicated run's on 1, 2, 3, 4 and 8 ranks
// (sub-communicators) for AdamW, Shampoo, SOAP and Muon, also with weight shards 2 on 2, 4 and 8,
// and with SGD for the first-order path, with accumulation; checkpoints of each optimizer (with weight
// shards: Shampoo, SOAP and Muon) cross between sharded and replicated runs and rank counts; SOAP with
// weight shards stopped and resumed on the same layout gives the uninterrupted losses exactly; a
// failure on one rank in a sharded step or evaluation is an error on every rank (ctest's timeout
// catches a hang).
#include "mlp_runs.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <sstream>

namespace {

using namespace lather::test;

TrainOptions fifty_steps(const std::string& optimizer) {
  auto o = small_run(optimizer);
  o.train_samples = 3200;  // 50 steps of 64
  o.test_samples = 128;
  o.log_every = 5;
  return o;
}

/// Sharded and replicated runs reduce in different orders (a reduce-scatter per layer and
/// micro-batch, against the reducer's sum of whole micro-batch sums): float sums of 64-sample
/// gradients differ by ~1e-7 relative per step, and Adam's and SGD's updates carry that into the
/// parameters; over 50 steps the loss moves by far less than 1e-4 of itself (measured: at most
/// 3e-8; Adam's division by sqrt(v) grows such differences about e-fold every 10 steps, so the
/// curves part by 1e-3 after 100 steps). A wrong band, a lost micro-batch or a stale gather moves
/// the loss by percents. SOAP amplifies the same noise through its rank-deficient factors to 2e-4
/// of the loss within these steps, as it does between rank counts (test_training.cpp argues its
/// 2e-3).
constexpr double tolerance = 1e-4;
double tolerance_of(const std::string& optimizer) { return optimizer == "soap" ? 2e-3 : tolerance; }

TEST(ShardedTraining, LossCurveIsTheReplicatedRunsOnEveryRankCount) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  struct Layout {
    int ranks, shards, accumulate;
    const char* optimizer;
  };
  std::vector<Layout> runs = {{1, 1, 1, "adamw"}, {2, 1, 2, "adamw"}, {3, 1, 1, "adamw"}, {4, 1, 1, "sgd"},
                              {8, 1, 1, "adamw"}, {2, 2, 1, "adamw"}, {4, 2, 2, "adamw"}};
  // The matrix optimizers: Shampoo's and SOAP's rows of blocks, Muon's rows gathered to their owner.
  for (const char* optimizer : {"shampoo", "soap", "muon"})
    for (int ranks : {1, 2, 3, 4, 8}) runs.push_back({ranks, 1, ranks == 2 ? 2 : 1, optimizer});
  // With weight shards: Shampoo and SOAP on bands of each shard's slices (of its column slices:
  // pieces cut along two axes), their norms summed over the whole mesh; Muon's pieces, cut alike,
  // gathered to each matrix's owner over the whole mesh.
  for (const char* optimizer : {"shampoo", "soap", "muon"})
    for (int ranks : {2, 4, 8}) runs.push_back({ranks, 2, ranks == 8 ? 2 : 1, optimizer});
  if (const char* only = std::getenv("LATHER_TEST_SHARDED_OPTIMIZER"))  // a quicker run of one optimizer
    runs.erase(
        std::remove_if(runs.begin(), runs.end(), [&](const Layout& l) { return l.optimizer != std::string(only); }),
        runs.end());
  for (const Layout& l : runs) {
    auto o = fifty_steps(l.optimizer);
    o.weight_shards = l.shards;
    o.accumulate = l.accumulate;
    const std::string what = std::to_string(l.ranks) + " ranks, weight shards " + std::to_string(l.shards) +
                             ", accumulate " + std::to_string(l.accumulate) + ", " + l.optimizer;
    MPI_Comm comm = first_ranks(l.ranks);
    const auto replicated = losses(o, comm, "replicated");
    o.shard_parameters = true;
    const auto sharded = losses(o, comm, "sharded");
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    if (world_rank() == 0) {
      ASSERT_EQ(replicated.size(), 10u) << what;
      expect_same_curve(sharded, replicated, tolerance_of(l.optimizer), what);
    }
  }
}

/// A run of `steps` steps on the first `ranks` ranks, saving its final checkpoint in `directory`
/// (resuming from the newest there when `resume`); returns rank 0's loss curve.
std::vector<double> run_part(TrainOptions o, int ranks, bool shard, long steps, const std::string& directory,
                             bool resume) {
  o.shard_parameters = shard;
  o.max_steps = steps;
  o.checkpoint_dir = directory;
  o.resume = resume;
  MPI_Comm comm = first_ranks(ranks);
  const auto curve = losses(o, comm, "part");
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  return curve;
}

/// A checkpoint directory that every rank names as rank 0 does (the process ids differ).
std::string shared_directory(const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / ("lather-test-sharded-resume-" + name + "-" + std::to_string(getpid()))).string();
  std::vector<char> dir_name(4096, 0);
  if (world_rank() == 0) std::strncpy(dir_name.data(), dir.c_str(), dir_name.size() - 1);
  MPI_Bcast(dir_name.data(), int(dir_name.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  return dir_name.data();
}

/// A chain of runs through one checkpoint directory, against one run of the whole 50 steps.
struct Chain {
  const char* optimizer;
  int weight_shards;
  int whole_ranks;  // the run of all 50 steps, replicated
  int ranks[3];     // sharded to step 20, replicated to 35, sharded to 50
};

std::ostream& operator<<(std::ostream& out, const Chain& c) {
  return out << c.optimizer << ", " << c.weight_shards << " weight shards: sharded " << c.ranks[0]
             << " ranks -> replicated " << c.ranks[1] << " -> sharded " << c.ranks[2];
}

class Checkpoints : public ::testing::TestWithParam<Chain> {};

TEST_P(Checkpoints, CrossBetweenShardedAndReplicatedRunsAndRankCounts) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  const Chain chain = GetParam();
  const std::string name = std::string(chain.optimizer) + "-" + std::to_string(chain.weight_shards);
  auto o = fifty_steps(chain.optimizer);
  o.weight_shards = chain.weight_shards;
  const auto whole = run_part(o, chain.whole_ranks, false, 50, "", false);
  const std::string shared_dir = shared_directory(name);
  auto curve = run_part(o, chain.ranks[0], true, 20, shared_dir, false);
  const auto middle = run_part(o, chain.ranks[1], false, 35, shared_dir, true);
  const auto last = run_part(o, chain.ranks[2], true, 50, shared_dir, true);
  if (world_rank() == 0) {
    curve.insert(curve.end(), middle.begin(), middle.end());
    curve.insert(curve.end(), last.begin(), last.end());
    // Each part logs every 5 steps and at its end: 20 | 25, 30, 35 | 40, 45, 50.
    std::ostringstream what;
    what << chain;
    expect_same_curve(curve, whole, tolerance_of(chain.optimizer), what.str());
    fs::remove_all(shared_dir);
  }
}

// Each optimizer's state crosses: bands of rows (AdamW, Muon; with weight shards, Muon's pieces of
// each shard's slices), Shampoo's statistics by their number in the whole model (with weight
// shards: of each shard's slices, cut along two axes), SOAP's rows of the whole tensor's blocks
// (with weight shards: each piece's blocks, the replicas of a piece writing it once).
INSTANTIATE_TEST_SUITE_P(Optimizers, Checkpoints,
                         ::testing::Values(Chain{"adamw", 1, 2, {4, 2, 3}}, Chain{"shampoo", 1, 2, {4, 2, 3}},
                                           Chain{"soap", 1, 2, {4, 2, 3}}, Chain{"muon", 1, 2, {4, 2, 3}},
                                           Chain{"shampoo", 2, 2, {4, 2, 8}}, Chain{"soap", 2, 2, {4, 2, 8}},
                                           Chain{"muon", 2, 2, {4, 2, 8}}));

// SOAP on 2 replicas x 2 weight shards stopped at step 20 and resumed on the same layout: the same
// ranks reduce in the same order and the state comes back bit for bit (each slice's blocks in the
// whole tensor's rows, written once by the first replica), so the losses are the uninterrupted
// run's exactly.
TEST(ShardedTraining, SoapWithWeightShardsResumesOnTheSameLayout) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  auto o = fifty_steps("soap");
  o.weight_shards = 2;
  const auto whole = run_part(o, 4, false, 50, "", false);
  const std::string dir = shared_directory("soap-same-layout");
  auto curve = run_part(o, 4, false, 20, dir, false);
  const auto rest = run_part(o, 4, false, 50, dir, true);
  if (world_rank() == 0) {
    curve.insert(curve.end(), rest.begin(), rest.end());
    expect_same_curve(curve, whole, 0.0, "soap, 2 replicas x 2 weight shards, resumed at step 20");
    fs::remove_all(dir);
  }
}

void fail_on_the_last_rank(const char* point) {
  static int calls = 0;
  // The 10th gather: in the second step's passes (6 a step: 3 layers, forward and backward).
  if (std::strcmp(point, "parameter_shards.need") == 0 && world_rank() == world_size() - 1 && ++calls == 10)
    throw lather::Error("injected failure in a sharded step", nullptr, 0);
}

void fail_in_evaluation_on_the_last_rank(const char* point) {
  // The activations grow for the evaluation's 1000 rows: the first growth after the training's.
  static int calls = 0;
  if (std::strcmp(point, "mlp.allocate") == 0 && world_rank() == world_size() - 1 && ++calls == 2)
    throw lather::Error("injected failure in an evaluation", nullptr, 0);
}

TEST(ShardedTraining, AFailureOnOneRankIsAnErrorOnEveryRank) {
  for (auto hook : {&fail_on_the_last_rank, &fail_in_evaluation_on_the_last_rank}) {
    auto o = fifty_steps("adamw");
    o.shard_parameters = true;
    o.max_steps = 3;
    lather::Impl::set_fault_hook(hook);
    try {
      train(o, MPI_COMM_WORLD, [](const std::string&) {});
      ADD_FAILURE() << "no error on rank " << world_rank();
    } catch (const lather::Error& e) {
      EXPECT_NE(std::string(e.what()).find("injected failure in a"), std::string::npos) << e.what();
    }
    lather::Impl::set_fault_hook(nullptr);
  }
}

TEST(ShardedTraining, OptionsItCannotHonourAreRefused) {
  auto o = fifty_steps("shampoo");
  o.shard_parameters = true;
  o.weight_shards = 2;
  EXPECT_NO_THROW(o.validate());
  o.shampoo.push_back("best_effort_memory_usage_reduction=true");
  EXPECT_THROW(o.validate(), lather::Error);
  try {
    o.validate();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not support best_effort_memory_usage_reduction"), std::string::npos)
        << e.what();
  }
  o.weight_shards = 1;
  EXPECT_NO_THROW(o.validate());
  o = fifty_steps("adamw");
  o.shard_parameters = true;
  o.overlap_reduction = true;
  EXPECT_THROW(o.validate(), lather::Error);
  o.overlap_reduction = false;
  o.overlap_step_gather = true;
  try {
    o.validate();
    ADD_FAILURE() << "--shard-parameters with --overlap-step-gather accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--overlap-step-gather has no step gather"), std::string::npos) << e.what();
  }
}

}  // namespace
