#pragma once
// One optimizer step of the training driver: this replica's share of a global batch in
// --accumulate micro-batches through the model, the gradients reduced over the data-parallel
// group (token-weighted mean, or Adasum of per-replica means), then the optimizer's update.

#include "dataset.hpp"
#include "progress.hpp"
#include "training_options.hpp"

#include <lather/comm/parameter_shards.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/nn/mlp.hpp>
#include <lather/nn/transformer.hpp>
#include <lather/optim/optimizer.hpp>

#include <memory>

namespace lather::train {

/// This replica's sums over its samples of the step.
struct StepSums {
  double loss = 0, correct = 0, samples = 0;
};

using ParameterShards = comm::ParameterShards<Space, float>;

struct StepParts {
  nn::Mlp<Space>& model;
  comm::GradientReducer<Space, float>& reducer;
  optim::Optimizer<Space, float>& optimizer;
  Batch& staging;
  ParameterShards* shards = nullptr;  ///< --shard-parameters: the optimizer updates sharded_parameters()
};

/// With --shard-parameters: the model's parameters sharded over the data-parallel group (a layer
/// per dense layer, kernel and bias) in the layouts of --optimizer (optim/sharding.hpp), holding
/// its initial values; the model then reads and writes the gather buffers, and its own parameters
/// are released. Collective over the group.
std::unique_ptr<ParameterShards> shard_parameters(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                                  nn::Mlp<Space>& model);
/// The same for the transformer: a layer per embedding, block, and final LayerNorm with the head.
std::unique_ptr<ParameterShards> shard_parameters(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                                  nn::Transformer<Space, float>& model);

/// The log line of a --shard-parameters run's memory: rank 0's owned bands and gather buffers, and
/// the largest rank's values, gradients, state (without the optimizer's workspace) and buffers.
/// Collective over the mesh.
std::string describe_sharded_memory(const comm::Mesh& mesh, const ParameterShards& shards,
                                    const optim::StateMemoryReport& report);

/// What the optimizer of a --shard-parameters run is built on and updates: Shampoo and Muon, every
/// parameter as this rank's slice (ParameterShards::slices); the others, the bands this rank holds.
const ParameterList<float, Memory>& sharded_parameters(const TrainOptions& o, const ParameterShards& shards);

/// The MLP's parameter ranges [first, last), one per dense layer (kernel and bias), in forward order.
std::vector<std::pair<std::size_t, std::size_t>> mlp_parameter_layers(const nn::Mlp<Space>& model);

/// With --overlap-step-gather: the optimizer's distributed step gathers its new values by `layers`
/// (the model's parameter ranges, in forward order), and the next forward waits for each layer's
/// through step_gather_hook(). Where the run has no step gather to overlap (one replica, a
/// replicated step, an optimizer without one), the log says so. Local.
void overlap_step_gather(const Space& space, const TrainOptions& o, optim::Optimizer<Space, float>& optimizer,
                         std::vector<std::pair<std::size_t, std::size_t>> layers, const ProgressLog& log);
/// The hook the model's forward asks for each layer's values with --overlap-step-gather (none
/// without).
ParametersNeeded step_gather_hook(const Space& space, const TrainOptions& o, optim::Optimizer<Space, float>& optimizer);

/// The gradient reducer of a run (--wire-precision), over the mesh's data-parallel group; it
/// refuses a NaN or Inf in any rank's gradients, naming the rank and the parameter.
std::unique_ptr<comm::GradientReducer<Space, float>> make_reducer(const comm::Mesh& mesh, const TrainOptions& o,
                                                                  const std::vector<ParameterSpec>& parameters);

/// Moves the model's gradients into the memory the reducer sums in place, where it has one (the
/// data-parallel group on one node): the mean then copies nothing. Collective over the group.
template <class Model>
void place_gradients(const Space& space, comm::GradientReducer<Space, float>& reducer, Model& model) {
  const auto storage = reducer.shared_gradient_storage(std::int64_t(model.parameters().gradient_buffer().extent(0)));
  if (storage.data() != nullptr) model.place_gradients(space, storage);
}

/// With --overlap-reduction, before the step's micro-batches: starts the reduction that the last
/// micro-batch's backward feeds through the hook returned (an empty hook without the flag).
/// Collective over the data-parallel group. `local_weight`: this replica's samples or tokens in
/// the whole step.
GradientsReady start_reduction(const Space& space, const TrainOptions& o, comm::GradientReducer<Space, float>& reducer,
                               const ParameterList<float, Memory>& parameters, double local_weight);

/// The end of every step: the gradients (sums over this replica's `local_weight` samples or
/// tokens) reduced over the data-parallel group as --reduce says (or the overlapped reduction
/// finished), then the optimizer's update.
void reduce_and_step(const Space& space, const TrainOptions& o, comm::GradientReducer<Space, float>& reducer,
                     optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                     double local_weight);

/// Runs `backward` (this rank's passes of the step); with an overlapped reduction in flight, a
/// failure there is handed to the reduction's finish(), which makes it the same error on every
/// rank of the data-parallel group instead of leaving the others waiting.
template <class Passes>
void run_passes(const Space& space, comm::GradientReducer<Space, float>& reducer, Passes&& passes) {
  if (!reducer.overlapping()) return passes();
  const std::string failure = ::lather::Impl::local_failure(nullptr, std::forward<Passes>(passes));
  if (!failure.empty()) reducer.finish(space, failure);  // throws on every rank
}

/// A --shard-parameters step of `passes` micro-batches: `pass(k, ready, needed)` runs micro-batch
/// k's forward and backward with the shards' hooks (the model setting its gradients, not adding:
/// the owned bands sum them) and returns its weight (samples or tokens), or returns 0 without
/// running the model where this replica has no sample in it: that pass's collectives then run with
/// zero gradients. A failure in the passes makes the rest of the schedule before the step's
/// agreement, which throws it on every rank; then the owned gradients are the weighted mean and
/// each rank's optimizer updates its units (one agreement: SOAP and Muon, built on this rank
/// alone, do not agree themselves). Collective over the data-parallel group.
template <class Pass>
void sharded_step(const Space& space, ParameterShards& shards, int passes, optim::Optimizer<Space, float>& optimizer,
                  const ParameterList<float, Memory>& parameters, Pass&& pass) {
  shards.start_step(space, passes);
  const GradientsReady ready = shards.ready_hook(space);
  const ParametersNeeded needed = shards.needed_hook(space);
  double weight = 0;
  const std::string failure = ::lather::Impl::local_failure(nullptr, [&] {
    for (int k = 0; k < passes; ++k) {
      const double w = pass(k, ready, needed);
      if (w == 0) shards.pass_without_data(space);
      weight += w;
    }
  });
  shards.finish_step(space, weight, failure);  // throws on every rank on a failure
  shards.group().run_agreed("optimizer step", [&] { optimizer.step(space, parameters); });
  shards.values_changed();
}

/// One evaluation round's forward pass, `pass`, where this rank has samples in it (`has_data`).
/// Sharded, every rank makes the round's gathers, with samples or not, and a failure in the pass
/// is agreed over the group (the same error on every rank) before the next round's gathers.
template <class Pass>
void evaluation_round(const Space& space, ParameterShards* shards, bool has_data, Pass&& pass) {
  if (!shards) {
    if (has_data) pass();
    return;
  }
  std::string failure;
  if (has_data)
    failure = ::lather::Impl::local_failure(nullptr, std::forward<Pass>(pass));
  else
    shards->forward_without_data(space);
  shards->finish_forward(space, failure);
}

/// The index of the last of `parts` shares of `count` items that holds any (-1: none).
long last_nonempty_share(long count, long parts);

/// The step on samples order[begin, end) of the training set (the global batch; this replica
/// takes its share). Collective over the mesh.
StepSums training_step(const Space& space, const TrainOptions& o, const data::LabelledImages& train_set,
                       const std::vector<std::int32_t>& order, long begin, long end, int replicas, int replica,
                       StepParts& parts);

}  // namespace lather::train
