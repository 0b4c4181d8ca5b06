#include "training_options.hpp"

#include <lather/core/error.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

namespace lather::train {

const std::vector<std::pair<std::string, ModelKind>>& model_names() {
  static const std::vector<std::pair<std::string, ModelKind>> names = {{"mlp", ModelKind::mlp},
                                                                       {"transformer", ModelKind::transformer}};
  return names;
}

const std::vector<std::pair<std::string, OptimizerKind>>& optimizer_names() {
  static const std::vector<std::pair<std::string, OptimizerKind>> names = {
      {"shampoo", OptimizerKind::shampoo}, {"soap", OptimizerKind::soap},   {"muon", OptimizerKind::muon},
      {"adam", OptimizerKind::adam},       {"adamw", OptimizerKind::adamw}, {"adagrad", OptimizerKind::adagrad},
      {"sgd", OptimizerKind::sgd}};
  return names;
}

const std::vector<std::pair<std::string, comm::ReduceOp>>& reduction_names() {
  static const std::vector<std::pair<std::string, comm::ReduceOp>> names = {
      {"mean", comm::ReduceOp::weighted_mean},
      {"adasum", comm::ReduceOp::adasum},
      {"adasum-approx", comm::ReduceOp::adasum_approx}};
  return names;
}

const std::vector<std::pair<std::string, comm::WirePrecision>>& wire_precision_names() {
  static const std::vector<std::pair<std::string, comm::WirePrecision>> names = {
      {"native", comm::WirePrecision::native},
      {"bf16", comm::WirePrecision::bfloat16},
      {"fp16", comm::WirePrecision::float16}};
  return names;
}

namespace {
template <class Enum>
std::string name_of(const std::vector<std::pair<std::string, Enum>>& names, Enum value, const char* what) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  LATHER_FAIL(what, " value ", int(value), " has no name");
}
}  // namespace

std::string to_string(ModelKind model) { return name_of(model_names(), model, "--model"); }
std::string to_string(OptimizerKind optimizer) { return name_of(optimizer_names(), optimizer, "--optimizer"); }
std::string reduction_name(comm::ReduceOp reduce) { return name_of(reduction_names(), reduce, "--reduce"); }

OptimizerKind parse_optimizer(const std::string& name) {
  for (const auto& [known, value] : optimizer_names())
    if (known == name) return value;
  LATHER_FAIL("unknown optimizer '", name, "' (expected shampoo, soap, muon, adam, adamw, adagrad or sgd)");
}

double default_learning_rate(OptimizerKind optimizer) {
  switch (optimizer) {
    case OptimizerKind::shampoo:
      return 6e-3;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return 2e-3;
    case OptimizerKind::adagrad:
      return 3e-2;
    case OptimizerKind::sgd:
      return 5e-2;
    case OptimizerKind::soap:
      return 1e-3;
    case OptimizerKind::muon:
      return 1e-2;
  }
  LATHER_FAIL("--optimizer value ", int(optimizer), " has no default learning rate");
}

double TrainOptions::learning_rate() const { return lr ? *lr : default_learning_rate(optimizer); }

namespace {
optim::LearningRateSchedule schedule_of(const TrainOptions& o, long total_steps) {
  optim::LearningRateSchedule s;
  s.kind = optim::parse_schedule_kind(o.schedule);
  s.peak = o.learning_rate();
  s.warmup_steps = o.warmup_steps;
  s.decay_steps = std::max(1L, total_steps - o.warmup_steps);
  s.end_value = 0;
  return s;
}
long planned_steps(const TrainOptions& o) {
  if (o.schedule_steps > 0) return o.schedule_steps;
  const long samples = o.train_samples > 0 ? o.train_samples : 60000;
  const long steps = long(o.epochs) * ((samples + o.batch_size - 1) / o.batch_size);
  return o.max_steps > 0 ? std::min(steps, o.max_steps) : steps;
}
}  // namespace

optim::ShampooOptions TrainOptions::shampoo_options() const {
  optim::ShampooOptions s;
  // Defaults of the driver (the time-to-accuracy sweep in docs/reference/driver.md): an AdaGrad
  // graft, biases on the diagonal path, roots by eigendecomposition every 100 steps (50 for the
  // transformer).
  s.graft_type = optim::GraftType::adagrad;
  // The MLP's momentum from a five-seed sweep (steps to 88%: 0.85 never more than 0.9, 580 against
  // 620 on average); the transformer keeps the reference's 0.9 (0.85 and 0.95 needed more steps
  // to 1.8 nats/char on two seeds, docs/transformer.md).
  s.beta1 = model == ModelKind::mlp ? 0.85 : 0.9;
  // The MLP preconditions the input side of each kernel only (the reference's INPUT): over ten
  // seeds it needed fewer steps to 88% than both sides (506 against 600 on average, at its best
  // rate 6e-3 against 4e-3) for half the statistics, roots and products. The transformer keeps
  // both sides (INPUT needed 760 steps to 1.8 nats/char on average over five seeds against 720).
  s.preconditioner_type = model == ModelKind::mlp ? optim::PreconditionerType::input : optim::PreconditionerType::all;
  s.beta2 = 0.999;
  s.diagonal_epsilon = 1e-10;
  s.matrix_epsilon = 1e-6;
  s.start_preconditioning_step = 25;
  // Roots every 100 steps for the MLP (the sweep in docs/reference/driver.md); the transformer
  // takes them every 50: over five seeds it reached 1.8 nats/char in 690 steps and 44.5 s on
  // average against 720 and 46.7 s, never in more steps (docs/transformer.md). Its roots are small
  // beside the model.
  s.preconditioning_compute_steps = model == ModelKind::mlp ? 100 : 50;
  s.block_size = 128;
  s.skip_preconditioning_rank_lt = 2;
  s.root.method = linalg::RootMethod::eigh;
  s.weight_decay = weight_decay;
  for (const auto& pair : shampoo) {
    const auto eq = pair.find('=');
    LATHER_REQUIRE(eq != std::string::npos, "--shampoo expects name=value, got '", pair, "'");
    optim::set_option(s, pair.substr(0, eq), pair.substr(eq + 1));
  }
  s.learning_rate = schedule_of(*this, planned_steps(*this));
  s.validate();
  return s;
}

optim::SgdOptions TrainOptions::sgd_options() const {
  optim::SgdOptions s;
  s.learning_rate = schedule_of(*this, planned_steps(*this));
  s.momentum = momentum;
  s.nesterov = true;
  s.weight_decay = weight_decay;
  s.validate();
  return s;
}

optim::AdagradOptions TrainOptions::adagrad_options() const {
  optim::AdagradOptions s;
  s.learning_rate = schedule_of(*this, planned_steps(*this));
  s.weight_decay = weight_decay;
  s.validate();
  return s;
}

optim::AdamOptions TrainOptions::adam_options() const {
  optim::AdamOptions s;
  s.learning_rate = schedule_of(*this, planned_steps(*this));
  s.weight_decay = optimizer == OptimizerKind::adamw && weight_decay == 0 ? 1e-4 : weight_decay;
  s.decoupled_weight_decay = optimizer == OptimizerKind::adamw;
  s.validate();
  return s;
}

optim::SoapOptions TrainOptions::soap_options() const {
  optim::SoapOptions s;
  // The blocking and skip rules of this run's Shampoo (its defaults and --shampoo-* options), and
  // its best_effort_memory_usage_reduction: SOAP's quantized state.
  const auto shampoo = shampoo_options();
  s.best_effort_memory_usage_reduction = shampoo.best_effort_memory_usage_reduction;
  s.block_size = shampoo.block_size;
  s.merge_small_dims_block_size = shampoo.merge_small_dims_block_size;
  s.max_precond_dim = shampoo.skip_preconditioning_dim_size_gt;
  s.beta1 = 0.95;
  s.beta2 = 0.95;
  s.precondition_frequency = 10;
  s.weight_decay = weight_decay;
  s.learning_rate = schedule_of(*this, planned_steps(*this));
  s.validate();
  return s;
}

optim::MuonOptions TrainOptions::muon_options() const {
  optim::MuonOptions s;
  s.learning_rate = schedule_of(*this, planned_steps(*this));
  s.weight_decay = weight_decay;
  s.adam_weight_decay = weight_decay;
  // Jordan et al.: embeddings and the output head are not hidden matrices; AdamW takes them.
  if (model == ModelKind::transformer) s.adamw_parameters = {"embedding/tokens", "embedding/positions", "head/kernel"};
  s.validate();
  return s;
}

namespace {
// Upper bounds on what sizes memory or counts steps: far past any run this driver is for, low
// enough that no size or step product overflows (and a typo of a few digits is an error, not an
// allocation of terabytes).
constexpr int max_layer_size = 1 << 16;     // --hidden sizes, --d-model
constexpr int max_layers = 1 << 10;         // --n-layer, hidden layers
constexpr int max_batch_size = 1 << 20;     // --batch-size (samples or windows)
constexpr int max_block_size = 1 << 16;     // --block-size (characters)
constexpr int max_shards = 1 << 12;         // --weight-shards
constexpr int max_epochs = 1 << 20;         // --epochs
constexpr long max_windows = 1L << 24;      // --eval-windows
constexpr long max_samples = 1L << 40;      // --train-samples, --test-samples, --sample
constexpr long max_steps_limit = 1L << 50;  // --max-steps, --warmup-steps, --schedule-steps, intervals

/// Lather's message for `value` outside [low, high] of `flag`.
template <class T>
void require_range(const char* flag, T value, T low, T high) {
  LATHER_REQUIRE(value >= low && value <= high, flag, " must be in [", low, ", ", high, "], got ", value);
}
void require_finite(const char* flag, double value, double low) {
  LATHER_REQUIRE(std::isfinite(value) && value >= low, flag, " must be finite and >= ", low, ", got ", value);
}
/// exists() without its exception: a path the system refuses to look up (too long, a loop) is
/// reported as not there, like a missing one.
bool path_exists(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error) && !error;
}
}  // namespace

void TrainOptions::validate() const {
  const bool transformer = model == ModelKind::transformer;
  // A transformer run may train for no step at all: --resume --epochs 0 --sample N samples from a checkpoint.
  require_range("--epochs", epochs, transformer ? 0 : 1, max_epochs);
  require_range("--batch-size", batch_size, 1, max_batch_size);
  LATHER_REQUIRE(!lr || (std::isfinite(*lr) && *lr > 0), "--lr must be a finite number > 0, got ", lr ? *lr : 0.0);
  require_range("--warmup-steps", warmup_steps, 0L, max_steps_limit);
  require_range("--schedule-steps", schedule_steps, 0L, max_steps_limit);
  require_finite("--weight-decay", weight_decay, 0);
  LATHER_REQUIRE(!hidden.empty(), "--hidden needs at least one layer size");
  LATHER_REQUIRE(hidden.size() <= std::size_t(max_layers), "--hidden has ", hidden.size(), " layers, more than ",
                 max_layers);
  for (int h : hidden) require_range("--hidden sizes", h, 1, max_layer_size);
  require_range("--weight-shards", weight_shards, 1, max_shards);
  require_range("--accumulate", accumulate, 1, max_batch_size);
  (void)reduction_name(reduce);  // one of the driver's reductions
  LATHER_REQUIRE(checkpoint_every >= 0, "--checkpoint-every must be >= 0, got ", checkpoint_every);
  LATHER_REQUIRE(checkpoint_every == 0 || !checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  LATHER_REQUIRE(!resume || !checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  require_range("--checkpoint-every", checkpoint_every, 0L, max_steps_limit);
  LATHER_REQUIRE(keep_checkpoints >= 1, "--keep-checkpoints must be >= 1, got ", keep_checkpoints);
  require_range("--log-every", log_every, 0L, max_steps_limit);
  require_range("--eval-every", eval_every, 0L, max_steps_limit);
  require_range("--max-steps", max_steps, 0L, max_steps_limit);
  require_range("--train-samples", train_samples, 0L, max_samples);
  require_range("--test-samples", test_samples, 0L, max_samples);
  LATHER_REQUIRE(target_accuracy >= 0 && target_accuracy <= 1, "--target-accuracy must be in [0, 1], got ",
                 target_accuracy);
  // --epochs 0 trains nothing: it samples from a checkpoint, and without one would sample from
  // an untrained model.
  LATHER_REQUIRE(epochs > 0 || (resume && sample > 0), "--epochs 0 takes no step; it is for sampling from a ",
                 "checkpoint (--resume --checkpoint-dir DIR --sample N)");
  if (transformer) {
    LATHER_REQUIRE(path_exists(text), "--text '", text,
                   "' does not exist (run scripts/fetch-shakespeare, or pass --text with any UTF-8 file)");
    require_range("--n-layer", n_layer, 1, max_layers);
    require_range("--d-model", d_model, 1, max_layer_size);
    require_range("--n-head", n_head, 1, d_model);
    require_range("--block-size", block_size, 1, max_block_size);
    LATHER_REQUIRE(d_model % n_head == 0, "--d-model ", d_model, " must be a multiple of --n-head ", n_head);
    LATHER_REQUIRE(n_head % weight_shards == 0, "--weight-shards ", weight_shards, " must divide --n-head ", n_head,
                   " (each shard holds whole attention heads)");
    require_finite("--z-loss", z_loss, 0);
    require_range("--eval-windows", eval_windows, 1L, max_windows);
    require_range("--sample", sample, 0L, max_samples);
    LATHER_REQUIRE(temperature > 0 && std::isfinite(temperature), "--temperature must be > 0, got ", temperature);
    require_finite("--target-loss", target_loss, 0);
  } else {
    std::error_code error;
    LATHER_REQUIRE(std::filesystem::is_directory(data, error), "--data '", data,
                   "' is not a directory (install the Debian package dataset-fashion-mnist or pass --data DIR)");
  }
  // Shampoo's options change Shampoo only, and SOAP takes its blocking and quantization from
  // them: given to another optimizer, one would silently change nothing, so it is refused.
  if (optimizer != OptimizerKind::shampoo) {
    static const std::vector<std::string> soap_takes = {"block_size", "merge_small_dims_block_size",
                                                        "skip_preconditioning_dim_size_gt",
                                                        "best_effort_memory_usage_reduction"};
    for (const auto& pair : shampoo) {
      const std::string name = pair.substr(0, pair.find('='));
      if (optimizer == OptimizerKind::soap && std::find(soap_takes.begin(), soap_takes.end(), name) != soap_takes.end())
        continue;
      LATHER_FAIL("the Shampoo option '", name, "' (--shampoo, --shampoo-*, --precondition-side, --async-roots) ",
                  "has no effect with --optimizer ", to_string(optimizer),
                  optimizer == OptimizerKind::soap
                      ? "; soap takes block_size, merge_small_dims_block_size, "
                        "skip_preconditioning_dim_size_gt and best_effort_memory_usage_reduction"
                      : "");
    }
  }
  // The optimizer's own options, each validated, so that a bad value is refused before any set-up.
  LATHER_REQUIRE(weight_shards == 1 || (optimizer != OptimizerKind::soap && optimizer != OptimizerKind::muon),
                 "--optimizer ", to_string(optimizer), " does not support --weight-shards ", weight_shards,
                 " (use shampoo or a first-order optimizer)");
  switch (optimizer) {
    case OptimizerKind::shampoo:
      (void)shampoo_options();
      break;
    case OptimizerKind::soap:
      (void)soap_options();
      break;
    case OptimizerKind::muon:
      (void)muon_options();
      break;
    case OptimizerKind::sgd:
      (void)sgd_options();
      break;
    case OptimizerKind::adagrad:
      (void)adagrad_options();
      break;
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      (void)adam_options();
      break;
  }
}

void apply_model_defaults(const GivenOption& given, TrainOptions& o) {
  const bool block_given = std::any_of(o.shampoo.begin(), o.shampoo.end(),
                                       [](const std::string& pair) { return pair.rfind("block_size=", 0) == 0; });
  o.block_size_chosen = !block_given;
  if (o.model != ModelKind::transformer) return;
  const auto unset = [&](const char* flag) { return !given(flag); };
  // `mpiexec -n 2 lather-train --model transformer`: 32 windows of 64 characters per step; the
  // run length and learning rates from the sweep in docs/transformer.md.
  if (unset("--batch-size")) o.batch_size = 32;
  if (unset("--epochs") && unset("--max-steps")) o.max_steps = 2000;
  if (unset("--eval-every")) o.eval_every = 250;
  if (unset("--log-every")) o.log_every = 50;
  if (unset("--optimizer")) o.optimizer = OptimizerKind::shampoo;
  if (unset("--lr") && !o.lr) o.lr = default_transformer_learning_rate(o.optimizer);
  // Shampoo's blocks must not straddle the shards' slices: the largest power of two up to 128
  // dividing this shard count's slices of d_model and 4 d_model (the vocabulary is padded to
  // 128). 128 on one shard, where larger blocks precondition better at the same step time. On
  // --resume a checkpoint's own block size replaces it where it fits the slices (resume.hpp).
  // Options given win; SOAP takes the same blocks.
  if (!block_given && (o.optimizer == OptimizerKind::shampoo || o.optimizer == OptimizerKind::soap) &&
      o.weight_shards >= 1)
    o.shampoo.insert(o.shampoo.begin(),
                     "block_size=" + std::to_string(transformer_block_size(o.d_model, o.weight_shards)));
}

int transformer_block_size(int d_model, int weight_shards) {
  // In 64 bits: the options may not be validated yet (validate() bounds them), and 128 times a
  // large shard count does not fit an int.
  int block = 128;
  while (block > 1 && (d_model % (std::int64_t(block) * weight_shards) != 0)) block /= 2;
  return block;
}

namespace {

/// The options only one model reads, with what they are for.
struct ModelOption {
  const char* flag;
  ModelKind model;
};
const std::vector<ModelOption>& model_options() {
  static const std::vector<ModelOption> options = {{"--data", ModelKind::mlp},
                                                   {"--hidden", ModelKind::mlp},
                                                   {"--train-samples", ModelKind::mlp},
                                                   {"--test-samples", ModelKind::mlp},
                                                   {"--target-accuracy", ModelKind::mlp},
                                                   {"--text", ModelKind::transformer},
                                                   {"--n-layer", ModelKind::transformer},
                                                   {"--n-head", ModelKind::transformer},
                                                   {"--d-model", ModelKind::transformer},
                                                   {"--block-size", ModelKind::transformer},
                                                   {"--z-loss", ModelKind::transformer},
                                                   {"--eval-windows", ModelKind::transformer},
                                                   {"--sample", ModelKind::transformer},
                                                   {"--prompt", ModelKind::transformer},
                                                   {"--temperature", ModelKind::transformer},
                                                   {"--target-loss", ModelKind::transformer}};
  return options;
}

}  // namespace

void apply_model_defaults(const CLI::App& app, TrainOptions& o) {
  const auto given = [&app](const std::string& flag) { return app.count(flag) > 0; };
  apply_model_defaults(given, o);
  o.validate();  // each value first, then whether it is used
  // Given to the other model, an option would silently change nothing: refused, as Shampoo's
  // options are with another optimizer (validate()).
  for (const auto& [flag, model] : model_options())
    LATHER_REQUIRE(!given(flag) || model == o.model, flag, " is an option of --model ", to_string(model),
                   "; it has no effect with --model ", to_string(o.model));
  LATHER_REQUIRE(!given("--momentum") || o.optimizer == OptimizerKind::sgd,
                 "--momentum is an option of --optimizer sgd; it has no effect with --optimizer ",
                 to_string(o.optimizer));
}

TrainOptions model_defaults(ModelKind model) {
  TrainOptions o;
  o.model = model;
  apply_model_defaults([](const std::string&) { return false; }, o);
  return o;
}

namespace {
/// The values of `flag` on a command line read before CLI11 parses it: `--flag VALUE` and
/// `--flag=VALUE`, in order.
std::vector<std::string> values_of(const std::string& flag, int argc, const char* const* argv) {
  std::vector<std::string> values;
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg == flag && k + 1 < argc)
      values.emplace_back(argv[k + 1]);
    else if (arg.rfind(flag + "=", 0) == 0)
      values.push_back(arg.substr(flag.size() + 1));
  }
  return values;
}
}  // namespace

std::optional<ModelKind> model_in_arguments(int argc, const char* const* argv) {
  std::optional<ModelKind> found;
  for (const auto& value : values_of("--model", argc, argv))
    for (const auto& [name, kind] : model_names())
      if (name == value) found = kind;
  return found;
}

namespace {
/// Where `text` stops being UTF-8 (or holds a NUL), or npos.
std::size_t first_non_text_byte(const std::string& text) {
  for (std::size_t k = 0; k < text.size();) {
    const auto c = static_cast<unsigned char>(text[k]);
    if (c == 0) return k;
    const int length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || k + std::size_t(length) > text.size()) return k;
    for (int j = 1; j < length; ++j)
      if ((static_cast<unsigned char>(text[k + std::size_t(j)]) >> 6) != 0x2) return k;
    k += std::size_t(length);
  }
  return std::string::npos;
}
}  // namespace

std::string explain(const CLI::ParseError& error, const CLI::App& app) {
  std::string what = error.what();
  // "--epochs: At Most 1 required but received 2"
  const std::string at_most = ": At Most 1 required but received ";
  const auto at = what.find(at_most);
  if (at != std::string::npos)
    return what.substr(0, at) + " was given " + what.substr(at + at_most.size()) + " times; give it once";
  if (dynamic_cast<const CLI::ExtrasError*>(&error)) {
    std::string listed;
    for (const auto& argument : app.remaining()) listed += (listed.empty() ? "'" : ", '") + argument + "'";
    return (app.remaining().size() == 1 ? "unexpected argument " : "unexpected arguments ") + listed +
           ": lather-train takes only options (--name value)";
  }
  return what;
}

void check_config_files(int argc, const char* const* argv) {
  for (const auto& file : values_of("--config", argc, argv)) {
    std::ifstream in(file, std::ios::binary);
    if (!in) continue;  // CLI11 names a file it cannot open
    // A config file is a few lines; reading a large binary file whole to say so would cost.
    std::string head(std::size_t(1) << 16, '\0');
    in.read(head.data(), std::streamsize(head.size()));
    head.resize(std::size_t(in.gcount()));
    const std::size_t bad = first_non_text_byte(head);
    // A multibyte character cut by the 64 KiB window is not an error.
    if (bad != std::string::npos && !(head.size() == (std::size_t(1) << 16) && bad + 4 > head.size())) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", unsigned(static_cast<unsigned char>(head[bad])));
      LATHER_FAIL("--config '", file, "' is not a text file (byte ", byte, " at offset ", bad,
                  "); config files are TOML or INI text whose keys are the long option names");
    }
  }
}

double default_transformer_learning_rate(OptimizerKind optimizer) {
  switch (optimizer) {
    case OptimizerKind::muon:
      return 2e-2;
    case OptimizerKind::sgd:
      return 0.1;
    case OptimizerKind::adagrad:
      return 3e-2;
    default:
      return 3e-3;  // shampoo, soap, adam, adamw
  }
}

namespace {
/// An option whose names map onto an enum: checked against the names, and parsed once, here.
template <class Enum>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, Enum& target,
                        const std::vector<std::pair<std::string, Enum>>& names, const std::string& help) {
  std::vector<std::string> allowed;
  for (const auto& entry : names) allowed.push_back(entry.first);
  auto* option = app.add_option_function<std::string>(
      flag,
      [&target, &names](const std::string& value) {
        for (const auto& [name, v] : names)
          if (name == value) target = v;
      },
      help);
  option->check(CLI::IsMember(allowed));
  option->type_name("TEXT");
  for (const auto& [name, v] : names)
    if (v == target) option->default_str(name);
  return option;
}
}  // namespace

namespace {
/// "default per optimizer: shampoo 6e-3, ..." for one model or both.
std::string learning_rate_defaults(std::optional<ModelKind> model) {
  const auto list = [](double (*rate)(OptimizerKind)) {
    std::string text;
    for (const auto& [name, kind] : optimizer_names()) {
      std::ostringstream value;
      value << rate(kind);
      text += (text.empty() ? "" : ", ") + name + " " + value.str();
    }
    return text;
  };
  const std::string mlp = list(default_learning_rate), transformer = list(default_transformer_learning_rate);
  if (model == ModelKind::mlp) return "default per optimizer: " + mlp;
  if (model == ModelKind::transformer) return "default per optimizer: " + transformer;
  return "default per optimizer, mlp: " + mlp + "; transformer: " + transformer;
}
}  // namespace

namespace {
/// The help's [default ...] of the options whose defaults differ between the models: that of
/// `help_model`, or both ("mlp 128, transformer 32").
void show_model_defaults(CLI::App& app, std::optional<ModelKind> help_model) {
  const TrainOptions mlp = model_defaults(ModelKind::mlp), transformer = model_defaults(ModelKind::transformer);
  const auto number = [](double value) {
    std::ostringstream out;
    out << value;
    return out.str();
  };
  std::vector<std::tuple<std::string, std::string, std::string>> differing = {
      {"--batch-size", number(mlp.batch_size), number(transformer.batch_size)},
      {"--max-steps", number(mlp.max_steps), number(transformer.max_steps)},
      {"--eval-every", number(mlp.eval_every), number(transformer.eval_every)}};
  const auto shampoo_mlp = mlp.shampoo_options(), shampoo_transformer = transformer.shampoo_options();
  for (const auto& name : optim::option_names()) {
    if (name == "learning_rate") continue;
    std::string flag = "--shampoo-" + name;
    for (auto& c : flag)
      if (c == '_') c = '-';
    differing.emplace_back(flag, optim::option_value(shampoo_mlp, name),
                           optim::option_value(shampoo_transformer, name));
  }
  for (const auto& [flag, for_mlp, for_transformer] : differing) {
    auto* option = app.get_option_no_throw(flag);
    if (!option) continue;
    std::string shown = help_model == ModelKind::mlp           ? for_mlp
                        : help_model == ModelKind::transformer ? for_transformer
                        : for_mlp == for_transformer           ? for_mlp
                                                               : "mlp " + for_mlp + ", transformer " + for_transformer;
    if (flag == "--shampoo-block-size" && help_model != ModelKind::mlp)
      shown += help_model ? " (the largest power of two up to 128 dividing --d-model / --weight-shards)"
                          : " (or the largest power of two dividing --d-model / --weight-shards)";
    // The Shampoo options carry their default in the description (CLI11 shows no default for an
    // option function); the others in CLI11's own [default] column.
    if (flag.rfind("--shampoo-", 0) == 0) {
      const std::string text = option->get_description();
      const auto at = text.rfind(" [default ");
      option->description(text.substr(0, at) + " [default " + shown + "]");
    } else {
      option->default_str(shown);
    }
  }
}
}  // namespace

void add_options(CLI::App& app, TrainOptions& o, std::optional<ModelKind> help_model) {
  app.set_config("--config", "", "Read options from a TOML/INI file (keys are the long option names)");
  // A misspelt key is an error naming it, not a default silently kept (CLI11 ignores extras).
  app.allow_config_extras(CLI::config_extras_mode::error);
  add_choice(app, "--model", o.model, model_names(),
             "mlp: a multilayer perceptron on Fashion-MNIST (--data); transformer: a character-level GPT-style "
             "decoder on a text (--text), attention heads split over --weight-shards");
  app.add_option("--text", o.text,
                 "transformer: a directory with train.txt and validation.txt (scripts/fetch-shakespeare writes "
                 "one) or any UTF-8 file (its last 10% validates)")
      ->capture_default_str();
  app.add_option("--n-layer", o.n_layer, "transformer: blocks")->capture_default_str();
  app.add_option("--n-head", o.n_head, "transformer: attention heads (divisible by --weight-shards)")
      ->capture_default_str();
  app.add_option("--d-model", o.d_model, "transformer: model width (divisible by --n-head)")->capture_default_str();
  app.add_option("--block-size", o.block_size, "transformer: context length in characters")->capture_default_str();
  app.add_option("--z-loss", o.z_loss, "transformer: weight of PaLM's z-loss (log Z)^2, e.g. 1e-4; 0: off")
      ->capture_default_str();
  app.add_option("--eval-windows", o.eval_windows,
                 "transformer: validation windows of --block-size characters per evaluation")
      ->capture_default_str();
  app.add_option("--sample", o.sample,
                 "transformer: generate this many characters after training (with --resume --epochs 0: from the "
                 "checkpoint without training)")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "transformer: the text --sample continues");
  app.add_option("--temperature", o.temperature, "transformer: sampling temperature")->capture_default_str();
  app.add_option("--target-loss", o.target_loss,
                 "transformer: stop once the validation loss (nats/char) is at or below this (0: never)")
      ->capture_default_str();
  app.add_option("--data", o.data, "Directory with Fashion-MNIST's train-/t10k-{images,labels}-idx?-ubyte[.gz]")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "Passes over the training set")->capture_default_str();
  app.add_option("--batch-size", o.batch_size,
                 "Global batch: samples per optimizer step over all replicas, whatever the rank count")
      ->capture_default_str();
  add_choice(app, "--optimizer", o.optimizer, optimizer_names(), "shampoo, soap, muon, adam, adamw, adagrad or sgd");
  app.add_option_function<double>(
         "--lr", [&o](double value) { o.lr = value; },
         "Learning rate (peak of the schedule), finite and > 0; " + learning_rate_defaults(help_model))
      ->type_name("FLOAT");
  app.add_option("--schedule", o.schedule, "Learning-rate schedule: constant, warmup, cosine, linear or rsqrt")
      ->check(CLI::IsMember({"constant", "warmup", "cosine", "linear", "rsqrt"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps of the schedule")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "Weight decay (adamw: decoupled, default 1e-4)")
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the initial weights and of the data order (same on all replicas)")
      ->capture_default_str();
  app.add_option("--hidden", o.hidden, "Hidden layer sizes, comma separated")->delimiter(',')->capture_default_str();
  app.add_option("--weight-shards", o.weight_shards,
                 "Split hidden layers column/row-parallel across this many ranks of each replica (must divide the "
                 "rank count and the hidden sizes)")
      ->capture_default_str();
  add_choice(app, "--reduce", o.reduce, reduction_names(),
             "Gradient reduction over replicas: mean, adasum or adasum-approx");
  app.add_option("--accumulate", o.accumulate,
                 "Micro-batches per step: each replica's share of the global batch is processed in this many "
                 "pieces, gradients accumulated, one reduction per step")
      ->capture_default_str();
  add_choice(app, "--wire-precision", o.wire_precision, wire_precision_names(),
             "Gradient reduction on the wire: native, bf16 or fp16");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "Directory of the HDF5 checkpoints");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Write a checkpoint every N steps (and at the end, and on SIGTERM); 0: only at the end and on SIGTERM")
      ->capture_default_str();
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "Checkpoints kept in --checkpoint-dir")
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "Continue from the latest complete checkpoint in --checkpoint-dir (if any)");
  app.add_option("--metrics", o.metrics,
                 "Write JSON lines (epoch, step, loss, seconds, ...; test_accuracy at epoch ends) to this file");
  app.add_option("--log-every", o.log_every, "Progress line every N steps (0: epoch ends only)")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "Also evaluate on the test set every N steps (0: at epoch ends)")
      ->capture_default_str();
  app.add_option("--target-accuracy", o.target_accuracy, "Stop once the test accuracy reaches this (0: never)")
      ->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "Stop after this many optimizer steps (0: no limit)")
      ->capture_default_str();
  app.add_option("--train-samples", o.train_samples, "Train on the first N samples only (0: all 60000)")
      ->capture_default_str();
  app.add_option("--test-samples", o.test_samples, "Evaluate on the first N test samples only (0: all 10000)")
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "No progress lines on stdout");
  auto* shampoo = app.add_option("--shampoo", o.shampoo,
                                 "Shampoo option as name=value (repeatable), or use --shampoo-<name> below");
  shampoo->delimiter(',');
  app.add_option_function<std::string>(
         "--precondition-side", [&o](const std::string& side) { o.shampoo.push_back("precondtioner_type=" + side); },
         "Shampoo: precondition every dimension of a block (all), all but the last (input) or the last only "
         "(output); the reference's precondtioner_type [default: " +
             std::string(help_model == ModelKind::mlp           ? "input"
                         : help_model == ModelKind::transformer ? "all"
                                                                : "mlp input, transformer all") +
             "]")
      ->check(CLI::IsMember({"all", "input", "output"}))
      ->type_name("SIDE");
  app.add_flag_function(
      "--async-roots", [&o](std::int64_t) { o.shampoo.push_back("async_roots=true"); },
      "Shampoo: compute the inverse roots of a preconditioning step on host threads while the next interval "
      "runs, and install them at the next preconditioning step (one interval stale; needs root_method eigh, "
      "lather-train's default)");
  const optim::ShampooOptions defaults = model_defaults(help_model.value_or(ModelKind::mlp)).shampoo_options();
  for (const auto& name : optim::option_names()) {
    if (name == "learning_rate") continue;  // --lr
    std::string flag = "--shampoo-" + name;
    for (auto& c : flag)
      if (c == '_') c = '-';
    auto* option = app.add_option_function<std::string>(
        flag, [&o, name](const std::string& value) { o.shampoo.push_back(name + "=" + value); },
        optim::option_help(name) + " [default " + optim::option_value(defaults, name) + "]");
    option->group("Shampoo options (the JAX reference's names)");
    option->type_name(name.find("type") != std::string::npos || name.find("method") != std::string::npos ||
                              name.find("precision") != std::string::npos
                          ? "TEXT"
                          : "VALUE");
  }
  show_model_defaults(app, help_model);
}

}  // namespace lather::train
