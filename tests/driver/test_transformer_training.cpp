// The transformer's training loop (lather-train --model transformer) under mpiexec -n 4, on a
// small model and the small text shipped in tests/data/text: the loss curve over 50 steps does not
// depend on how the ranks split into replicas x shards (1x1, 2x1, 1x2, 2x2, 4x1, 1x4, 3x1, from
// sub-communicators); a run stopped by SIGTERM and resumed equals an uninterrupted one; a
// checkpoint written on 2x2 continues on 4x1.
#include "trainer.hpp"

#include "common/mpi_ranks.hpp"

#include <lather/core/error.hpp>

#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

namespace {

using namespace lather::train;
namespace fs = std::filesystem;

using lather::test::world_rank;
using lather::test::world_size;

TrainOptions small_run() {
  TrainOptions o;
  o.model = lather::train::ModelKind::transformer;
  o.text = LATHER_TEST_TEXT;
  o.n_layer = 2;
  o.n_head = 4;  // whole heads on 1, 2 and 4 shards
  o.d_model = 32;
  o.block_size = 16;
  o.batch_size = 12;  // windows: divisible by 1, 2, 3 and 4 replicas
  o.max_steps = 50;
  o.epochs = 100;
  o.optimizer = lather::train::OptimizerKind::adamw;
  o.lr = 3e-3;
  o.warmup_steps = 5;
  o.log_every = 5;
  o.eval_every = 0;
  o.eval_windows = 8;
  return o;
}

struct Curve {
  std::map<long, double> losses;  ///< training loss at every log_every-th step
  double validation = 0;
};

/// Runs the job on the first `ranks` ranks of the world (the others skip) and returns rank 0's
/// curve. `stop_at`: SIGTERM as the progress reaches that step (then the run checkpoints).
Curve run(TrainOptions o, int ranks, const std::string& tag, long stop_at = 0) {
  Curve curve;
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &comm);
  if (comm == MPI_COMM_NULL) return curve;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  o.metrics = (fs::temp_directory_path() / ("lather-lm-" + tag + "-" + std::to_string(getpid()) + ".jsonl")).string();
  if (o.resume && rank == 0) fs::copy_file(o.metrics + ".kept", o.metrics, fs::copy_options::overwrite_existing);
  const std::string stop = "step " + std::to_string(stop_at) + "/";
  const auto result = train(o, comm, [&](const std::string& line) {
    if (stop_at > 0 && line.compare(0, stop.size(), stop) == 0) std::raise(SIGTERM);
  });
  clear_termination_request();
  curve.validation = result.test_loss;
  if (rank == 0) {
    std::ifstream in(o.metrics);
    for (std::string line; std::getline(in, line);) {
      const auto record = nlohmann::json::parse(line);
      // The line SIGTERM adds at the step where it stops is not on the log_every grid.
      if (record.contains("bits_per_char") && record.at("step").get<long>() % o.log_every == 0)
        curve.losses[record.at("step").get<long>()] = record.at("loss");
    }
    if (result.interrupted)
      fs::rename(o.metrics, o.metrics + ".kept");
    else
      fs::remove(o.metrics);
  }
  MPI_Comm_free(&comm);
  return curve;
}

/// Float sums in a different order per layout (shard sums, replica sums): ~1e-6 relative per
/// step, growing slowly over 50 steps of AdamW.
void expect_same_curve(const Curve& a, const Curve& b, double tolerance, const std::string& what, long from = 0) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  ASSERT_EQ(a.losses.size(), 10u) << what;
  for (const auto& [step, loss] : b.losses) {
    if (step < from) continue;
    ASSERT_EQ(a.losses.count(step), 1u) << what << ": no loss at step " << step;
    EXPECT_NEAR(a.losses.at(step), loss, tolerance * loss) << what << " at step " << step;
  }
  EXPECT_NEAR(a.validation, b.validation, tolerance * b.validation) << what << ": validation loss";
}

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
  o.prompt = "\x01";
  o.sample = 3;
  o.max_steps = 1;
  expect_error(o, "--prompt");
}

}  // namespace
