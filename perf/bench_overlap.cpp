// lather-bench overlap: how much of the gradient reduction a training step exposes, blocking
// (every bucket after the backward) and overlapped (each bucket as the backward finishes it,
// GradientReducer::start/ready/finish), for the MLP and the transformer on the world's ranks as
// replicas. A step is this rank's forward and backward passes on synthetic data plus the token- or
// sample-weighted mean of the gradients (no optimizer: it adds the same time to every mode). Three
// modes run in turn, step by step, so that load from elsewhere hits them alike:
//   compute      the same step with the reduction over a group of this rank alone: the same
//                calls and shapes, no communication (the no-op baseline)
//   blocking     reduce() after the backward; its time alone is comm_seconds
//   overlapped   start() before, ready() from the backward layer by layer, finish() after
// One JSON object per model, printed by rank 0, with the slowest rank's medians:
//   exposed_blocking_seconds / exposed_overlapped_seconds   step minus compute: the median of
//                the differences within each round of the three modes (paired, so that the
//                drift of a shared machine's speed between rounds cancels)
//   hidden_fraction   1 - exposed_overlapped / exposed_blocking (what overlap hid)
//   ratio             overlapped_seconds / blocking_seconds (the baseline)
//   same_bits         the overlapped gradients equal the blocking ones bit for bit (every rank)
//
// With --step-gather OPTIMIZER (shampoo, soap, muon) it measures the distributed step's all-gather
// of new values instead: a step is the passes, the blocking reduction and the optimizer's step,
// in two modes run in turn (the same weights and data):
//   blocking     the whole exchange inside step() (the baseline)
//   overlapped   Optimizer::overlap_exchange: the next forward waits for each layer's values
// One JSON object per model ("bench": "step_gather") with the slowest rank's medians of both
// steps, their ratio, the seconds the overlapped forward waited for values (needed_wait_seconds:
// the gather left exposed) and same_bits (the values after the last step, every rank). Shampoo
// runs with shared_memory_gather off, so that its values travel through MPI as across nodes.
#include "bench_common.hpp"

#include <lather/comm/mesh.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/comm/replicas.hpp>
#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/nn/mlp.hpp>
#include <lather/nn/transformer.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/soap.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace lather::bench {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Reducer = comm::GradientReducer<Space, float>;

struct OverlapOptions {
  std::vector<std::string> models = {"mlp", "transformer"};
  std::vector<int> hidden = {512, 256};
  int mlp_batch = 256;                                                                  ///< samples per rank
  int n_layer = 4, n_head = 4, d_model = 128, block_size = 64, transformer_batch = 16;  ///< windows per rank
  std::size_t bucket_bytes = std::size_t(1) << 20;
  int steps = 30;
  int warmup_steps = 5;
  std::string step_gather;  ///< an optimizer: measure its step's all-gather instead of the reduction
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

/// The half-width of the middle half of `values` (the interquartile range over 2), as a one-value
/// list: the noise an exposed figure sits in.
std::vector<double> spread(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  if (values.size() < 4) return {0.0};
  return {(values[values.size() * 3 / 4] - values[values.size() / 4]) / 2};
}

/// One model's step: its passes (with the hooks, or none) and what it reduces.
struct Workload {
  std::string name;
  std::function<void(const GradientsReady&, const ParametersNeeded&)> passes;
  std::vector<std::pair<std::size_t, std::size_t>> layers;  ///< parameter ranges, in forward order
  const ParameterList<float, Space::memory_space>* parameters = nullptr;
  std::function<void(const FlatTensor<float, Space::memory_space>&)> place_gradients;
  double weight = 1;  ///< this rank's samples or tokens
  std::int64_t parameter_count = 0;
};

Workload mlp_workload(const OverlapOptions& o, std::vector<std::shared_ptr<void>>& keep) {
  std::vector<int> sizes = {784};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(10);
  auto model = std::make_shared<nn::Mlp<Space>>(Space(), sizes, 7);
  using Mlp = nn::Mlp<Space>;
  auto x = std::make_shared<Mlp::Matrix>("bench::x", o.mlp_batch, 784);
  auto y = std::make_shared<Mlp::Labels>("bench::y", o.mlp_batch);
  {
    auto hx = Kokkos::create_mirror_view(*x);
    auto hy = Kokkos::create_mirror_view(*y);
    std::mt19937 random(11);
    std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
    for (int i = 0; i < o.mlp_batch; ++i) {
      for (int j = 0; j < 784; ++j) hx(i, j) = pixel(random);
      hy(i) = std::int32_t(random() % 10);
    }
    Kokkos::deep_copy(*x, hx);
    Kokkos::deep_copy(*y, hy);
  }
  keep.push_back(model), keep.push_back(x), keep.push_back(y);
  Workload w;
  w.name = "mlp";
  w.passes = [model, x, y](const GradientsReady& ready, const ParametersNeeded& needed) {
    model->train_batch(Space(), *x, *y, false, ready, needed);
  };
  for (std::size_t l = 0; l < model->layers().size(); ++l) w.layers.emplace_back(2 * l, 2 * l + 2);
  w.parameters = &model->parameters();
  w.place_gradients = [model](const FlatTensor<float, Space::memory_space>& s) { model->place_gradients(Space(), s); };
  w.weight = o.mlp_batch;
  return w;
}

Workload transformer_workload(const OverlapOptions& o, std::vector<std::shared_ptr<void>>& keep) {
  nn::TransformerConfig config;
  config.vocab_size = 65;
  config.n_layer = o.n_layer, config.n_head = o.n_head, config.d_model = o.d_model, config.block_size = o.block_size;
  config.validate();
  using Model = nn::Transformer<Space, float>;
  auto model = std::make_shared<Model>(Space(), config, 7);
  const int rows = o.transformer_batch * o.block_size;
  auto inputs = std::make_shared<Model::Tokens>("bench::inputs", rows);
  auto targets = std::make_shared<Model::Tokens>("bench::targets", rows);
  {
    auto hi = Kokkos::create_mirror_view(*inputs);
    auto ht = Kokkos::create_mirror_view(*targets);
    std::mt19937 random(13);
    for (int i = 0; i < rows; ++i) hi(i) = std::int32_t(random() % 65), ht(i) = std::int32_t(random() % 65);
    Kokkos::deep_copy(*inputs, hi);
    Kokkos::deep_copy(*targets, ht);
  }
  keep.push_back(model), keep.push_back(inputs), keep.push_back(targets);
  Workload w;
  w.name = "transformer";
  const int batch = o.transformer_batch, time = o.block_size;
  w.passes = [model, inputs, targets, batch, time](const GradientsReady& ready, const ParametersNeeded& needed) {
    model->train_batch(Space(), batch, time, *inputs, *targets, false, ready, needed);
  };
  w.layers = model->parameter_layers();
  w.parameters = &model->parameters();
  w.place_gradients = [model](const FlatTensor<float, Space::memory_space>& s) { model->place_gradients(Space(), s); };
  w.weight = double(rows);
  return w;
}

/// --model `name`'s workload (its memory kept alive by `keep`).
Workload make_workload(const OverlapOptions& o, const std::string& name, std::vector<std::shared_ptr<void>>& keep) {
  LATHER_REQUIRE(name == "mlp" || name == "transformer", "--model: '", name, "' is not mlp or transformer");
  return name == "mlp" ? mlp_workload(o, keep) : transformer_workload(o, keep);
}

comm::ReduceOptions reduce_options(const OverlapOptions& o) {
  comm::ReduceOptions options;
  options.fusion_bytes = o.bucket_bytes;
  return options;
}

void run_model(const OverlapOptions& o, const std::string& name, const comm::Group& world) {
  // Two copies of the model (the same weights and data): one per world reducer, each with its
  // gradients placed in its reducer's window, as lather-train places them.
  std::vector<std::shared_ptr<void>> keep;
  Workload blocking_model = make_workload(o, name, keep), overlapped_model = make_workload(o, name, keep);
  const comm::ReduceOptions options = reduce_options(o);
  Reducer blocking(world, options), overlapped(world, options);
  Reducer alone(world.split(world.rank(), 0), options);  // the no-op of the same shapes
  for (const auto& pair :
       {std::make_pair(&blocking_model, &blocking), std::make_pair(&overlapped_model, &overlapped)}) {
    const auto elements = std::int64_t(pair.first->parameters->gradient_buffer().extent(0));
    const auto storage = pair.second->shared_gradient_storage(elements);
    if (storage.data() != nullptr) pair.first->place_gradients(storage);
  }
  const auto& grads = blocking_model.parameters->gradients();
  const double weight = blocking_model.weight;
  std::vector<double> compute, blocking_step, comm, overlapped_step, finish_wait;
  bool same_bits = true;
  const GradientsReady ready = [&](std::size_t first, std::size_t last) {
    if (first < last)
      overlapped.ready(Space(), first, last);
    else
      overlapped.progress(Space());
  };
  for (int step = 0; step < o.steps; ++step) {
    const bool measured = step >= o.warmup_steps;
    world.barrier();
    double t0 = now();
    blocking_model.passes({}, {});
    alone.weighted_mean(Space(), grads, weight);
    Kokkos::fence();
    if (measured) compute.push_back(now() - t0);

    world.barrier();
    t0 = now();
    blocking_model.passes({}, {});
    Kokkos::fence();
    const double t1 = now();
    blocking.weighted_mean(Space(), grads, weight);
    Kokkos::fence();
    const double t2 = now();
    if (measured) blocking_step.push_back(t2 - t0), comm.push_back(t2 - t1);

    world.barrier();
    t0 = now();
    overlapped.start(Space(), overlapped_model.parameters->gradients(), comm::ReduceOp::weighted_mean, weight);
    overlapped_model.passes(ready, {});
    const double t3 = now();
    overlapped.finish(Space());
    Kokkos::fence();
    const double t4 = now();
    if (measured) overlapped_step.push_back(t4 - t0), finish_wait.push_back(t4 - t3);
    if (step == 0) {
      // The same weights, data and reduction: the same bits, or the overlap is wrong.
      const auto a = comm::checksum<Space, float>(Space(), grads);
      const auto b = comm::checksum<Space, float>(Space(), overlapped_model.parameters->gradients());
      same_bits = world.allreduce(int(a == b), comm::Combine::min) == 1;
    }
  }
  const auto slowest = [&](const std::vector<double>& v) { return world.allreduce(median(v), comm::Combine::max); };
  const double c = slowest(compute), b = slowest(blocking_step), r = slowest(comm), v = slowest(overlapped_step),
               f = slowest(finish_wait);
  std::vector<double> blocking_minus_compute, overlapped_minus_compute;
  for (std::size_t k = 0; k < compute.size(); ++k) {
    blocking_minus_compute.push_back(blocking_step[k] - compute[k]);
    overlapped_minus_compute.push_back(overlapped_step[k] - compute[k]);
  }
  const double exposed_blocking = slowest(blocking_minus_compute);
  const double exposed_overlapped = slowest(overlapped_minus_compute);
  const double exposed_spread = slowest(spread(blocking_minus_compute));
  std::int64_t buckets = 0, running = 0;
  for (const auto& g : grads) {  // ReduceOptions::fusion_bytes packing, as the reducer plans it
    const std::int64_t bytes = std::int64_t(g.extent(0) * sizeof(float));
    if (running > 0 && running + bytes > std::int64_t(o.bucket_bytes)) ++buckets, running = 0;
    running += bytes;
  }
  buckets += running > 0 ? 1 : 0;
  if (world.rank() == 0)
    emit({{"bench", "overlap"},
          {"model", name},
          {"ranks", world.size()},
          {"parameters", blocking_model.parameters->gradient_buffer().extent(0)},
          {"bucket_bytes", o.bucket_bytes},
          {"buckets", buckets},
          {"steps", int(compute.size())},
          {"compute_seconds", c},
          {"blocking_seconds", b},
          {"comm_seconds", r},
          {"overlapped_seconds", v},
          {"finish_wait_seconds", f},
          {"exposed_blocking_seconds", exposed_blocking},
          {"exposed_overlapped_seconds", exposed_overlapped},
          {"hidden_fraction", exposed_blocking > 0 ? 1.0 - exposed_overlapped / exposed_blocking : 0.0},
          {"exposed_spread_seconds", exposed_spread},
          {"ratio", v / b},
          {"same_bits", same_bits}});
}

/// The optimizer of --step-gather on `parameters`, its step distributed over `world`.
std::unique_ptr<optim::Optimizer<Space, float>> step_optimizer(const std::string& kind,
                                                               const std::vector<ParameterSpec>& parameters,
                                                               const comm::Group& world) {
  if (kind == "muon")
    return std::make_unique<optim::Muon<Space, float>>(Space(), parameters, optim::MuonOptions(), world);
  if (kind == "soap") {
    optim::SoapOptions options;  // lather-train's blocking and refresh
    options.block_size = 128;
    options.precondition_frequency = 10;
    return std::make_unique<optim::Soap<Space, float>>(Space(), parameters, options, world);
  }
  LATHER_REQUIRE(kind == "shampoo", "--step-gather: '", kind, "' is not shampoo, soap or muon");
  optim::ShampooOptions options;
  options.shared_memory_gather = false;  // through MPI, as across nodes
  return std::make_unique<optim::Shampoo<Space, float>>(Space(), parameters, options, world);
}

void run_step_gather(const OverlapOptions& o, const std::string& name, const comm::Group& world) {
  std::vector<std::shared_ptr<void>> keep;
  Workload blocking_model = make_workload(o, name, keep), overlapped_model = make_workload(o, name, keep);
  Reducer reducer(world, reduce_options(o));
  const auto blocking = step_optimizer(o.step_gather, blocking_model.parameters->specs(), world);
  const auto overlapped = step_optimizer(o.step_gather, overlapped_model.parameters->specs(), world);
  const bool deferred = overlapped->overlap_exchange(Space(), overlapped_model.layers);
  double waited = 0;
  const ParametersNeeded needed = [&](std::size_t first, std::size_t last) {
    const double t = now();
    overlapped->values_needed(Space(), first, last);
    waited += now() - t;
  };
  std::vector<double> blocking_step, overlapped_step, waits;
  for (int step = 0; step < o.steps; ++step) {
    const bool measured = step >= o.warmup_steps;
    for (const bool overlap : {false, true}) {
      Workload& w = overlap ? overlapped_model : blocking_model;
      world.barrier();
      waited = 0;
      const double t0 = now();
      w.passes({}, overlap ? needed : ParametersNeeded());
      reducer.weighted_mean(Space(), w.parameters->gradients(), w.weight);
      (overlap ? *overlapped : *blocking).step(Space(), *w.parameters);
      Kokkos::fence();
      if (measured) (overlap ? overlapped_step : blocking_step).push_back(now() - t0);
      if (measured && overlap) waits.push_back(waited);
    }
  }
  overlapped->values_needed(Space());
  const auto a = comm::checksum<Space, float>(Space(), blocking_model.parameters->values());
  const auto b = comm::checksum<Space, float>(Space(), overlapped_model.parameters->values());
  const bool same_bits = world.allreduce(int(a == b), comm::Combine::min) == 1;
  const auto slowest = [&](const std::vector<double>& v) { return world.allreduce(median(v), comm::Combine::max); };
  const double bs = slowest(blocking_step), os = slowest(overlapped_step), wait = slowest(waits),
               noise = slowest(spread(blocking_step));
  if (world.rank() == 0)
    emit({{"bench", "step_gather"},
          {"model", name},
          {"optimizer", o.step_gather},
          {"ranks", world.size()},
          {"parameters", blocking_model.parameters->gradient_buffer().extent(0)},
          {"layers", overlapped_model.layers.size()},
          {"deferred", deferred},
          {"steps", int(blocking_step.size())},
          {"blocking_seconds", bs},
          {"overlapped_seconds", os},
          {"needed_wait_seconds", wait},
          {"blocking_spread_seconds", noise},
          {"ratio", os / bs},
          {"same_bits", same_bits}});
}

void run_overlap(const OverlapOptions& o) {
  LATHER_REQUIRE(o.steps > o.warmup_steps && o.warmup_steps >= 0, "--steps ", o.steps, " must exceed --warmup-steps ",
                 o.warmup_steps);
  const comm::Group world(MPI_COMM_WORLD);
  for (const auto& model : o.models) {
    if (o.step_gather.empty())
      run_model(o, model, world);
    else
      run_step_gather(o, model, world);
  }
}

}  // namespace

void register_overlap(CLI::App& app) {
  auto options = std::make_shared<OverlapOptions>();
  auto* sub = app.add_subcommand("overlap",
                                 "Communication a step exposes, blocking and overlapped with the backward, against "
                                 "the same step without communication (MLP and transformer, ranks as replicas)");
  add_list_option(*sub, "--model", options->models, "mlp, transformer");
  add_list_option(*sub, "--hidden", options->hidden, "MLP hidden sizes");
  sub->add_option("--mlp-batch", options->mlp_batch, "MLP samples per rank")->capture_default_str();
  sub->add_option("--n-layer", options->n_layer, "Transformer blocks")->capture_default_str();
  sub->add_option("--n-head", options->n_head, "Transformer heads")->capture_default_str();
  sub->add_option("--d-model", options->d_model, "Transformer width")->capture_default_str();
  sub->add_option("--block-size", options->block_size, "Tokens per window")->capture_default_str();
  sub->add_option("--transformer-batch", options->transformer_batch, "Transformer windows per rank")
      ->capture_default_str();
  sub->add_option("--bucket-bytes", options->bucket_bytes, "Bytes per gradient bucket")->capture_default_str();
  sub->add_option("--steps", options->steps, "Steps per mode, warm-up included")->capture_default_str();
  sub->add_option("--warmup-steps", options->warmup_steps, "Steps not measured")->capture_default_str();
  sub->add_option("--step-gather", options->step_gather,
                  "Measure this optimizer's (shampoo, soap, muon) distributed step all-gather, whole and overlapped "
                  "with the next forward, instead of the reduction");
  sub->callback([options] { run_overlap(*options); });
}

}  // namespace lather::bench
