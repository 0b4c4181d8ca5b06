#pragma once
// What a run will hold per rank, estimated from the model, the optimizer and the layout before
// anything is allocated, by the kinds the start-up report measures afterwards; and the refusal
// of a run whose estimate exceeds what a rank can have (core/memory_budget.hpp), so that it ends
// with a message at once instead of in the node's OOM killer minutes later.

#include "training_options.hpp"

#include <lather/comm/group.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather::train {

struct MemoryEstimate {
  std::int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
  std::int64_t total() const { return parameters + gradients + optimizer_state + activations; }
  /// "parameters 2.0 MiB, gradients 2.0 MiB, optimizer state 26.3 MiB, activations 1.1 MiB; total 31.4 MiB"
  std::string to_string() const;
};

/// A parameter as one rank of the layout holds it: its shape (1 or 2 dimensions).
using ParameterShapes = std::vector<std::vector<std::int64_t>>;

/// The MLP of `sizes` (inputs, hidden..., classes), its kernels split over `shards`.
MemoryEstimate estimate_mlp_memory(const TrainOptions& o, const std::vector<int>& sizes, int replicas, int shards);

/// The transformer of `o` with a vocabulary padded to `vocabulary`, each replica's micro-batch
/// `micro_windows` windows of o.block_size characters, `slots` micro-batches of activations kept at
/// once (a pipeline schedule's), on the pipeline stage with the most blocks.
MemoryEstimate estimate_transformer_memory(const TrainOptions& o, int vocabulary, int replicas, int shards,
                                           long micro_windows, int slots = 1);

/// The optimizer state of `o.optimizer` over parameters of these per-rank shapes, its
/// statistics shared among `replicas` ranks where the step distributes them.
std::int64_t estimate_optimizer_state(const TrainOptions& o, const ParameterShapes& shapes, int replicas);

/// Refuses, on every rank of `world`, a run whose estimate on some rank exceeds what that rank
/// can have (the device's free memory on a GPU, else its share of the node's available memory),
/// naming the estimate, the limit and how it came about. Collective.
void check_memory(const MemoryEstimate& estimate, const comm::Group& world);

}  // namespace lather::train
