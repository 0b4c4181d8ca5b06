#pragma once
// The training driver's checkpoints: what each records about the run that wrote it (the model's
// shape and the optimizer options that shape its state, by the flag that sets each), where the
// next step of the data starts, and --resume from the newest intact checkpoint of
// --checkpoint-dir, compared with this run before anything is built from it.

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

/// The checkpoint --resume continues from: the newest intact one, and its root attributes.
struct ResumeSource {
  std::string file;
  checkpoint::Attributes attributes;
};

/// The newest intact checkpoint of --checkpoint-dir, saying (on stderr) which damaged newer ones
/// it passes over, or that there is none. Collective.
std::optional<ResumeSource> find_resume_source(const checkpoint::Checkpointer& checkpointer, const TrainOptions& o,
                                               const ProgressLog& log);

/// Makes this run the one that wrote `source`, before any model or optimizer is built: takes the
/// checkpoint's Shampoo block size where the user gave none and it divides this layout's slices
/// (so a run moves to another shard count), and refuses a difference in anything that shapes a
/// parameter or a state array, naming each with the flag that would match it. Throws
/// lather::Error.
void match_checkpoint(const ResumeSource& source, TrainOptions& o, const ProgressLog& log);

/// The model and optimizer options this run records in its checkpoints (written with `state`).
void describe_run(const TrainOptions& o, checkpoint::TrainingState& state);

/// Loads `source` into the parameters and the optimizer and says so; returns where to continue.
checkpoint::TrainingState load_checkpoint(const Space& space, const ResumeSource& source,
                                          const checkpoint::Checkpointer& checkpointer,
                                          optim::Optimizer<Space, float>& optimizer,
                                          const ParameterList<float, Memory>& parameters, const ProgressLog& log);

/// What an MLP run records with its checkpoints: `next` as where to continue, the seed, the run.
checkpoint::TrainingState position_state(const TrainOptions& o, const Position& next);

/// Writes the checkpoint of the optimizer's step, recording `next` as where to continue.
std::string save_checkpoint(const Space& space, const TrainOptions& o, checkpoint::Checkpointer& checkpointer,
                            optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                            const Position& next);

}  // namespace lather::train
