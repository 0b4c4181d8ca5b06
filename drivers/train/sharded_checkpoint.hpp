#pragma once
// Checkpoints of a --shard-parameters run in the format every other run writes and reads, so that
// a sharded run resumes unsharded, on another rank count, and back: on save, the parameters and
// the optimizer's state are all-gathered into a replicated copy that the usual checkpoint writes
// (arrays shaped like a parameter by its bands, any other by the rows each rank lists: Shampoo's
// stacked statistics by their number in the whole model, SOAP's state by the whole tensor's
// blocks, an array held whole by all its rows); on load, the usual checkpoint fills such a copy,
// and each rank keeps its units. The copy lives for the save or load only: for that time the rank holds the whole model
// and its state once more.

#include "resume.hpp"
#include "training_step.hpp"

namespace lather::train {

/// Writes the checkpoint of the optimizer's step with `state` (position_state() for the MLP).
/// Collective over the data-parallel group.
std::string save_sharded_checkpoint(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                    checkpoint::Checkpointer& checkpointer, optim::Optimizer<Space, float>& optimizer,
                                    ParameterShards& shards, const checkpoint::TrainingState& state);

/// Loads `source` into the shards' values and the optimizer's units; returns where to continue.
/// Collective over the data-parallel group.
checkpoint::TrainingState load_sharded_checkpoint(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                                  const ResumeSource& source,
                                                  const checkpoint::Checkpointer& checkpointer,
                                                  optim::Optimizer<Space, float>& optimizer, ParameterShards& shards,
                                                  const ProgressLog& log);

}  // namespace lather::train
