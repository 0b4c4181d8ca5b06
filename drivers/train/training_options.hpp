#pragma once
// Everything lather-train can be told, with its defaults and their checks; command_line.hpp maps
// the command line and config files onto it. The defaults are the acceptance run:
// `mpiexec -n 2 lather-train` trains 784-512-256-10 on Fashion-MNIST with Shampoo for 3 epochs.

#include <lather/comm/reduce.hpp>
#include <lather/comm/wire_precision.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/soap.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lather::train {

/// --model: what lather-train trains.
enum class ModelKind {
  mlp,          ///< a multilayer perceptron on Fashion-MNIST (--data)
  transformer,  ///< a character-level GPT-style decoder on a text (--text)
};
/// --optimizer.
enum class OptimizerKind { shampoo, soap, muon, adam, adamw, adagrad, sgd };

/// The names the command line and config files use, in the order --help lists them.
const std::vector<std::pair<std::string, ModelKind>>& model_names();
const std::vector<std::pair<std::string, OptimizerKind>>& optimizer_names();
/// --reduce: mean (comm::ReduceOp::weighted_mean: each replica weighted by its samples or tokens),
/// adasum, adasum-approx.
const std::vector<std::pair<std::string, comm::ReduceOp>>& reduction_names();
/// --wire-precision: native, bf16, fp16.
const std::vector<std::pair<std::string, comm::WirePrecision>>& wire_precision_names();
/// --muon-newton-schulz-precision: float32, tf32, bfloat16.
const std::vector<std::pair<std::string, ProductPrecision>>& product_precision_names();
/// The command-line name of a value (throws lather::Error for a value without one).
std::string to_string(ModelKind model);
std::string to_string(OptimizerKind optimizer);
std::string reduction_name(comm::ReduceOp reduce);
/// The value of a command-line name: throws lather::Error naming the option and the names it takes.
OptimizerKind parse_optimizer(const std::string& name);

struct TrainOptions {
  ModelKind model = ModelKind::mlp;
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  int batch_size = 128;  ///< global: samples per optimizer step over all replicas
  OptimizerKind optimizer = OptimizerKind::shampoo;
  /// --lr; unset: the optimizer's tuned default for the model (default_learning_rate,
  /// default_transformer_learning_rate). Finite and > 0.
  std::optional<double> lr;
  std::string schedule = "cosine";
  long warmup_steps = 100;
  double weight_decay = 0;
  std::uint64_t seed = 0;
  std::vector<int> hidden = {512, 256};
  int weight_shards = 1;
  comm::ReduceOp reduce = comm::ReduceOp::weighted_mean;
  int accumulate = 1;
  int pipeline_stages = 1;                 ///< transformer: consecutive groups of blocks per replica
  int micro_batches = 1;                   ///< transformer: per pipeline round (accumulate rounds a step)
  std::string pipeline_schedule = "1f1b";  ///< gpipe or 1f1b
  std::string pipeline_timeline;           ///< JSON of the last step's passes, per rank ("": none)
  std::string checkpoint_dir;
  long checkpoint_every = 0;
  int keep_checkpoints = 3;
  bool resume = false;
  std::string metrics;
  long log_every = 50;
  long eval_every = 0;         ///< also evaluate on the test set every N steps (0: per epoch only)
  double target_accuracy = 0;  ///< stop as soon as the test accuracy reaches this (0: never)
  long max_steps = 0;          ///< stop after this many steps in all (0: no limit)
  long train_samples = 0;      ///< use only the first N training samples (0: all)
  long test_samples = 0;       ///< evaluate on the first N test samples (0: all)
  comm::WirePrecision wire_precision = comm::WirePrecision::native;
  /// Reduce each bucket of gradients as the last micro-batch's backward finishes it, instead of
  /// all of them after the backward (the same bits).
  bool overlap_reduction = false;
  /// Bytes of a gradient bucket (ReduceOptions::fusion_bytes); 0: 64 MiB, or 1 MiB overlapped.
  long bucket_bytes = 0;
  /// The distributed step's all-gather of new values, one per layer, left in flight for the next
  /// forward, which waits for each layer's just before reading it (Optimizer::overlap_exchange).
  bool overlap_step_gather = false;
  /// Each rank of the data-parallel group stores a band of rows of every parameter, its gradient
  /// and its optimizer state; layers are all-gathered before their passes and their gradients
  /// reduce-scattered after their backward (comm::ParameterShards).
  bool shard_parameters = false;
  double momentum = 0.9;  ///< SGD
  /// Muon: what the Newton-Schulz products' inputs are rounded to (MuonOptions).
  ProductPrecision newton_schulz_precision = ProductPrecision::float32;
  bool quiet = false;                ///< no progress lines (metrics file only)
  std::vector<std::string> shampoo;  ///< name=value pairs, the reference's option names
  /// Shampoo's (and SOAP's) block size was not given but chosen by apply_model_defaults: a
  /// checkpoint's own block size replaces it on --resume (resume.hpp).
  bool block_size_chosen = false;

  // --model transformer (the defaults are those of `mpiexec -n 2 lather-train --model transformer`,
  // applied by apply_model_defaults where the user set nothing)
  std::string text = "/usr/share/datasets/shakespeare";  ///< directory with train.txt/validation.txt, or one file
  int n_layer = 4, n_head = 4, d_model = 128, block_size = 64;
  double z_loss = 0;
  long eval_windows = 128;  ///< validation windows per evaluation (the same ones every time)
  long sample = 0;          ///< characters to generate after training
  std::string prompt = "\n";
  double temperature = 0.8;
  double target_loss = 0;   ///< stop as soon as the validation loss (nats/char) is at or below this (0: never)
  long schedule_steps = 0;  ///< steps the learning-rate schedule spans (0: from --epochs / --max-steps of the MLP)

  /// The learning rate a run uses: --lr, or the optimizer's tuned default.
  double learning_rate() const;
  /// Throws lather::Error naming the first bad option.
  void validate() const;
  optim::ShampooOptions shampoo_options() const;
  optim::SgdOptions sgd_options() const;
  optim::AdagradOptions adagrad_options() const;
  optim::AdamOptions adam_options() const;
  /// SOAP with the Shampoo blocking of this run (block_size, merge and skip sizes of --shampoo-*).
  optim::SoapOptions soap_options() const;
  /// Muon for the matrices; AdamW (at the same peak rate) for vectors, embeddings and the output head.
  optim::MuonOptions muon_options() const;
};

/// The learning rates found by the sweep documented in docs/reference/driver.md.
double default_learning_rate(OptimizerKind optimizer);

/// The transformer's learning rates (docs/transformer.md).
double default_transformer_learning_rate(OptimizerKind optimizer);

/// Which options the user gave, on the command line or in a --config file, by long flag.
using GivenOption = std::function<bool(const std::string& flag)>;

/// The model's own defaults for what the user did not give (batch, steps, learning rate,
/// evaluation interval, Shampoo's block size): the MLP's make no sense for the transformer.
void apply_model_defaults(const GivenOption& given, TrainOptions& options);

/// The transformer's default Shampoo block size on `weight_shards` shards: the largest power of
/// two up to 128 that divides the shards' slices of d_model.
int transformer_block_size(int d_model, int weight_shards);

/// Every default of `model` as a run of it with no option given would take them.
TrainOptions model_defaults(ModelKind model);

}  // namespace lather::train
