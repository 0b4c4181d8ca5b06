#include "training_options.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

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

const std::vector<std::pair<std::string, ProductPrecision>>& product_precision_names() {
  static const std::vector<std::pair<std::string, ProductPrecision>> names = {{"float32", ProductPrecision::float32},
                                                                              {"tf32", ProductPrecision::tf32},
                                                                              {"bfloat16", ProductPrecision::bfloat16}};
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
  // The transformer's ridge is absolute, 1e-10 (Meta's kind, a hundred times its 1e-12): over five
  // seeds it reached 1.8 nats/char in 560 steps on average against 690 with the reference's
  // relative 1e-6 (docs/transformer.md). The MLP keeps the relative ridge: its one-sided
  // L^(-1/2) of 784 pixel rows, many always zero, needed 665 steps to 88% with an absolute 1e-12
  // against 504.
  s.relative_matrix_epsilon = model == ModelKind::mlp;
  s.matrix_epsilon = model == ModelKind::mlp ? 1e-6 : 1e-10;
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
  s.product_precision = shampoo.product_precision;
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
  s.newton_schulz_precision = newton_schulz_precision;
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
  require_range("--bucket-bytes", bucket_bytes, 0L, long(1) << 40);
  (void)reduction_name(reduce);  // one of the driver's reductions
  if (shard_parameters) {
    LATHER_REQUIRE(pipeline_stages == 1, "--shard-parameters shards the parameters of whole layers over the ",
                   "replicas; with --pipeline-stages ", pipeline_stages, " the stages hold them already");
    // Shampoo's bands of a weight shard's column slice are pieces cut along two axes, whose int8
    // momentum would scale columns over rows that other ranks hold (SOAP quantizes whole blocks).
    LATHER_REQUIRE(optimizer != OptimizerKind::shampoo || weight_shards == 1 ||
                       !shampoo_options().best_effort_memory_usage_reduction,
                   "--shard-parameters with --optimizer shampoo and --weight-shards ", weight_shards,
                   " does not support best_effort_memory_usage_reduction (int8 momentum)");
    LATHER_REQUIRE(reduce == comm::ReduceOp::weighted_mean, "--shard-parameters reduce-scatters the mean; --reduce ",
                   reduction_name(reduce), " needs every replica's whole gradient");
    LATHER_REQUIRE(!overlap_reduction, "--shard-parameters reduce-scatters each layer's gradients as its backward ",
                   "ends: --overlap-reduction has nothing to add");
    LATHER_REQUIRE(wire_precision == comm::WirePrecision::native, "--shard-parameters moves gradients in float32; ",
                   "--wire-precision ", comm::to_string(wire_precision), " is not supported with it");
    LATHER_REQUIRE(!overlap_step_gather, "--shard-parameters updates each rank's own rows and gathers every layer ",
                   "before its passes already: --overlap-step-gather has no step gather to overlap");
  }
  LATHER_REQUIRE(!overlap_step_gather || pipeline_stages == 1, "--overlap-step-gather waits for each layer's values ",
                 "in its forward, which pipeline stages do not ask for; with --pipeline-stages ", pipeline_stages,
                 " leave it out");
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
    require_range("--pipeline-stages", pipeline_stages, 1, max_layers);
    LATHER_REQUIRE(pipeline_stages <= n_layer, "--pipeline-stages ", pipeline_stages, " is more than --n-layer ",
                   n_layer, " (each stage holds at least one block)");
    require_range("--micro-batches", micro_batches, 1, max_batch_size);
    LATHER_REQUIRE(pipeline_schedule == "gpipe" || pipeline_schedule == "1f1b", "--pipeline-schedule '",
                   pipeline_schedule, "' is not one of gpipe, 1f1b");
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
                                                        "best_effort_memory_usage_reduction", "product_precision"};
    for (const auto& pair : shampoo) {
      const std::string name = pair.substr(0, pair.find('='));
      if (optimizer == OptimizerKind::soap && std::find(soap_takes.begin(), soap_takes.end(), name) != soap_takes.end())
        continue;
      LATHER_FAIL("the Shampoo option '", name, "' (--shampoo, --shampoo-*, --precondition-side, --async-roots) ",
                  "has no effect with --optimizer ", to_string(optimizer),
                  optimizer == OptimizerKind::soap
                      ? "; soap takes block_size, merge_small_dims_block_size, "
                        "skip_preconditioning_dim_size_gt, best_effort_memory_usage_reduction and product_precision"
                      : "");
    }
  }
  // The optimizer's own options, each validated, so that a bad value is refused before any set-up.
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

TrainOptions model_defaults(ModelKind model) {
  TrainOptions o;
  o.model = model;
  apply_model_defaults([](const std::string&) { return false; }, o);
  return o;
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

}  // namespace lather::train
