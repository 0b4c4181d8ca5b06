#include "resume.hpp"

namespace lather::train {

std::unique_ptr<checkpoint::Checkpointer> make_checkpointer(const comm::Mesh& mesh, const TrainOptions& o) {
  if (o.checkpoint_dir.empty()) return nullptr;
  checkpoint::CheckpointOptions c;
  c.directory = o.checkpoint_dir;
  c.keep_last = o.keep_checkpoints;
  return std::make_unique<checkpoint::Checkpointer>(mesh, c);
}

void check_checkpoint_directory(const checkpoint::Checkpointer* checkpointer, long first_step, long planned) {
  // Only a run with steps to take saves: sampling from checkpoints in a read-only directory
  // (--resume --epochs 0 --sample) stays possible.
  if (checkpointer && first_step < planned) checkpointer->check_directory();
}

std::optional<checkpoint::TrainingState> restore_newest(const Space& space, const TrainOptions& o,
                                                        const checkpoint::Checkpointer& checkpointer,
                                                        optim::Optimizer<Space, float>& optimizer,
                                                        const ParameterList<float, Memory>& parameters,
                                                        const ProgressLog& log) {
  std::vector<std::string> skipped;
  auto state = checkpointer.restore_latest(space, optimizer, parameters, &skipped);
  // A damaged newer checkpoint must not be passed over in silence: the run goes back further.
  for (const auto& why : skipped) log.say("warning: resume skips an unreadable checkpoint: " + why);
  if (!state) log.say("resume: no checkpoint in " + o.checkpoint_dir + ", starting from scratch");
  return state;
}

Position resume(const Space& space, const TrainOptions& o, const checkpoint::Checkpointer& checkpointer,
                optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                const ProgressLog& log) {
  const auto state = restore_newest(space, o, checkpointer, optimizer, parameters, log);
  if (!state) return {};
  log.say("resumed from " + state->file + " (step " + std::to_string(optimizer.step_count()) + ", epoch " +
          std::to_string(state->epoch + 1) + ", sample " + std::to_string(state->sample_offset) + "; written by " +
          std::to_string(state->world_size) + " ranks with " + std::to_string(state->weight_shards) +
          " weight shards)");
  return {state->epoch, state->sample_offset};
}

std::string save_checkpoint(const Space& space, const TrainOptions& o, checkpoint::Checkpointer& checkpointer,
                            optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                            const Position& next) {
  checkpoint::TrainingState state;
  state.epoch = next.epoch;
  state.sample_offset = next.sample;
  state.rng = {o.seed};
  state.weight_shards = o.weight_shards;
  state.extra.strings["model"] = "mlp";
  return checkpointer.save(space, optimizer, parameters, state);
}

}  // namespace lather::train
