#pragma once
// The cost model of lather-bench plan: a training step's time and memory per rank on a layout of
// replicas x pipeline stages x weight shards, from the costs of one rank's work (measured on this
// machine, or given for a device) and an alpha-beta model of each collective. The formulas, the
// constants and what the model leaves out: docs/reference/benchmarks.md, "lather-bench plan".

#include <string>
#include <vector>

namespace lather::plan {

/// A message costs alpha seconds, a byte beta seconds.
struct Network {
  double alpha = 0;  ///< seconds per message
  double beta = 0;   ///< seconds per byte
  std::string source;
};

/// Thakur, Rabenseifner and Gropp, "Optimization of collective communication operations in
/// MPICH" (IJHPCA 2005), for p ranks and n bytes per rank: recursive doubling's latency and the
/// reduce-scatter + all-gather's bandwidth term. Zero on one rank.
double allreduce_seconds(const Network& net, int p, double bytes);
/// All-gather (or reduce-scatter) where `bytes` is the whole gathered buffer.
double allgather_seconds(const Network& net, int p, double bytes);
/// One point-to-point message.
double send_seconds(const Network& net, double bytes);
/// ceil(log2 p), 0 for p <= 1.
int log2_ceil(int p);

/// One rank's costs of the whole model (no shards, no stages), measured or given per device.
struct ModelCosts {
  std::string model;           ///< "mlp" or "transformer"
  double rows_per_sample = 1;  ///< rows of the passes per sample (tokens per window)
  /// Forward + backward seconds measured at these row counts (ascending): passes_seconds()
  /// interpolates between them, and extends the nearest segment beyond them.
  std::vector<double> pass_rows, pass_seconds;
  double optimizer_seconds = 0;   ///< one step over every parameter, replicated
  bool distributed_step = false;  ///< the optimizer splits its work over the replicas
  /// The relative costs of the units a distributed or sharded step assigns to the ranks by greedy
  /// longest-processing-time (Muon's matrices); the step takes the most loaded rank's share.
  /// Empty: an even split.
  std::vector<double> optimizer_unit_costs;
  double parameters = 0;             ///< count (float32)
  double optimizer_state_bytes = 0;  ///< the whole model's
  /// The part of it a distributed step splits over the replicas (the statistics, their roots and
  /// the workspace of the blocks a rank updates); the per-parameter state every replica keeps.
  double optimizer_split_bytes = 0;
  double activation_bytes_per_row = 0;
  /// Tensor-parallel traffic per micro-batch, forward and backward: the shards' all-reduces and
  /// their bytes per row in all (each row of each all-reduced activation).
  double tensor_parallel_allreduces = 0;
  double tensor_parallel_bytes_per_row = 0;
  /// Bytes per row of what crosses a pipeline boundary (the residual stream).
  double stream_bytes_per_row = 0;
  int layers = 1;  ///< blocks (transformer) or dense layers (MLP), split over the stages
  /// Parameters of each layer a sharded run gathers whole (the MLP's dense layers; the
  /// transformer's embedding, blocks, and final LayerNorm with the head), and the tensors of each
  /// (one gather and one reduce-scatter per tensor; empty: tensors_per_layer each); empty:
  /// sharding not modelled.
  std::vector<double> layer_parameters, layer_tensors;
  int tensors_per_layer = 2;
  /// Sharded Muon (optim::ShardedMuon): its matrices, each sent to its owner by rows and back
  /// every step: how many, and their bytes in all.
  double sharded_matrix_exchanges = 0, sharded_matrix_bytes = 0;

  /// Forward + backward seconds of `rows` rows (the passes' cost per row falls as batches grow,
  /// then rises as activations leave the caches: a line through the points would miss both).
  double passes_seconds(double rows) const;
};

struct Layout {
  int replicas = 1, shards = 1, stages = 1;
  int micro_batches = 1;  ///< per step, per replica
  bool overlap = false;   ///< the reduction overlapped with the backward
  bool sharded = false;   ///< parameters sharded over the replicas (lather-train --shard-parameters)
  double bucket_bytes = 64.0 * 1024 * 1024;
  int ranks() const { return replicas * shards * stages; }
  std::string name() const;  ///< "R replicas x P stages x S shards[, overlapped][, sharded parameters]"
};

struct Prediction {
  double compute = 0;          ///< the passes on the critical path, pipeline bubble included
  double tensor_parallel = 0;  ///< the shards' all-reduces on the critical path
  double pipeline = 0;         ///< the stage transfers on the critical path
  double reduction = 0;        ///< the gradient reduction, whole
  double exposed = 0;          ///< the part of it the step waits for
  double optimizer = 0;
  double step = 0;
  double memory_bytes = 0;  ///< parameters, gradients, optimizer state, kept activations
  double samples_per_second = 0;
};

/// The step of `samples` samples per replica on `layout`. Sharded (no stages, a model with
/// layer_parameters): the layers' all-gathers and reduce-scatters instead of the reduction, all of
/// them exposed, and the optimizer on 1/R of the parameters without an all-gather (Muon: with its
/// matrices' rows to their owners and back).
Prediction predict(const ModelCosts& costs, const Network& net, const Layout& layout, double samples);

/// The most loaded of `ranks` ranks' share of `unit_costs` when greedy longest-processing-time
/// assigns them (1/ranks when there are none).
double largest_share(const std::vector<double>& unit_costs, int ranks);

/// Samples per second per rank on `layout`, over the same on one rank (weak scaling: the
/// per-replica batch fixed).
double scaling_efficiency(const Prediction& one_rank, const Prediction& at, const Layout& layout);

}  // namespace lather::plan
