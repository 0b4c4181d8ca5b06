#pragma once
// Runs of lather-train --model transformer inside a test under mpiexec, on the small text in
// tests/data/text: the options of a small model, a run on the first ranks of the world that
// returns rank 0's loss curve, and the comparison of two curves.
#include "trainer.hpp"

#include "common/mpi_ranks.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace lather::test {

using namespace lather::train;
namespace fs = std::filesystem;

inline TrainOptions small_run() {
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
/// Collective over the world: the ranks beyond `ranks` wait for the run in sleeping_barrier().
inline Curve run(TrainOptions o, int ranks, const std::string& tag, long stop_at = 0) {
  Curve curve;
  MPI_Comm comm = first_ranks(ranks);
  if (comm == MPI_COMM_NULL) {
    sleeping_barrier();
    return curve;
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  o.metrics = (fs::temp_directory_path() / ("lather-lm-" + tag + "-" + std::to_string(getpid()) + ".jsonl")).string();
  if (o.resume && rank == 0) fs::copy_file(o.metrics + ".kept", o.metrics, fs::copy_options::overwrite_existing);
  const std::string stop = "step " + std::to_string(stop_at) + "/";
  const auto result = lather::train::train(o, comm, [&](const std::string& line) {
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
  sleeping_barrier();
  return curve;
}

/// Float sums in a different order per layout (shard sums, replica sums): ~1e-6 relative per
/// step, growing slowly over 50 steps of AdamW.
inline void expect_same_curve(const Curve& a, const Curve& b, double tolerance, const std::string& what,
                              long from = 0) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  ASSERT_EQ(a.losses.size(), 10u) << what;
  for (const auto& [step, loss] : b.losses) {
    if (step < from) continue;
    ASSERT_EQ(a.losses.count(step), 1u) << what << ": no loss at step " << step;
    EXPECT_NEAR(a.losses.at(step), loss, tolerance * loss) << what << " at step " << step;
  }
  EXPECT_NEAR(a.validation, b.validation, tolerance * b.validation) << what << ": validation loss";
}

}  // namespace lather::test
