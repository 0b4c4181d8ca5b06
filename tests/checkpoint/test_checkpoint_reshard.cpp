// Re-sharding across rank counts and step modes: a Shampoo state written by 4 ranks in the
// distributed step (each rank stores only its share of the blocks) is continued by 2 ranks in the
// replicated step (every rank stores everything), whose checkpoint is continued by 3 ranks in the
// distributed step again; the parameters then equal a single-rank run of the same steps, for
// float and for int8 quantized state. One phase per ctest entry:
//   LATHER_RESHARD_PHASE = 1 (steps 0-4, save), 2 (load, steps 5-9, save), 3 (load, steps 10-14, compare)
//   LATHER_RESHARD_DIR   = the checkpoint directory the phases share
#include "checkpoint_test_support.hpp"
#include "common/split_step_tolerance.hpp"

#include <lather/comm/group.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

namespace {

using namespace lather;
using namespace lather::test;

TEST(CheckpointReshard, ContinuesOnAnotherRankCount) {
  const char* phase_env = std::getenv("LATHER_RESHARD_PHASE");
  const char* dir_env = std::getenv("LATHER_RESHARD_DIR");
  if (!phase_env || !dir_env) GTEST_SKIP() << "run through ctest (LATHER_RESHARD_PHASE, LATHER_RESHARD_DIR)";
  const int phase = std::atoi(phase_env);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  // Phase 2 runs the replicated step, the others the distributed one.
  const auto mode = phase == 2 ? optim::StepMode::replicated : optim::StepMode::distributed;
  for (Kind kind : {Kind::shampoo_float, Kind::shampoo_quantized}) {
    checkpoint::CheckpointOptions options;
    options.directory = std::string(dir_env) + "/" + name(kind);
    checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
    auto optimizer = make_optimizer<float>(kind, comm::Group(MPI_COMM_WORLD), mode);
    auto params = make_params<float>(model_specs());
    auto grads = make_like(params);
    long start = 0;
    if (phase > 1) {
      const std::string latest = checkpointer.latest();
      ASSERT_FALSE(latest.empty());
      const auto state = checkpointer.restore(Space(), latest, *optimizer, params);
      start = optimizer->step_count();
      EXPECT_EQ(start, 5 * (phase - 1));
      EXPECT_EQ(state.world_size, phase == 2 ? 4 : 2);  // who wrote it
    }
    for (long s = start; s < 5 * phase; ++s) {
      fill_gradients(params, grads, s);
      optimizer->step(Space(), params, grads);
    }
    if (phase < 3) {
      checkpoint::TrainingState state;
      checkpointer.save(Space(), *optimizer, params, state);
      continue;
    }
    // Single-rank reference of all 15 steps, on every rank; on device builds also with its
    // gradients moved by one ulp (pattern > 0), for the allowance of split_step_tolerance.hpp.
    auto reference_run = [&](std::uint64_t pattern) {
      auto reference = make_optimizer<float>(kind);
      auto reference_params = make_params<float>(model_specs());
      for (long s = 0; s < 15; ++s) {
        fill_gradients(reference_params, grads, s);
        if (pattern > 0) test::nudge_last_bits(grads, pattern * 100 + std::uint64_t(s));
        reference->step(Space(), reference_params, grads);
      }
      return host_vectors(reference_params);
    };
    const auto got = host_vectors(params), want = reference_run(0);
    std::vector<double> sensitivity(want.size(), 0.0);
    if constexpr (!test::bits_reproduce_across_splits<Space::memory_space>) {
      std::vector<std::vector<std::vector<float>>> nudged;
      for (std::uint64_t pattern : test::nudge_patterns) nudged.push_back(reference_run(pattern));
      sensitivity = test::rounding_sensitivity(nudged, want, kind == Kind::shampoo_quantized);
    }
    for (std::size_t p = 0; p < got.size(); ++p)
      test::expect_split_close<Space::memory_space>(
          got[p], want[p], std::string(name(kind)) + " parameter " + std::to_string(p), sensitivity[p]);
  }
}

}  // namespace
