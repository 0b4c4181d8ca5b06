// The transformer's training loop (lather-train --model transformer) under mpiexec -n 4, on a
// small model and the small text shipped in tests/data/text: the loss curve over 50 steps does not
// depend on how the ranks split into replicas x shards (1x1, 2x1, 1x2, 2x2, 4x1, 1x4, 3x1, from
// sub-communicators); a run stopped by SIGTERM and resumed equals an uninterrupted one; a
// checkpoint written on 2x2 continues on 4x1; SOAP's state blocked otherwise on 4x1 than on 2x2 is
// refused.
#include "language_model_runs.hpp"

#include <lather/core/error.hpp>

#include <cstring>
#include <vector>

namespace {

using namespace lather::test;

TEST(TransformerTraining, LossCurveDoesNotDependOnTheMesh) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  const auto o = small_run();
  const Curve reference = run(o, 1, "1x1");
  if (world_rank() == 0)
    EXPECT_LT(reference.losses.rbegin()->second, reference.losses.begin()->second - 0.3) << "it learns";
  struct Layout {
    int replicas, shards;
  };
  for (const Layout layout : {Layout{2, 1}, Layout{1, 2}, Layout{2, 2}, Layout{4, 1}, Layout{1, 4}, Layout{3, 1}}) {
    auto shaped = o;
    shaped.weight_shards = layout.shards;
    const std::string name = std::to_string(layout.replicas) + "x" + std::to_string(layout.shards);
    const Curve curve = run(shaped, layout.replicas * layout.shards, name);
    if (world_rank() == 0) expect_same_curve(curve, reference, 1e-4, name + " vs 1x1");
  }
}

// --overlap-reduction: each block's gradients reduced as the backward leaves the block, in the
// blocking reduction's buckets and order: the same bits, so the same curve to the last digit,
// with replicas, weight shards and pipeline stages (the last micro-batch's backward reports).
TEST(TransformerTraining, OverlappedReductionGivesTheBlockingBits) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  struct Layout {
    int ranks, shards, stages, micro_batches, accumulate;
  };
  for (const Layout l : {Layout{3, 1, 1, 1, 2}, Layout{4, 2, 1, 1, 1}, Layout{4, 1, 2, 3, 2}}) {
    auto o = small_run();
    o.max_steps = 20;
    o.weight_shards = l.shards;
    o.pipeline_stages = l.stages;
    o.micro_batches = l.micro_batches;
    o.accumulate = l.accumulate;
    o.bucket_bytes = 8192;  // several buckets per block
    const std::string name = std::to_string(l.ranks) + " ranks, " + std::to_string(l.shards) + " shards, " +
                             std::to_string(l.stages) + " stages";
    const Curve blocking = run(o, l.ranks, "blocking");
    o.overlap_reduction = true;
    const Curve overlapped = run(o, l.ranks, "overlapped");
    if (world_rank() == 0) {
      EXPECT_EQ(overlapped.losses.size(), 4u) << name;
      EXPECT_EQ(overlapped.losses, blocking.losses) << name;
      EXPECT_EQ(overlapped.validation, blocking.validation) << name;
    }
  }
}

// --overlap-step-gather: each layer's new values waited for in the next forward; the same bits
// as the whole exchange inside the step, with replicas, accumulation and weight shards.
TEST(TransformerTraining, OverlappedStepGatherGivesTheBlockingBits) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  struct Layout {
    const char* optimizer;
    int ranks, shards, accumulate;
  };
  for (const Layout l :
       {Layout{"shampoo", 3, 1, 2}, Layout{"shampoo", 4, 2, 1}, Layout{"soap", 4, 1, 1}, Layout{"muon", 4, 1, 1}}) {
    auto o = small_run();
    o.max_steps = 10;
    o.optimizer = lather::train::parse_optimizer(l.optimizer);
    if (o.optimizer == lather::train::OptimizerKind::shampoo)
      o.shampoo = {"block_size=16", "shared_memory_gather=false"};
    if (o.optimizer == lather::train::OptimizerKind::soap) o.shampoo = {"block_size=16"};
    o.weight_shards = l.shards;
    o.accumulate = l.accumulate;
    const std::string name = std::string(l.optimizer) + ", " + std::to_string(l.ranks) + " ranks, " +
                             std::to_string(l.shards) + " shards, accumulate " + std::to_string(l.accumulate);
    const Curve blocking = run(o, l.ranks, "blocking");
    o.overlap_step_gather = true;
    const Curve overlapped = run(o, l.ranks, "overlapped");
    if (world_rank() == 0) {
      EXPECT_EQ(overlapped.losses.size(), 2u) << name;
      EXPECT_EQ(overlapped.losses, blocking.losses) << name;
      EXPECT_EQ(overlapped.validation, blocking.validation) << name;
    }
  }
}

TEST(TransformerTraining, KillAndResumeEqualsUninterrupted) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  const fs::path dir = fs::temp_directory_path() / ("lather-lm-ckpt-" + std::to_string(getpid()));
  auto o = small_run();
  o.weight_shards = 2;
  const Curve whole = run(o, 4, "whole");
  o.checkpoint_dir = dir.string();
  const Curve first = run(o, 4, "resumed", 20);
  o.resume = true;
  const Curve resumed = run(o, 4, "resumed");
  // The same ranks, the same windows per step, the optimizer state restored: the same numbers.
  // SIGTERM at step 20's line stops after step 21; the window of the line at step 25 then starts
  // at the resume, so the lines are compared from step 30.
  if (world_rank() == 0) {
    ASSERT_EQ(first.losses.size(), 4u);
    expect_same_curve(resumed, whole, 1e-6, "2x2 stopped at step 21 and resumed", 30);
  }
  // A checkpoint of 2 replicas x 2 shards continues on 4 replicas x 1 shard.
  fs::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  o.resume = false;
  (void)run(o, 4, "reshard", 20);
  o.resume = true;
  o.weight_shards = 1;
  const Curve resharded = run(o, 4, "reshard");
  if (world_rank() == 0) expect_same_curve(resharded, whole, 1e-4, "2x2 to step 21, then 4x1", 30);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

// SOAP with weight shards reads a slice's tensor with its split axis apart; without, the position
// embedding (16 x 32) merges into one dimension and is blocked otherwise: a checkpoint of 2 weight
// shards does not load on 1, and the resume names the first array that differs.
TEST(TransformerTraining, SoapStateBlockedOtherwiseIsRefused) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  std::vector<char> dir(4096, 0);  // rank 0's name on every rank (the process ids differ)
  const std::string mine = (fs::temp_directory_path() / ("lather-lm-soap-" + std::to_string(getpid()))).string();
  if (world_rank() == 0) std::strncpy(dir.data(), mine.c_str(), dir.size() - 1);
  MPI_Bcast(dir.data(), int(dir.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  auto o = small_run();
  o.optimizer = lather::train::OptimizerKind::soap;
  o.shampoo = {"block_size=16"};  // blocks inside the slices of d_model 32 over 2 shards
  o.weight_shards = 2;
  o.max_steps = 5;
  o.checkpoint_dir = dir.data();
  (void)run(o, 4, "soap-blocked");
  o.weight_shards = 1;
  o.resume = true;
  o.max_steps = 10;
  try {
    train(o, MPI_COMM_WORLD, [](const std::string&) {});
    ADD_FAILURE() << "resumed";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset 'optimizer/soap/embedding/positions/exp_avg' has shape [2, 256], "
                                         "expected [32, 16]"),
              std::string::npos)
        << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir.data());
}

TEST(TransformerTraining, BadOptionsAreClearErrors) {
  const auto expect_error = [](TrainOptions o, const std::string& fragment) {
    try {
      train(o, MPI_COMM_WORLD, [](const std::string&) {});
      ADD_FAILURE() << "no error, expected one about " << fragment;
    } catch (const lather::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto o = small_run();
  o.text = "/no/such/text";
  expect_error(o, "--text '/no/such/text' does not exist");
  o = small_run();
  o.n_head = 3;
  expect_error(o, "--d-model 32 must be a multiple of --n-head 3");
  o = small_run();
  o.pipeline_stages = 2;
  o.overlap_step_gather = true;
  expect_error(o, "--overlap-step-gather waits for each layer's values in its forward");
  o = small_run();
  o.prompt = "\x01";
  o.sample = 3;
  o.max_steps = 1;
  expect_error(o, "--prompt");
}

}  // namespace
