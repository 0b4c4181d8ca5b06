#include "training_step.hpp"

#include <lather/optim/sharding.hpp>

namespace lather::train {

std::unique_ptr<comm::GradientReducer<Space, float>> make_reducer(const comm::Mesh& mesh, const TrainOptions& o,
                                                                  const std::vector<ParameterSpec>& parameters) {
  comm::ReduceOptions options;
  options.wire_precision = o.wire_precision;
  // One read of the gradients per step, folded into the layout agreement the reducer makes
  // anyway: a diverging run stops with the rank and parameter named instead of spreading NaN.
  options.check_finite = true;
  options.fusion_bytes = o.bucket_bytes > 0    ? std::size_t(o.bucket_bytes)
                         : o.overlap_reduction ? std::size_t(1) << 20
                                               : options.fusion_bytes;
  auto reducer = std::make_unique<comm::GradientReducer<Space, float>>(mesh, options);
  std::vector<std::string> names;
  for (const auto& spec : parameters) names.push_back(spec.name);
  reducer->set_tensor_names(std::move(names));
  return reducer;
}

namespace {

/// The shards of a model's parameters [specs] read layer by layer, in the layouts of --optimizer,
/// holding the model's initial values.
std::unique_ptr<ParameterShards> make_shards(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                             const std::vector<ParameterSpec>& specs,
                                             std::vector<ParameterShards::Layer> layers,
                                             const ParameterList<float, Memory>::tensor_list& values) {
  std::vector<comm::ShardLayout> layouts;  // the elementwise optimizers: any row
  if (o.optimizer == OptimizerKind::shampoo) layouts = optim::shampoo_shard_layouts(specs, o.shampoo_options());
  if (o.optimizer == OptimizerKind::soap) layouts = optim::soap_shard_layouts(specs, o.soap_options());
  auto shards = std::make_unique<ParameterShards>(space, mesh.data_parallel(), specs, std::move(layers), layouts);
  shards->scatter_values(space, values);
  return shards;
}

}  // namespace

std::unique_ptr<ParameterShards> shard_parameters(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                                  nn::Mlp<Space>& model) {
  std::vector<ParameterShards::Layer> layers;
  for (const auto& [first, last] : mlp_parameter_layers(model)) layers.push_back({first, last});
  auto shards = make_shards(space, o, mesh, model.parameter_specs(), layers, model.parameters().values());
  model.adopt_parameters(shards->gathered());
  return shards;
}

std::unique_ptr<ParameterShards> shard_parameters(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                                  nn::Transformer<Space, float>& model) {
  std::vector<ParameterShards::Layer> layers;
  for (const auto& [first, last] : model.parameter_layers()) layers.push_back({first, last});
  auto shards = make_shards(space, o, mesh, model.parameter_specs(), layers, model.parameters().values());
  model.adopt_parameters(shards->gathered());
  return shards;
}

std::string describe_sharded_memory(const comm::Mesh& mesh, const ParameterShards& shards,
                                    const optim::StateMemoryReport& report) {
  const auto m = shards.memory();
  const auto mib = [](std::int64_t bytes) { return std::to_string(double(bytes) / 1048576.0).substr(0, 6); };
  // What sharding divides: values, gradients and state (the optimizer's scratch aside), with the
  // buffers it adds.
  const std::int64_t held =
      mesh.world().allreduce(m.total() + report.total() - report.workspace_bytes, comm::Combine::max);
  return "rank 0 sharded parameters: owned values " + mib(m.owned_values) + " MiB, owned gradients " +
         mib(m.owned_gradients) + " MiB, gather buffers " + mib(m.gather_values + m.gather_gradients) +
         " MiB; values, gradients, state without workspace and buffers on the largest rank " + mib(held) + " MiB";
}

const ParameterList<float, Memory>& sharded_parameters(const TrainOptions& o, const ParameterShards& shards) {
  const bool matrices =
      o.optimizer == OptimizerKind::shampoo || o.optimizer == OptimizerKind::soap || o.optimizer == OptimizerKind::muon;
  return matrices ? shards.slices() : shards.owned();
}

std::vector<std::pair<std::size_t, std::size_t>> mlp_parameter_layers(const nn::Mlp<Space>& model) {
  std::vector<std::pair<std::size_t, std::size_t>> layers;
  for (std::size_t l = 0; l < model.layers().size(); ++l) layers.emplace_back(2 * l, 2 * l + 2);
  return layers;
}

void overlap_step_gather(const Space& space, const TrainOptions& o, optim::Optimizer<Space, float>& optimizer,
                         std::vector<std::pair<std::size_t, std::size_t>> layers, const ProgressLog& log) {
  if (!o.overlap_step_gather) return;
  if (!optimizer.overlap_exchange(space, std::move(layers)))
    log.say("--overlap-step-gather: " + optimizer.name() +
            "'s step has no all-gather of new values here (one replica, a replicated step, or weight shards "
            "without a distributed step): nothing to overlap");
}

ParametersNeeded step_gather_hook(const Space& space, const TrainOptions& o,
                                  optim::Optimizer<Space, float>& optimizer) {
  return o.overlap_step_gather ? optimizer.needed_hook(space) : ParametersNeeded();
}

long last_nonempty_share(long count, long parts) {
  for (long k = parts; k-- > 0;) {
    const auto [begin, end] = share(count, parts, k);
    if (end > begin) return k;
  }
  return -1;
}

GradientsReady start_reduction(const Space& space, const TrainOptions& o, comm::GradientReducer<Space, float>& reducer,
                               const ParameterList<float, Memory>& parameters, double local_weight) {
  if (!o.overlap_reduction) return {};
  // Adasum reduces per-replica means: the weight is not the reducer's (reduce_and_step scales).
  reducer.start(space, parameters.gradients(), o.reduce,
                o.reduce == comm::ReduceOp::weighted_mean ? local_weight : 1.0);
  auto* target = &reducer;
  return [target, space](std::size_t first, std::size_t last) {
    if (first < last)
      target->ready(space, first, last);
    else
      target->progress(space);
  };
}

void reduce_and_step(const Space& space, const TrainOptions& o, comm::GradientReducer<Space, float>& reducer,
                     optim::Optimizer<Space, float>& optimizer, const ParameterList<float, Memory>& parameters,
                     double local_weight) {
  const auto& grads = parameters.gradients();
  // A replica with no sample this step ran no backward: it contributes zero gradients (overlapped,
  // they are ready now).
  if (local_weight == 0) {
    Kokkos::deep_copy(space, parameters.gradient_buffer(), 0.0f);
    if (reducer.overlapping()) reducer.ready(space, 0, grads.size());
  }
  if (o.reduce != comm::ReduceOp::weighted_mean) {
    // Adasum combines per-replica gradients: the mean over this replica's samples (overlapped,
    // its buckets wait for finish(), so this comes first either way).
    const float scale = local_weight > 0 ? float(1.0 / local_weight) : 0.0f;
    const auto all = parameters.gradient_buffer();
    Kokkos::parallel_for(
        "lather-train::scale", Kokkos::RangePolicy<Space>(space, 0, all.extent(0)),
        KOKKOS_LAMBDA(std::int64_t k) { all(k) *= scale; });
  }
  if (reducer.overlapping()) reducer.finish(space);
  // Gradients are sums over this replica's samples (or tokens): their weighted mean is the mean
  // over the global batch, whatever the rank count.
  else if (o.reduce == comm::ReduceOp::weighted_mean)
    reducer.weighted_mean(space, grads, local_weight);
  else if (o.reduce == comm::ReduceOp::adasum)
    reducer.adasum(space, grads);
  else
    reducer.adasum_approx(space, grads);
  optimizer.step(space, parameters);
}

namespace {

/// The step with --shard-parameters: every micro-batch's passes gather each layer before its
/// forward and backward and reduce-scatter its gradients after its backward; a micro-batch
/// without samples for this replica makes the same collectives with zero gradients, and a failure
/// in the passes makes the rest of them before the step's agreement.
StepSums sharded_mlp_step(const Space& space, const TrainOptions& o, const data::LabelledImages& train_set,
                          const std::vector<std::int32_t>& order, long begin, long mine_begin, long mine_end,
                          StepParts& parts) {
  StepSums sums;
  sharded_step(space, *parts.shards, o.accumulate, parts.optimizer, sharded_parameters(o, *parts.shards),
               [&](int k, const GradientsReady& ready, const ParametersNeeded& needed) {
                 const auto [m0, m1] = share(mine_end - mine_begin, o.accumulate, k);
                 if (m1 == m0) return 0.0;
                 const auto [x, y] = parts.staging.load(space, train_set, order.data(), begin + mine_begin + m0,
                                                        begin + mine_begin + m1);
                 const auto r = parts.model.train_batch(space, x, y, false, ready, needed);
                 sums.loss += r.loss_sum;
                 sums.correct += double(r.correct);
                 sums.samples += double(r.samples);
                 return double(r.samples);
               });
  return sums;
}

}  // namespace

StepSums training_step(const Space& space, const TrainOptions& o, const data::LabelledImages& train_set,
                       const std::vector<std::int32_t>& order, long begin, long end, int replicas, int replica,
                       StepParts& parts) {
  const auto& parameters = parts.model.parameters();
  // Not structured bindings: the passes' lambda below captures them (C++17 forbids it; clang
  // refuses).
  const auto mine = share(end - begin, replicas, replica);
  const long mine_begin = mine.first, mine_end = mine.second;
  if (parts.shards) return sharded_mlp_step(space, o, train_set, order, begin, mine_begin, mine_end, parts);
  const GradientsReady ready = start_reduction(space, o, parts.reducer, parameters, double(mine_end - mine_begin));
  const long last = last_nonempty_share(mine_end - mine_begin, o.accumulate);
  const ParametersNeeded needed = step_gather_hook(space, o, parts.optimizer);
  StepSums sums;
  run_passes(space, parts.reducer, [&] {
    for (int k = 0; k < o.accumulate; ++k) {
      const auto [m0, m1] = share(mine_end - mine_begin, o.accumulate, k);
      if (m1 == m0) continue;
      const auto [x, y] =
          parts.staging.load(space, train_set, order.data(), begin + mine_begin + m0, begin + mine_begin + m1);
      const auto r =
          parts.model.train_batch(space, x, y, sums.samples > 0, k == last ? ready : GradientsReady(), needed);
      sums.loss += r.loss_sum;
      sums.correct += double(r.correct);
      sums.samples += double(r.samples);
    }
  });
  reduce_and_step(space, o, parts.reducer, parts.optimizer, parameters, sums.samples);
  return sums;
}

}  // namespace lather::train
