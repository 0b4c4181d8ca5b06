#pragma once
// The training driver's checkpoints: where the next step of the data starts, written with every
// checkpoint, and --resume from the newest intact checkpoint of --checkpoint-dir.

#include "dataset.hpp"
#include "progress.hpp"
#include "training_options.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/core/parameters.hpp>
#include <lather/optim/optimizer.hpp>

#include <memory>
#include <optional>
#include <string>

namespace lather::train {

/// Where the next step starts: the epoch and the samples of it already consumed.
struct Position {
  long epoch = 0, sample = 0;
};

/// The --checkpoint-dir checkpointer over the mesh, or null without one.
std::unique_ptr<checkpoint::Checkpointer> make_checkpointer(const comm::Mesh& mesh, const TrainOptions& o);
/// Before the first step of a run that will save (steps from `first_step` up to `planned`): a
/// --checkpoint-dir that cannot be created or written stops the run on every rank now, not at its
/// first save, which may be hours in (collective).
void check_checkpoint_directory(const checkpoint::Checkpointer* checkpointer, long first_step, long planned);

/// Loads the newest intact checkpoint of --checkpoint-dir into the parameters and the optimizer,
/// saying which damaged newer ones it passes over, or that there is none (then nothing changes).
std::optional<checkpoint::TrainingState> restore_newest(const Space& space, const TrainOptions& o,
                                                        const checkpoint::Checkpointer& checkpointer,
                                                        optim::Optimizer<Space, float>& optimizer,
                                                        const ParameterList<float, Memory>& parameters,
                                                        const ProgressLog& log);

/// Loads the newest intact checkpoint into the parameters and the optimizer, saying which damaged
/// newer ones it passes over; returns where to continue (the start when there is none).
Position resume(const Space& space, const TrainOptions& o, const checkpoint::Checkpointer& checkpointer,
                optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                const ProgressLog& log);

/// Writes the checkpoint of the optimizer's step, recording `next` as where to continue.
std::string save_checkpoint(const Space& space, const TrainOptions& o, checkpoint::Checkpointer& checkpointer,
                            optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                            const Position& next);

}  // namespace lather::train
