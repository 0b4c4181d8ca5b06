#include "resume.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

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

std::optional<ResumeSource> find_resume_source(const checkpoint::Checkpointer& checkpointer, const TrainOptions& o,
                                               const ProgressLog& log) {
  std::vector<std::string> skipped;
  ResumeSource source;
  source.file = checkpointer.latest_intact(&skipped);
  // A damaged newer checkpoint must not be passed over in silence: the run goes back further.
  for (const auto& why : skipped) log.warn("warning: resume skips an unreadable checkpoint: " + why);
  if (source.file.empty()) {
    log.say("resume: no checkpoint in " + o.checkpoint_dir + ", starting from scratch");
    return std::nullopt;
  }
  source.attributes = checkpointer.read_attributes(source.file);
  return source;
}

namespace {

std::string join_sizes(const std::vector<int>& sizes) {
  std::string text;
  for (int size : sizes) text += (text.empty() ? "" : ",") + std::to_string(size);
  return text;
}

/// The "name = value" lines of the checkpoint's optimizer_options attribute.
std::map<std::string, std::string> stored_optimizer_options(const checkpoint::Attributes& a) {
  std::map<std::string, std::string> options;
  const auto text = a.strings.find("optimizer_options");
  if (text == a.strings.end()) return options;
  std::istringstream lines(text->second);
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) options[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return options;
}

/// The Shampoo options that shape its state arrays, and the flag that sets each.
const std::vector<std::pair<std::string, std::string>>& shampoo_shaping_options() {
  static const std::vector<std::pair<std::string, std::string>> options = {
      {"precondtioner_type", "--precondition-side"},
      {"merge_small_dims_block_size", "--shampoo-merge-small-dims-block-size"},
      {"skip_preconditioning_dim_size_gt", "--shampoo-skip-preconditioning-dim-size-gt"},
      {"skip_preconditioning_rank_lt", "--shampoo-skip-preconditioning-rank-lt"},
      {"unpreconditioned_block_size", "--shampoo-unpreconditioned-block-size"},
      {"best_effort_memory_usage_reduction", "--shampoo-best-effort-memory-usage-reduction"},
      {"graft_type", "--shampoo-graft-type"},
      {"statistics_precision", "--shampoo-statistics-precision"}};
  return options;
}

int current_block_size(const TrainOptions& o) {
  return o.optimizer == OptimizerKind::soap ? o.soap_options().block_size : o.shampoo_options().block_size;
}

void set_block_size(TrainOptions& o, int block) {
  o.shampoo.erase(std::remove_if(o.shampoo.begin(), o.shampoo.end(),
                                 [](const std::string& pair) { return pair.rfind("block_size=", 0) == 0; }),
                  o.shampoo.end());
  o.shampoo.insert(o.shampoo.begin(), "block_size=" + std::to_string(block));
}

/// The block sizes a checkpoint could have been written with to continue on both shard counts:
/// the powers of two up to 128 dividing both layouts' slices of d_model.
std::string movable_block_sizes(int d_model, int stored_shards, int shards) {
  std::string text;
  for (int block = 128; block >= 1; block /= 2)
    if (d_model % (std::int64_t(block) * stored_shards) == 0 && d_model % (std::int64_t(block) * shards) == 0)
      text += (text.empty() ? "" : ", ") + std::to_string(block);
  const auto last = text.rfind(", ");
  return last == std::string::npos ? text : text.substr(0, last) + " or " + text.substr(last + 2);
}

}  // namespace

void describe_run(const TrainOptions& o, checkpoint::TrainingState& state) {
  state.weight_shards = o.weight_shards;
  state.extra.strings["model"] = to_string(o.model);
  state.extra.strings["run_optimizer"] = to_string(o.optimizer);
  if (o.model == ModelKind::mlp) {
    state.extra.strings["hidden"] = join_sizes(o.hidden);
  } else {
    state.extra.integers["n_layer"] = o.n_layer;
    state.extra.integers["n_head"] = o.n_head;
    state.extra.integers["d_model"] = o.d_model;
    state.extra.integers["block_size"] = o.block_size;
  }
}

void match_checkpoint(const ResumeSource& source, TrainOptions& o, const ProgressLog& log) {
  const auto& a = source.attributes;
  const auto string_of = [&](const char* key) {
    const auto it = a.strings.find(key);
    return it == a.strings.end() ? std::string() : it->second;
  };
  const std::string model = string_of("model");
  LATHER_REQUIRE(model.empty() || model == to_string(o.model), "checkpoint ", source.file, " holds a --model ", model,
                 ", not a --model ", to_string(o.model));

  // Each difference as "--flag <checkpoint's> (this run: <this run's>)".
  std::vector<std::string> differences;
  const auto compare = [&](const std::string& flag, const std::string& stored, const std::string& here) {
    if (!stored.empty() && stored != here)
      differences.push_back(flag + " " + stored + " in the checkpoint (this run: " + here + ")");
  };
  compare("--optimizer", string_of("run_optimizer"), to_string(o.optimizer));
  if (o.model == ModelKind::mlp) {
    compare("--hidden", string_of("hidden"), join_sizes(o.hidden));
  } else {
    for (const auto& [key, flag, value] :
         {std::make_tuple("n_layer", "--n-layer", o.n_layer), std::make_tuple("n_head", "--n-head", o.n_head),
          std::make_tuple("d_model", "--d-model", o.d_model),
          std::make_tuple("block_size", "--block-size", o.block_size)}) {
      const auto it = a.integers.find(key);
      if (it != a.integers.end()) compare(flag, std::to_string(it->second), std::to_string(value));
    }
  }

  const auto stored = stored_optimizer_options(a);
  const bool same_optimizer =
      string_of("run_optimizer").empty() || string_of("run_optimizer") == to_string(o.optimizer);
  const bool blocked = o.optimizer == OptimizerKind::shampoo || o.optimizer == OptimizerKind::soap;
  const auto stored_block = stored.find("block_size");
  if (same_optimizer && blocked && stored_block != stored.end()) {
    const int block = std::stoi(stored_block->second);
    const int here = current_block_size(o);
    const auto shards_of = a.integers.find("weight_shards");
    const int stored_shards = shards_of == a.integers.end() ? 1 : int(shards_of->second);
    if (block != here && o.block_size_chosen) {
      // The block size follows the shard count unless given: the checkpoint's is the run's,
      // where it fits the slices of this layout.
      if (o.model == ModelKind::transformer && o.d_model % (std::int64_t(block) * o.weight_shards) != 0)
        LATHER_FAIL("checkpoint ", source.file, " holds Shampoo blocks of ", block, ", which do not divide this ",
                    "layout's slices of --d-model ", o.d_model, " over ", o.weight_shards, " weight shards (",
                    o.d_model / o.weight_shards, " each); it continues on layouts whose slices ", block,
                    " divides. To move between ", stored_shards, " and ", o.weight_shards,
                    " weight shards, train with --shampoo-block-size ",
                    movable_block_sizes(o.d_model, stored_shards, o.weight_shards));
      set_block_size(o, block);
      log.say("resume: Shampoo block size " + std::to_string(block) + " from the checkpoint (" +
              std::to_string(stored_shards) + " weight shards there, " + std::to_string(o.weight_shards) + " here)");
    } else {
      compare("--shampoo-block-size", std::to_string(block), std::to_string(here));
    }
  }
  if (same_optimizer && o.optimizer == OptimizerKind::shampoo) {
    const auto shampoo = o.shampoo_options();
    for (const auto& [name, flag] : shampoo_shaping_options()) {
      const auto it = stored.find(name);
      if (it != stored.end()) compare(flag, it->second, optim::option_value(shampoo, name));
    }
  }
  if (!differences.empty()) {
    std::string list;
    for (const auto& d : differences) list += (list.empty() ? "" : "; ") + d;
    LATHER_FAIL("checkpoint ", source.file, " was written by a different run: ", list,
                ". Give the checkpoint's values, or start anew in another --checkpoint-dir");
  }
}

checkpoint::TrainingState load_checkpoint(const Space& space, const ResumeSource& source,
                                          const checkpoint::Checkpointer& checkpointer,
                                          optim::Optimizer<Space, float>& optimizer,
                                          const ParameterList<float, Memory>& parameters, const ProgressLog& log) {
  auto state = checkpointer.restore(space, source.file, optimizer, parameters.values());
  log.say("resumed from " + state.file + " (step " + std::to_string(optimizer.step_count()) + ", epoch " +
          std::to_string(state.epoch + 1) + ", sample " + std::to_string(state.sample_offset) + "; written by " +
          std::to_string(state.world_size) + " ranks with " +
          (state.pipeline_stages > 1 ? std::to_string(state.pipeline_stages) + " pipeline stages x " : std::string()) +
          std::to_string(state.weight_shards) + " weight shards)");
  return state;
}

checkpoint::TrainingState position_state(const TrainOptions& o, const Position& next) {
  checkpoint::TrainingState state;
  state.epoch = next.epoch;
  state.sample_offset = next.sample;
  state.rng = {o.seed};
  describe_run(o, state);
  return state;
}

std::string save_checkpoint(const Space& space, const TrainOptions& o, checkpoint::Checkpointer& checkpointer,
                            optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                            const Position& next) {
  return checkpointer.save(space, optimizer, parameters, position_state(o, next));
}

}  // namespace lather::train
