// lather-bench plan: what a training step of the MLP or the transformer will cost on N ranks, per
// layout, before an allocation is spent on it (plan_model.hpp). In one run, on the ranks it is
// launched with:
//  1. the costs of one rank's work, measured: every rank runs the whole model alone at several
//     batch sizes and its optimizer's step, at the same time (so the ranks share the node as a
//     training run does); the slowest rank's figures count. --costs FILE replaces this with
//     figures measured elsewhere (a GPU: --write-costs on that machine);
//  2. the network: alpha and beta fitted to the gradient mean of 4 B and 4 MiB over the launched
//     ranks, or --network slingshot|infiniband, or --alpha-us/--beta-ns-per-byte;
//  3. --check: every layout the launched ranks can form, run for real (lather-train's step:
//     passes, reduction, optimizer), its median step time beside the prediction;
//  4. the table: each layout's step time, memory per rank and scaling efficiency on --table-ranks.
#include "bench_common.hpp"
#include "plan_model.hpp"

#include "optimizer_factory.hpp"
#include "training_options.hpp"
#include "training_step.hpp"

#include <lather/comm/mesh.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/core/error.hpp>
#include <lather/nn/mlp.hpp>
#include <lather/nn/pipeline_schedule.hpp>
#include <lather/nn/transformer.hpp>
#include <lather/optim/muon.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <random>

namespace lather::bench {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

struct PlanOptions {
  std::string model = "transformer";
  std::vector<int> hidden = {512, 256};
  int n_layer = 4, n_head = 4, d_model = 128, block_size = 64;
  int batch = 32;         ///< samples (MLP) or windows (transformer) per replica per step
  int micro_batches = 4;  ///< of a pipeline layout
  std::string optimizer = "adamw";
  std::string network;  ///< "", slingshot, infiniband
  double alpha_us = -1, beta_ns_per_byte = -1;
  std::string costs_file, write_costs;
  bool check = true;
  int steps = 20, warmup_steps = 5;
  std::vector<int> table_ranks = {8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// A model of the run's kind on `mesh`, its passes on `samples` samples in `micro` micro-batches
/// (the hook for the last one's backward), and its parameters.
struct Runner {
  std::function<void(int samples, int micro, const GradientsReady& ready)> passes;
  std::function<const ParameterList<float, Memory>&()> parameters;
  std::function<void(const FlatTensor<float, Memory>&)> place_gradients;
  double activation_bytes_per_row = 0;
  std::function<double()> activation_bytes;  ///< held now, from the Views (0 where not known)
  /// Its parameters sharded over the mesh's replicas (lather-train's shard_parameters), and a
  /// step's passes through them.
  std::function<std::unique_ptr<train::ParameterShards>(const comm::Mesh&)> shard;
  std::function<void(int samples, int micro, train::ParameterShards& shards)> sharded_passes;
  /// Per layer a sharded run gathers whole: its parameters and its tensors.
  std::vector<double> layer_parameters, layer_tensors;
};

/// A rank's memory by kind, from the Views it holds after the steps.
struct MeasuredMemory {
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
};

nn::TransformerConfig transformer_config(const PlanOptions& o) {
  nn::TransformerConfig c;
  c.vocab_size = 128;  // Shakespeare's 65 characters, padded as lather-train pads them (to whole 128s)
  c.n_layer = o.n_layer, c.n_head = o.n_head, c.d_model = o.d_model, c.block_size = o.block_size;
  return c;
}

std::vector<int> mlp_sizes(const PlanOptions& o) {
  std::vector<int> sizes = {784};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(10);
  return sizes;
}

train::TrainOptions optimizer_options(const PlanOptions& o, int weight_shards = 1);

Runner make_runner(const PlanOptions& o, const comm::Mesh& mesh, int largest_samples) {
  Runner r;
  std::mt19937 random(5);
  if (o.model == "mlp") {
    using Mlp = nn::Mlp<Space>;
    auto model = std::make_shared<Mlp>(Space(), mlp_sizes(o), 3, mesh);
    auto x = std::make_shared<Mlp::Matrix>("plan::x", largest_samples, 784);
    auto y = std::make_shared<Mlp::Labels>("plan::y", largest_samples);
    auto hx = Kokkos::create_mirror_view(*x);
    auto hy = Kokkos::create_mirror_view(*y);
    for (int i = 0; i < largest_samples; ++i) {
      for (int j = 0; j < 784; ++j) hx(i, j) = float(random() % 256) / 255.0f;
      hy(i) = std::int32_t(random() % 10);
    }
    Kokkos::deep_copy(*x, hx);
    Kokkos::deep_copy(*y, hy);
    r.passes = [model, x, y](int samples, int micro, const GradientsReady& ready) {
      for (int m = 0; m < micro; ++m) {
        const auto rows = std::make_pair(samples * m / micro, samples * (m + 1) / micro);
        const Mlp::Matrix xs = Kokkos::subview(*x, rows, Kokkos::ALL);
        const Mlp::Labels ys = Kokkos::subview(*y, rows);
        model->train_batch(Space(), xs, ys, m > 0, m + 1 == micro ? ready : GradientsReady());
      }
    };
    r.parameters = [model]() -> const ParameterList<float, Memory>& { return model->parameters(); };
    r.place_gradients = [model](const FlatTensor<float, Memory>& s) { model->place_gradients(Space(), s); };
    r.shard = [model, t = optimizer_options(o)](const comm::Mesh& mesh) {
      return train::shard_parameters(Space(), t, mesh, *model);
    };
    r.sharded_passes = [model, x, y](int samples, int micro, train::ParameterShards& shards) {
      shards.start_step(Space(), micro);
      for (int m = 0; m < micro; ++m) {
        const auto rows = std::make_pair(samples * m / micro, samples * (m + 1) / micro);
        const Mlp::Matrix xs = Kokkos::subview(*x, rows, Kokkos::ALL);
        const Mlp::Labels ys = Kokkos::subview(*y, rows);
        model->train_batch(Space(), xs, ys, false, shards.ready_hook(Space()), shards.needed_hook(Space()));
      }
      shards.finish_step(Space(), double(samples), "");
    };
    const auto sizes = mlp_sizes(o);
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      r.layer_parameters.push_back(double(sizes[l] + 1) * sizes[l + 1]);  // kernel and bias
      r.layer_tensors.push_back(2);
    }
    double widths = 0;
    for (const auto& layer : model->layers()) widths += layer.out;
    r.activation_bytes_per_row = 2.0 * 4.0 * widths;  // pre-activations and activations
    r.activation_bytes = [] { return 0.0; };          // nn::Mlp does not report them
    return r;
  }
  using Model = nn::Transformer<Space, float>;
  const auto config = transformer_config(o);
  auto model = std::make_shared<Model>(Space(), config, 3, mesh);
  const int rows = largest_samples * o.block_size;
  auto inputs = std::make_shared<Model::Tokens>("plan::inputs", rows);
  auto targets = std::make_shared<Model::Tokens>("plan::targets", rows);
  auto hi = Kokkos::create_mirror_view(*inputs);
  auto ht = Kokkos::create_mirror_view(*targets);
  for (int i = 0; i < rows; ++i) hi(i) = std::int32_t(random() % 65), ht(i) = std::int32_t(random() % 65);
  Kokkos::deep_copy(*inputs, hi);
  Kokkos::deep_copy(*targets, ht);
  const int time = o.block_size;
  r.passes = [model, inputs, targets, time](int samples, int micro, const GradientsReady& ready) {
    std::vector<Model::MicroBatch> batches;
    for (int m = 0; m < micro; ++m) {
      const int first = samples * m / micro, count = samples * (m + 1) / micro - first;
      const auto span = std::make_pair(std::size_t(first) * time, std::size_t(first + count) * time);
      batches.push_back({count, time, Kokkos::subview(*inputs, span), Kokkos::subview(*targets, span)});
    }
    model->train_micro_batches(Space(), nn::PipelineSchedule::one_forward_one_backward, batches, false, nullptr, ready);
  };
  r.parameters = [model]() -> const ParameterList<float, Memory>& { return model->parameters(); };
  r.place_gradients = [model](const FlatTensor<float, Memory>& s) { model->place_gradients(Space(), s); };
  r.shard = [model, t = optimizer_options(o)](const comm::Mesh& mesh) {
    return train::shard_parameters(Space(), t, mesh, *model);
  };
  r.sharded_passes = [model, inputs, targets, time](int samples, int micro, train::ParameterShards& shards) {
    shards.start_step(Space(), micro);
    for (int m = 0; m < micro; ++m) {
      const int first = samples * m / micro, count = samples * (m + 1) / micro - first;
      const auto span = std::make_pair(std::size_t(first) * time, std::size_t(first + count) * time);
      model->train_batch(Space(), count, time, Kokkos::subview(*inputs, span), Kokkos::subview(*targets, span), false,
                         shards.ready_hook(Space()), shards.needed_hook(Space()));
    }
    shards.finish_step(Space(), double(samples) * time, "");
  };
  for (const auto& [first, last] : model->parameter_layers()) {
    double elements = 0;
    for (std::size_t i = first; i < last; ++i) elements += double(element_count(model->parameter_specs()[i].shape));
    r.layer_parameters.push_back(elements);
    r.layer_tensors.push_back(double(last - first));
  }
  // Measured after a pass: the activations of one slot, per row.
  r.passes(1, 1, {});
  r.activation_bytes_per_row = double(model->memory().activations) / double(time);
  r.activation_bytes = [model] { return double(model->memory().activations); };
  return r;
}

/// lather-train's options for the model and optimizer on `weight_shards` shards: for the
/// transformer, Shampoo's and SOAP's blocks are the largest power of two up to 128 that divides
/// the shards' slices, as lather-train chooses them.
train::TrainOptions optimizer_options(const PlanOptions& o, int weight_shards) {
  train::TrainOptions t =
      train::model_defaults(o.model == "mlp" ? train::ModelKind::mlp : train::ModelKind::transformer);
  t.optimizer = train::parse_optimizer(o.optimizer);
  if (o.model == "transformer")
    for (auto& option : t.shampoo)
      if (option.rfind("block_size=", 0) == 0)
        option = "block_size=" + std::to_string(train::transformer_block_size(o.d_model, weight_shards));
  return t;
}

/// The costs of the whole model on this rank alone (every rank measures at once); the slowest
/// rank's.
plan::ModelCosts measure_costs(const PlanOptions& o, const comm::Group& world) {
  plan::ModelCosts c;
  c.model = o.model;
  const comm::Mesh alone;  // one process
  Runner runner = make_runner(o, alone, o.batch);
  c.rows_per_sample = o.model == "mlp" ? 1.0 : double(o.block_size);
  // The passes at the batch sizes the layouts run (whole, and the micro-batches of a pipeline),
  // from the smallest.
  for (int divisor : {8, 4, 2, 1}) {
    const int samples = std::max(1, o.batch / divisor);
    std::vector<double> times;
    for (int step = 0; step < o.steps; ++step) {
      Kokkos::fence();
      const double t0 = now();
      runner.passes(samples, 1, {});
      Kokkos::fence();
      if (step >= o.warmup_steps / 2) times.push_back(now() - t0);
    }
    c.pass_rows.push_back(samples * c.rows_per_sample);
    c.pass_seconds.push_back(world.allreduce(median(times), comm::Combine::max));
  }
  // The optimizer's step over every parameter (its mean: a periodic root step counts its share).
  auto& parameters = runner.parameters();
  const auto optimizer = train::make_optimizer(Space(), optimizer_options(o), parameters.specs(), alone);
  runner.passes(o.batch, 1, {});
  const int optimizer_steps = std::max(2 * o.steps, 20);
  double total = 0;
  for (int step = 0; step < optimizer_steps; ++step) {
    Kokkos::fence();
    const double t0 = now();
    optimizer->step(Space(), parameters);
    Kokkos::fence();
    if (step > 0) total += now() - t0;
  }
  c.optimizer_seconds = world.allreduce(total / (optimizer_steps - 1), comm::Combine::max);
  c.distributed_step = o.optimizer == "shampoo" || o.optimizer == "soap" || o.optimizer == "muon";
  c.parameters = double(parameters.gradient_buffer().extent(0));
  const auto report = optimizer->memory_report();
  c.optimizer_state_bytes = double(report.total());
  c.optimizer_split_bytes = double(report.total() - report.local_bytes);
  c.activation_bytes_per_row = runner.activation_bytes_per_row;
  c.layer_parameters = runner.layer_parameters;
  c.layer_tensors = runner.layer_tensors;
  if (o.optimizer == "muon") {
    // Sharded, Muon's matrices travel to their owners by rows and back every step.
    for (const auto& matrix : optim::plan_muon(parameters.specs(), optimizer_options(o).muon_options(), 1))
      if (matrix.matrix) {
        c.sharded_matrix_exchanges += 1;
        c.sharded_matrix_bytes += 4.0 * double(matrix.rows) * double(matrix.columns);
        c.optimizer_unit_costs.push_back(matrix.cost());  // whole matrices: one rank each
      }
  }
  if (o.model == "mlp") {
    // Megatron's pairs: a row-parallel layer's output is all-reduced forward, a column-parallel
    // layer's input gradient backward (not the first layer's: the data needs none).
    const auto sizes = mlp_sizes(o);
    const int hidden = int(sizes.size()) - 2;
    for (int l = 0; l < hidden; ++l) {
      const bool column = l % 2 == 0;
      if (!column || l > 0) {
        c.tensor_parallel_allreduces += 1;
        c.tensor_parallel_bytes_per_row += 4.0 * (column ? sizes[std::size_t(l)] : sizes[std::size_t(l) + 1]);
      }
    }
    c.stream_bytes_per_row = 4.0 * o.hidden.front();
    c.layers = hidden + 1;
  } else {
    // Per block two all-reduces forward (attention output, MLP output) and two backward (the
    // projections' and the MLP's input gradients); the embedding's forward and backward, and the
    // head's input gradient: 4 L + 3 of d_model values per row.
    c.tensor_parallel_allreduces = 4.0 * o.n_layer + 3;
    c.tensor_parallel_bytes_per_row = c.tensor_parallel_allreduces * 4.0 * o.d_model;
    c.stream_bytes_per_row = 4.0 * o.d_model;
    c.layers = o.n_layer;
  }
  return c;
}

nlohmann::json to_json(const plan::ModelCosts& c) {
  return {{"model", c.model},
          {"rows_per_sample", c.rows_per_sample},
          {"pass_rows", c.pass_rows},
          {"pass_seconds", c.pass_seconds},
          {"optimizer_seconds", c.optimizer_seconds},
          {"distributed_step", c.distributed_step},
          {"parameters", c.parameters},
          {"optimizer_state_bytes", c.optimizer_state_bytes},
          {"optimizer_split_bytes", c.optimizer_split_bytes},
          {"activation_bytes_per_row", c.activation_bytes_per_row},
          {"tensor_parallel_allreduces", c.tensor_parallel_allreduces},
          {"tensor_parallel_bytes_per_row", c.tensor_parallel_bytes_per_row},
          {"stream_bytes_per_row", c.stream_bytes_per_row},
          {"layers", c.layers},
          {"layer_parameters", c.layer_parameters},
          {"layer_tensors", c.layer_tensors},
          {"sharded_matrix_exchanges", c.sharded_matrix_exchanges},
          {"sharded_matrix_bytes", c.sharded_matrix_bytes},
          {"optimizer_unit_costs", c.optimizer_unit_costs}};
}

plan::ModelCosts costs_from_json(const nlohmann::json& j, const std::string& file) {
  plan::ModelCosts c;
  try {
    c.model = j.at("model");
    c.rows_per_sample = j.at("rows_per_sample");
    c.pass_rows = j.at("pass_rows").get<std::vector<double>>();
    c.pass_seconds = j.at("pass_seconds").get<std::vector<double>>();
    c.optimizer_seconds = j.at("optimizer_seconds");
    c.distributed_step = j.at("distributed_step");
    c.parameters = j.at("parameters");
    c.optimizer_state_bytes = j.at("optimizer_state_bytes");
    c.optimizer_split_bytes = j.at("optimizer_split_bytes");
    c.activation_bytes_per_row = j.at("activation_bytes_per_row");
    c.tensor_parallel_allreduces = j.at("tensor_parallel_allreduces");
    c.tensor_parallel_bytes_per_row = j.at("tensor_parallel_bytes_per_row");
    c.stream_bytes_per_row = j.at("stream_bytes_per_row");
    c.layers = j.at("layers");
    if (j.contains("layer_parameters")) c.layer_parameters = j.at("layer_parameters").get<std::vector<double>>();
    if (j.contains("layer_tensors")) c.layer_tensors = j.at("layer_tensors").get<std::vector<double>>();
    c.sharded_matrix_exchanges = j.value("sharded_matrix_exchanges", 0.0);
    c.sharded_matrix_bytes = j.value("sharded_matrix_bytes", 0.0);
    if (j.contains("optimizer_unit_costs"))
      c.optimizer_unit_costs = j.at("optimizer_unit_costs").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    LATHER_FAIL("--costs ", file, ": ", e.what());
  }
  return c;
}

/// The network: given, a preset, or fitted here to the gradient mean of 4 B and 4 MiB.
plan::Network network(const PlanOptions& o, const comm::Group& world) {
  plan::Network net;
  if (o.alpha_us >= 0 || o.beta_ns_per_byte >= 0) {
    LATHER_REQUIRE(o.alpha_us >= 0 && o.beta_ns_per_byte >= 0, "--alpha-us and --beta-ns-per-byte go together");
    net.alpha = o.alpha_us * 1e-6, net.beta = o.beta_ns_per_byte * 1e-9, net.source = "given";
    return net;
  }
  if (o.network == "slingshot") return {2.0e-6, 1.0 / 12.5e9, "Slingshot-class preset"};
  if (o.network == "infiniband") return {1.0e-6, 1.0 / 24.0e9, "InfiniBand HDR-class preset"};
  LATHER_REQUIRE(o.network.empty(), "--network: '", o.network, "' is not slingshot or infiniband");
  if (world.size() == 1) return {2.0e-6, 1.0 / 12.5e9, "Slingshot-class preset (one rank: nothing to measure)"};
  comm::GradientReducer<Space, float> reducer(world);
  const auto time = [&](std::int64_t elements) {
    TensorList<float, Memory> list = {Kokkos::View<float*, Memory>("plan::network", std::size_t(elements))};
    std::vector<double> times;
    for (int k = 0; k < 60; ++k) {
      world.barrier();
      const double t0 = now();
      reducer.mean(Space(), list);
      if (k >= 10) times.push_back(now() - t0);
    }
    return world.allreduce(median(times), comm::Combine::max);
  };
  const double small = time(1), large_bytes = 4.0 * 1024 * 1024, large = time(std::int64_t(large_bytes / 4));
  const int p = world.size();
  net.alpha = small / (2.0 * plan::log2_ceil(p));
  net.beta = std::max(0.0, large - small) / (2.0 * (p - 1) / p * (large_bytes - 4.0));
  net.source = "measured here (" + std::to_string(p) + " ranks)";
  return net;
}

/// The layouts of `ranks` ranks the run's model allows (at `table` scale: also shards and stages
/// up to 8 and 4).
std::vector<plan::Layout> layouts(const PlanOptions& o, int ranks) {
  std::vector<plan::Layout> out;
  const auto add = [&](int R, int S, int P, bool overlap, bool sharded = false) {
    plan::Layout l;
    l.replicas = R, l.shards = S, l.stages = P, l.overlap = overlap, l.sharded = sharded;
    l.micro_batches = P > 1 ? o.micro_batches : 1;
    l.bucket_bytes = overlap ? 1024.0 * 1024 : 64.0 * 1024 * 1024;
    out.push_back(l);
  };
  add(ranks, 1, 1, false);
  if (ranks > 1) add(ranks, 1, 1, true);
  // Sharded parameters (--shard-parameters), every optimizer.
  if (ranks > 1) add(ranks, 1, 1, false, true);
  for (int S = 2; S <= std::min(ranks, 8); S *= 2) {
    if (ranks % S) continue;
    const bool fits = o.model == "mlp"
                          ? std::all_of(o.hidden.begin(), o.hidden.end(), [&](int h) { return h % S == 0; })
                          : o.n_head % S == 0;
    if (fits) add(ranks / S, S, 1, false);
  }
  if (o.model == "transformer")
    for (int P = 2; P <= std::min({ranks, 4, o.n_layer}); P *= 2)
      if (ranks % P == 0) add(ranks / P, 1, P, false);
  return out;
}

/// measure_step for sharded parameters: the bands and the gather buffers are the parameters and
/// gradients a rank holds.
std::pair<double, MeasuredMemory> measure_sharded_step(const PlanOptions& o, const plan::Layout& l,
                                                       const comm::Group& world, const comm::Mesh& mesh,
                                                       Runner& runner) {
  const auto shards = runner.shard(mesh);
  const auto t = optimizer_options(o);
  const auto& parameters = train::sharded_parameters(t, *shards);
  const auto optimizer = train::make_sharded_optimizer(Space(), t, parameters.specs(), mesh);
  std::vector<double> times;
  for (int step = 0; step < o.steps; ++step) {
    world.barrier();
    const double t0 = now();
    runner.sharded_passes(o.batch, l.micro_batches, *shards);
    optimizer->step(Space(), parameters);
    shards->values_changed();
    Kokkos::fence();
    if (step >= o.warmup_steps) times.push_back(now() - t0);
  }
  const auto held = shards->memory();
  MeasuredMemory memory;
  memory.parameters = world.allreduce(double(held.owned_values + held.gather_values), comm::Combine::max);
  memory.gradients = world.allreduce(double(held.owned_gradients + held.gather_gradients), comm::Combine::max);
  memory.optimizer_state = world.allreduce(double(optimizer->memory_report().total()), comm::Combine::max);
  memory.activations = world.allreduce(runner.activation_bytes(), comm::Combine::max);
  return {world.allreduce(median(times), comm::Combine::max), memory};
}

/// The layout run for real on the world: lather-train's step, its median time (slowest rank),
/// and the largest memory by kind of any rank.
std::pair<double, MeasuredMemory> measure_step(const PlanOptions& o, const plan::Layout& l, const comm::Group& world) {
  const comm::Mesh mesh(world, l.shards, l.stages);
  Runner runner = make_runner(o, mesh, o.batch);
  if (l.sharded) return measure_sharded_step(o, l, world, mesh, runner);
  auto& parameters = runner.parameters();
  comm::ReduceOptions options;
  options.fusion_bytes = std::size_t(l.bucket_bytes);
  options.check_finite = true;
  comm::GradientReducer<Space, float> reducer(mesh, options);
  const auto storage = reducer.shared_gradient_storage(std::int64_t(parameters.gradient_buffer().extent(0)));
  if (storage.data() != nullptr) runner.place_gradients(storage);
  const auto optimizer = train::make_optimizer(Space(), optimizer_options(o, l.shards), parameters.specs(), mesh);
  const GradientsReady ready = [&](std::size_t first, std::size_t last) {
    if (first < last)
      reducer.ready(Space(), first, last);
    else
      reducer.progress(Space());
  };
  const double weight = double(o.batch) * (o.model == "mlp" ? 1 : o.block_size);
  std::vector<double> times;
  for (int step = 0; step < o.steps; ++step) {
    world.barrier();
    const double t0 = now();
    if (l.overlap) reducer.start(Space(), parameters.gradients(), comm::ReduceOp::weighted_mean, weight);
    runner.passes(o.batch, l.micro_batches, l.overlap ? ready : GradientsReady());
    if (l.overlap)
      reducer.finish(Space());
    else
      reducer.weighted_mean(Space(), parameters.gradients(), weight);
    optimizer->step(Space(), parameters);
    Kokkos::fence();
    if (step >= o.warmup_steps) times.push_back(now() - t0);
  }
  MeasuredMemory memory;
  memory.parameters = world.allreduce(double(parameters.value_buffer().span() * sizeof(float)), comm::Combine::max);
  memory.gradients = world.allreduce(double(parameters.gradient_buffer().span() * sizeof(float)), comm::Combine::max);
  memory.optimizer_state = world.allreduce(double(optimizer->memory_report().total()), comm::Combine::max);
  memory.activations = world.allreduce(runner.activation_bytes(), comm::Combine::max);
  return {world.allreduce(median(times), comm::Combine::max), memory};
}

nlohmann::json parts(const plan::Prediction& p) {
  return {{"compute_seconds", p.compute},   {"tensor_parallel_seconds", p.tensor_parallel},
          {"pipeline_seconds", p.pipeline}, {"reduction_seconds", p.reduction},
          {"exposed_seconds", p.exposed},   {"optimizer_seconds", p.optimizer},
          {"memory_bytes", p.memory_bytes}, {"predicted_seconds", p.step}};
}

void run_plan(const PlanOptions& o) {
  const comm::Group world(MPI_COMM_WORLD);
  LATHER_REQUIRE(o.model == "mlp" || o.model == "transformer", "--model: '", o.model, "' is not mlp or transformer");
  LATHER_REQUIRE(o.steps > o.warmup_steps && o.warmup_steps >= 0, "--steps ", o.steps, " must exceed --warmup-steps ",
                 o.warmup_steps);
  LATHER_REQUIRE(o.batch >= 8 && o.batch % o.micro_batches == 0, "--batch ", o.batch,
                 " must be at least 8 and a multiple of --micro-batches ", o.micro_batches);
  plan::ModelCosts costs;
  if (!o.costs_file.empty()) {
    std::ifstream in(o.costs_file);
    LATHER_REQUIRE(in, "--costs: cannot read '", o.costs_file, "'");
    costs = costs_from_json(nlohmann::json::parse(in, nullptr, false), o.costs_file);
    LATHER_REQUIRE(costs.model == o.model, "--costs ", o.costs_file, " holds the costs of the ", costs.model,
                   ", not of the ", o.model);
  } else {
    costs = measure_costs(o, world);
  }
  const plan::Network net = network(o, world);
  const bool root = world.rank() == 0;
  if (root) {
    if (!o.write_costs.empty()) std::ofstream(o.write_costs) << to_json(costs).dump(2) << "\n";
    emit({{"bench", "plan"},
          {"costs", to_json(costs)},
          {"alpha_us", net.alpha * 1e6},
          {"beta_ns_per_byte", net.beta * 1e9},
          {"network", net.source},
          {"optimizer", o.optimizer}});
  }
  const plan::Prediction one = plan::predict(costs, net, plan::Layout(), o.batch);
  if (o.check)
    for (const auto& l : layouts(o, world.size())) {
      const auto p = plan::predict(costs, net, l, o.batch);
      std::pair<double, MeasuredMemory> result;
      try {
        result = measure_step(o, l, world);
      } catch (const Error& e) {
        // A layout the optimizer refuses (Shampoo's blocks across a shard's slice): the same
        // error on every rank, agreed at its construction.
        if (root) emit({{"bench", "plan"}, {"check", true}, {"layout", l.name()}, {"skipped", e.message()}});
        continue;
      }
      const auto& [measured, memory] = result;
      auto record = parts(p);
      record.update({{"measured_parameter_bytes", memory.parameters},
                     {"measured_gradient_bytes", memory.gradients},
                     {"measured_optimizer_state_bytes", memory.optimizer_state},
                     {"measured_activation_bytes", memory.activations}});
      record.update({{"bench", "plan"},
                     {"check", true},
                     {"model", o.model},
                     {"optimizer", o.optimizer},
                     {"layout", l.name()},
                     {"ranks", l.ranks()},
                     {"micro_batches", l.micro_batches},
                     {"batch_per_replica", o.batch},
                     {"measured_seconds", measured},
                     {"residual", p.step / measured - 1.0}});
      if (root) emit(record);
    }
  for (int ranks : o.table_ranks)
    for (const auto& l : layouts(o, ranks)) {
      const auto p = plan::predict(costs, net, l, o.batch);
      auto record = parts(p);
      record.update({{"bench", "plan"},
                     {"model", o.model},
                     {"optimizer", o.optimizer},
                     {"layout", l.name()},
                     {"ranks", ranks},
                     {"micro_batches", l.micro_batches},
                     {"batch_per_replica", o.batch},
                     {"samples_per_second", p.samples_per_second},
                     {"efficiency", plan::scaling_efficiency(one, p, l)},
                     {"network", net.source}});
      if (root) emit(record);
    }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  auto* sub = app.add_subcommand("plan",
                                 "Predicted step time, memory per rank and scaling efficiency per layout on N ranks "
                                 "(alpha-beta collectives, measured per-rank costs), checked against the real step "
                                 "on the launched ranks");
  sub->add_option("--model", options->model, "mlp or transformer")->capture_default_str();
  add_list_option(*sub, "--hidden", options->hidden, "MLP hidden sizes");
  sub->add_option("--n-layer", options->n_layer, "Transformer blocks")->capture_default_str();
  sub->add_option("--n-head", options->n_head, "Transformer heads")->capture_default_str();
  sub->add_option("--d-model", options->d_model, "Transformer width")->capture_default_str();
  sub->add_option("--block-size", options->block_size, "Tokens per window")->capture_default_str();
  sub->add_option("--batch", options->batch, "Samples (MLP) or windows (transformer) per replica per step")
      ->capture_default_str();
  sub->add_option("--micro-batches", options->micro_batches, "Micro-batches of a pipeline layout")
      ->capture_default_str();
  sub->add_option("--optimizer", options->optimizer, "As lather-train's --optimizer")->capture_default_str();
  sub->add_option("--network", options->network, "A preset instead of measuring: slingshot, infiniband");
  sub->add_option("--alpha-us", options->alpha_us, "Seconds per message, in microseconds (with --beta-ns-per-byte)");
  sub->add_option("--beta-ns-per-byte", options->beta_ns_per_byte, "Seconds per byte, in nanoseconds");
  sub->add_option("--costs", options->costs_file, "Per-rank costs measured elsewhere (--write-costs' JSON)");
  sub->add_option("--write-costs", options->write_costs, "Write the measured per-rank costs to this file");
  sub->add_option("--check", options->check, "Run every layout of the launched ranks and compare")
      ->capture_default_str();
  sub->add_option("--steps", options->steps, "Steps per measurement, warm-up included")->capture_default_str();
  sub->add_option("--warmup-steps", options->warmup_steps, "Steps not measured")->capture_default_str();
  add_list_option(*sub, "--table-ranks", options->table_ranks, "Rank counts of the table");
  sub->callback([options] { run_plan(*options); });
}

}  // namespace lather::bench
