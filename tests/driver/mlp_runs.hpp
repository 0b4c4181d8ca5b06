#pragma once
// Runs of lather-train's MLP inside a test under mpiexec, on a slice of Fashion-MNIST: the options
// of a small run, a run on the first ranks of the world that returns rank 0's loss curve, and the
// comparison of two curves.
#include "trainer.hpp"

#include "common/mpi_ranks.hpp"

#include <lather/data/idx.hpp>

#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lather::test {

using namespace lather::train;
namespace fs = std::filesystem;

inline TrainOptions small_run(const std::string& optimizer) {
  TrainOptions o;
  o.data = lather::data::default_fashion_mnist_directory;
  o.epochs = 1;
  o.batch_size = 64;
  o.hidden = {32, 16};
  o.train_samples = 1536;  // 24 steps
  o.test_samples = 512;
  o.optimizer = lather::train::parse_optimizer(optimizer);
  o.log_every = 4;
  o.quiet = true;
  // matrix_epsilon 1e-3 keeps the roots of these nearly rank-deficient statistics from amplifying
  // the reduction-order differences between rank counts beyond float tolerance.
  if (optimizer == "shampoo")
    o.shampoo = {"block_size=16", "start_preconditioning_step=2", "preconditioning_compute_steps=4",
                 "matrix_epsilon=1e-3"};
  // SOAP takes Shampoo's blocking (16 x 16 blocks here).
  if (optimizer == "soap") o.shampoo = {"block_size=16"};
  return o;
}

/// Runs train() on `comm` (ranks outside it skip) and returns the losses of its metrics lines (with
/// `evaluations`, the test losses of its evaluation lines too, in the order written).
/// Collective over the world: the ranks outside `comm` wait for the run in sleeping_barrier().
inline std::vector<double> losses(TrainOptions o, MPI_Comm comm, const std::string& tag, bool evaluations = false) {
  std::vector<double> out;
  if (comm == MPI_COMM_NULL) {
    sleeping_barrier();
    return out;
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  o.metrics = (fs::temp_directory_path() / ("lather-test-" + tag + "-" + std::to_string(getpid()) + ".jsonl")).string();
  try {
    lather::train::train(o, comm, [](const std::string&) {});
  } catch (const std::exception& e) {
    // The run's error is every rank of `comm`'s (the driver agrees on failures): they report it
    // and still meet the ranks outside in the barrier, so that nobody waits for the rest.
    ADD_FAILURE() << tag << ": " << e.what();
    sleeping_barrier();
    return out;
  }
  if (rank == 0) {
    std::ifstream in(o.metrics);
    for (std::string line; std::getline(in, line);) {
      const auto record = nlohmann::json::parse(line);
      if (record.contains("train_accuracy")) out.push_back(record.at("loss"));
      if (evaluations && record.contains("test_loss")) out.push_back(record.at("test_loss"));
    }
    fs::remove(o.metrics);
  }
  sleeping_barrier();
  return out;
}

/// Two loss curves agree to `tolerance` relative (the reduction order differs between rank
/// counts: float sums over 64-sample batches, ~1e-6 relative per step, growing slowly). The
/// largest relative difference goes to the test's XML report (--gtest_output), named after `what`.
inline void expect_same_curve(const std::vector<double>& a, const std::vector<double>& b, double tolerance,
                              const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  double largest = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_NEAR(a[k], b[k], tolerance * std::fabs(b[k])) << what << " at line " << k;
    largest = std::max(largest, std::fabs(a[k] - b[k]) / std::fabs(b[k]));
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.2g", largest);
  std::string key = "rel_diff_" + what;  // an XML name: letters, digits and _
  for (char& c : key)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  ::testing::Test::RecordProperty(key, text);
}

}  // namespace lather::test
