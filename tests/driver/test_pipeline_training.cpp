// lather-train --model transformer on pipeline stages, under mpiexec -n 4 (and -n 8), on a small
// model and the small text in tests/data/text. Replicas x stages x shards layouts give the loss
// curve of one rank running the same micro-batches as gradient accumulation, for both schedules,
// AdamW and Shampoo, 1 to 8 micro-batches: bit for bit with stages alone (each micro-batch's
// arithmetic is one rank's, the stream crosses between stages unchanged, and the backwards add
// the gradients in micro-batch order on every schedule), and to 1e-4 relative with replicas or
// shards (their sums are added in another order: ~1e-6 relative per step, growing slowly over
// 50 steps, as in test_transformer_training). Checkpoints cross stage counts; a failure injected
// on one stage mid-schedule is an error on every rank of the mesh.
#include "language_model_runs.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <atomic>

namespace {

using namespace lather::test;

struct Layout {
  int replicas, stages, shards;
  int ranks() const { return replicas * stages * shards; }
  std::string name() const {
    return std::to_string(replicas) + "x" + std::to_string(stages) + "x" + std::to_string(shards);
  }
};

TrainOptions pipeline_run(OptimizerKind optimizer) {
  auto o = small_run();
  o.n_layer = 4;      // 1, 2 or 4 stages of whole blocks
  o.batch_size = 24;  // windows: 8 micro-batches on 1, 2 or 3 replicas
  o.optimizer = optimizer;
  if (optimizer == OptimizerKind::shampoo)
    o.shampoo = {"block_size=16", "start_preconditioning_step=10", "preconditioning_compute_steps=5"};
  return o;
}

TrainOptions shaped(TrainOptions o, const Layout& layout, int micro_batches, const std::string& schedule) {
  o.weight_shards = layout.shards;
  o.pipeline_stages = layout.stages;
  o.micro_batches = micro_batches;
  o.pipeline_schedule = schedule;
  return o;
}

/// One rank with the micro-batches as gradient accumulation: the reference of every layout.
Curve reference_of(TrainOptions o, int micro_batches, const std::string& tag) {
  o.accumulate = micro_batches;
  return run(o, 1, tag + "-1x1x1-m" + std::to_string(micro_batches));
}

/// The layouts against one rank; `every_count`: also 1, 2 and 8 micro-batches on 1 x 2 x 1 (the
/// schedules' mechanics, the same for every optimizer: run for one of them).
void expect_layouts_match(OptimizerKind optimizer, const std::string& tag, bool every_count) {
  const auto o = pipeline_run(optimizer);
  std::map<int, Curve> references;
  for (int m : {1, 2, 4, 8})
    if (every_count || m == 4 || m == 8) references[m] = reference_of(o, m, tag);
  if (world_rank() == 0)
    EXPECT_LT(references[4].losses.rbegin()->second, references[4].losses.begin()->second - 0.3) << "it learns";
  struct Case {
    Layout layout;
    int micro_batches;
    const char* schedule;
  };
  const Case cases[] = {{{1, 2, 1}, 4, "gpipe"}, {{1, 2, 1}, 4, "1f1b"}, {{1, 4, 1}, 4, "1f1b"},
                        {{1, 4, 1}, 8, "gpipe"}, {{1, 2, 1}, 1, "1f1b"}, {{1, 2, 1}, 2, "gpipe"},
                        {{1, 2, 1}, 8, "1f1b"},  {{2, 2, 1}, 4, "1f1b"}, {{1, 2, 2}, 4, "gpipe"},
                        {{3, 1, 1}, 4, "1f1b"}};
  for (const auto& c : cases) {
    if (!references.count(c.micro_batches) || (!every_count && c.layout.stages == 2 && c.layout.replicas == 1 &&
                                               c.layout.shards == 1 && c.micro_batches != 4))
      continue;
    const std::string name = tag + " " + c.layout.name() + " " + c.schedule + " m" + std::to_string(c.micro_batches);
    const Curve curve = run(shaped(o, c.layout, c.micro_batches, c.schedule), c.layout.ranks(), name);
    const bool stages_only = c.layout.replicas == 1 && c.layout.shards == 1;
    if (world_rank() == 0)
      expect_same_curve(curve, references[c.micro_batches], stages_only ? 0.0 : 1e-4, name + " vs 1x1x1");
  }
}

TEST(PipelineTraining, LossCurveOfAdamWDoesNotDependOnTheLayout) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  expect_layouts_match(OptimizerKind::adamw, "adamw", true);
}

TEST(PipelineTraining, LossCurveOfShampooDoesNotDependOnTheLayout) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  expect_layouts_match(OptimizerKind::shampoo, "shampoo", false);
}

// SOAP and Muon work over each stage's own tensors too (Muon names the embeddings and head it
// leaves to AdamW only on the stages that hold them). SOAP's eigenbases round differently with the
// BLAS threads a rank has (one rank alone takes both CPUs of a 2-CPU machine, 2 or 4 ranks one
// each), so the reference is the same 2 replicas without stages: the same reductions, ranks with
// one thread each, the same numbers.
TEST(PipelineTraining, SoapAndMuonOnStages) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  for (const auto optimizer : {OptimizerKind::soap, OptimizerKind::muon}) {
    const std::string tag = optimizer == OptimizerKind::soap ? "soap" : "muon";
    auto replicas = pipeline_run(optimizer);
    replicas.accumulate = 2;
    const Curve reference = run(replicas, 2, tag + "-2x1x1");
    const Layout layout{2, 2, 1};
    const Curve curve = run(shaped(pipeline_run(optimizer), layout, 2, "1f1b"), layout.ranks(), tag + "-2x2x1");
    if (world_rank() == 0) expect_same_curve(curve, reference, 0.0, tag + " 2x2x1 1f1b m2 vs 2x1x1 accumulating 2");
  }
}

TEST(PipelineTraining, EightRanksOfReplicasStagesAndShards) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  install_termination_handler();
  const auto o = pipeline_run(OptimizerKind::shampoo);
  const Curve reference = reference_of(o, 4, "8");
  const Layout layout{2, 2, 2};
  const Curve curve = run(shaped(o, layout, 4, "1f1b"), layout.ranks(), "2x2x2");
  if (world_rank() == 0) expect_same_curve(curve, reference, 1e-4, "2x2x2 1f1b m4 vs 1x1x1");
}

TEST(PipelineTraining, CheckpointsCrossStageCounts) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  const fs::path dir = fs::temp_directory_path() / ("lather-pipeline-ckpt-" + std::to_string(getpid()));
  const auto base = pipeline_run(OptimizerKind::shampoo);
  // Kill and resume on 1 x 2 x 2: the same ranks, micro-batches and state, the same numbers.
  auto o = shaped(base, {1, 2, 2}, 4, "1f1b");
  const Curve whole = run(o, 4, "pipeline-whole");
  o.checkpoint_dir = dir.string();
  const Curve first = run(o, 4, "pipeline-resumed", 20);
  o.resume = true;
  const Curve resumed = run(o, 4, "pipeline-resumed");
  // SIGTERM at step 20's line stops after step 21; the window of the line at step 25 then starts
  // at the resume, so the lines are compared from step 30.
  if (world_rank() == 0) {
    ASSERT_EQ(first.losses.size(), 4u);
    expect_same_curve(resumed, whole, 0.0, "1x2x2 stopped at step 21 and resumed", 30);
  }
  // Written on 1 x 4 x 1, continued on 2 x 2 x 1 and on 4 x 1 x 1: a block changes stage.
  const Curve uninterrupted = run(shaped(base, {1, 4, 1}, 4, "gpipe"), 4, "pipeline-1x4x1");
  for (const Layout next : {Layout{2, 2, 1}, Layout{4, 1, 1}}) {
    fs::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    auto writer = shaped(base, {1, 4, 1}, 4, "gpipe");
    writer.checkpoint_dir = dir.string();
    (void)run(writer, 4, "pipeline-reshard", 20);
    auto reader = shaped(base, next, 4, "1f1b");
    reader.checkpoint_dir = dir.string();
    reader.resume = true;
    const Curve continued = run(reader, next.ranks(), "pipeline-reshard");
    if (world_rank() == 0)
      expect_same_curve(continued, uninterrupted, 1e-4, "1x4x1 to step 21, then " + next.name(), 30);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

// The fault point of every pass: the hook throws on one rank at its `after`-th pass there.
std::atomic<int> passes{0};
int failing_rank = -1, failing_pass = -1;
void throw_mid_schedule(const char* point) {
  if (std::string(point) != "transformer.pipeline" || world_rank() != failing_rank) return;
  if (passes++ == failing_pass) throw lather::Error("injected mid-schedule on a stage", nullptr, 0);
}

TEST(PipelineTraining, AFailureOnOneStageIsAnErrorOnEveryRank) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  install_termination_handler();
  // Stage 1 of a 1 x 2 x 1 pipeline in its 3rd pass (step 1, a forward between others); stage 0
  // of replica 1 of 2 x 2 x 1 in its 13th (step 2); each schedule.
  struct Case {
    Layout layout;
    int rank, pass;
    const char* schedule;
  };
  for (const Case c : {Case{{1, 2, 1}, 1, 2, "1f1b"}, Case{{2, 2, 1}, 2, 12, "gpipe"}, Case{{1, 2, 2}, 3, 5, "1f1b"}}) {
    passes = 0;
    failing_rank = c.rank;
    failing_pass = c.pass;
    lather::Impl::set_fault_hook(&throw_mid_schedule);
    std::string message;
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < c.layout.ranks() ? 0 : MPI_UNDEFINED, world_rank(), &comm);
    if (comm != MPI_COMM_NULL) {
      auto o = shaped(pipeline_run(OptimizerKind::adamw), c.layout, 4, c.schedule);
      o.max_steps = 5;
      try {
        (void)lather::train::train(o, comm, [](const std::string&) {});
      } catch (const lather::Error& e) {
        message = e.what();
      }
      MPI_Comm_free(&comm);
    }
    lather::Impl::set_fault_hook(nullptr);
    if (world_rank() < c.layout.ranks())
      EXPECT_NE(message.find("injected mid-schedule on a stage"), std::string::npos)
          << c.layout.name() << ": rank " << world_rank() << " got '" << message << "'";
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
