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

/// Which copies of replicated data this rank writes, so that every byte is written exactly once:
/// data held by every rank (unsplit parameters, the step) by the world root; data held by every
/// replica of one weight shard (split parameters, that shard's optimizer state) by replica 0 of
/// the shard; rows tied to unsplit parameters by shard 0 only.
struct WriterRoles {
  bool world_root = true;    ///< e.g. world rank 0
  bool replica_root = true;  ///< e.g. rank 0 of this rank's data-parallel group (replica 0)
  int shard = 0;             ///< this rank's weight shard
  static WriterRoles single() { return {}; }
};

template <class ExecutionSpace, class Scalar>
std::string save_training_state(Checkpointer& checkpointer, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                const TensorList<Scalar, typename ExecutionSpace::memory_space>& params,
                                const TrainingState& state, const WriterRoles& roles);

/// Loads `file` into the parameters and the optimizer (which must have been built with the same
/// parameters and options; its shapes are checked against the file) and returns the rest.
template <class ExecutionSpace, class Scalar>
TrainingState load_training_state(const Checkpointer& checkpointer, const std::string& file,
                                  optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                  const TensorList<Scalar, typename ExecutionSpace::memory_space>& params);

}  // namespace lather::checkpoint
