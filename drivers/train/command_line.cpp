#include "command_line.hpp"

#include <lather/core/error.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>

namespace lather::train {

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
                                                   {"--target-loss", ModelKind::transformer},
                                                   {"--pipeline-stages", ModelKind::transformer},
                                                   {"--micro-batches", ModelKind::transformer},
                                                   {"--pipeline-schedule", ModelKind::transformer},
                                                   {"--pipeline-timeline", ModelKind::transformer}};
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
  LATHER_REQUIRE(!given("--muon-newton-schulz-precision") || o.optimizer == OptimizerKind::muon,
                 "--muon-newton-schulz-precision is an option of --optimizer muon; it has no effect with --optimizer ",
                 to_string(o.optimizer));
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
  app.add_option("--pipeline-stages", o.pipeline_stages,
                 "transformer: split the blocks over this many consecutive groups of ranks of each replica "
                 "(embedding on the first, head on the last; stages x --weight-shards must divide the rank count)")
      ->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches,
                 "transformer: micro-batches of each replica's share that flow through the pipeline per round "
                 "(x --accumulate rounds per step)")
      ->capture_default_str();
  app.add_option("--pipeline-schedule", o.pipeline_schedule,
                 "transformer: gpipe (all forwards, then all backwards) or 1f1b (one forward one backward: at most "
                 "--pipeline-stages micro-batches of activations alive)")
      ->capture_default_str();
  app.add_option("--pipeline-timeline", o.pipeline_timeline,
                 "transformer: write every rank's forward and backward passes of the last step to this JSON file");
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
  add_choice(app, "--muon-newton-schulz-precision", o.newton_schulz_precision, product_precision_names(),
             "Muon: round the inputs of the Newton-Schulz products to float32 (as they are), tf32 or bfloat16, "
             "accumulated in float32 (tensor cores on CUDA; emulated, slower, elsewhere)");
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
  app.add_flag("--overlap-reduction", o.overlap_reduction,
               "Reduce each gradient bucket as soon as the backward has written it (bit-identical results)");
  app.add_option("--bucket-bytes", o.bucket_bytes,
                 "Bytes per gradient bucket, one reduction each (0: 64 MiB, or 1 MiB with --overlap-reduction)")
      ->capture_default_str();
  app.add_flag("--overlap-step-gather", o.overlap_step_gather,
               "Shampoo, SOAP and Muon's distributed step: gather the new values layer by layer while the next "
               "forward runs, each layer waited for just before its forward (bit-identical results; not with "
               "--shard-parameters or --pipeline-stages)");
  app.add_flag("--shard-parameters", o.shard_parameters,
               "Each replica stores its own units of every parameter, gradient and optimizer state (rows; whole "
               "rows of Shampoo's and SOAP's blocks); layers are gathered before their passes, gradients "
               "reduce-scattered after (not with --pipeline-stages)");
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
