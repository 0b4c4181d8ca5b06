#pragma once
// Saving and restoring a whole training state: parameters, the optimizer's state, the step, the
// data position, RNG state and the mesh, in one checkpoint that another rank count can read.

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/optim/optimizer.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather::checkpoint {

/// What a training loop needs besides parameters and optimizer state to continue exactly.
struct TrainingState {
  long epoch = 0;
  long sample_offset = 0;            ///< samples of this epoch already consumed (global count)
  std::vector<std::uint64_t> rng;    ///< RNG state words, replicated on all ranks
  int world_size = 1;                ///< written by save; read back for information
  int weight_shards = 1;
  Attributes extra;                  ///< anything else (written as root attributes)
};

/// Who writes replicated data: exactly one rank per distinct copy (e.g. rank 0 of each
/// data-parallel group) passes true, so every byte is written once.
template <class ExecutionSpace, class Scalar>
std::string save_training_state(Checkpointer& checkpointer, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                const TensorList<Scalar, typename ExecutionSpace::memory_space>& params,
                                const TrainingState& state, bool write_replicated);

/// Loads `file` into the parameters and the optimizer (which must have been built with the same
/// parameters and options; its shapes are checked against the file) and returns the rest.
template <class ExecutionSpace, class Scalar>
TrainingState load_training_state(const Checkpointer& checkpointer, const std::string& file,
                                  optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                  const TensorList<Scalar, typename ExecutionSpace::memory_space>& params);

}  // namespace lather::checkpoint
