// The transformer's construction (parameter layout over the shards, GPT-2 initialisation),
// memory report and sampling; forward and backward are in transformer_passes.cpp.
#include "transformer_state.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/tensor.hpp>

#include <cmath>
#include <random>

namespace lather::nn {

void TransformerConfig::validate(int shards) const {
  LATHER_REQUIRE(vocab_size >= 1, "TransformerConfig::vocab_size must be >= 1, got ", vocab_size);
  LATHER_REQUIRE(n_layer >= 1, "TransformerConfig::n_layer must be >= 1, got ", n_layer);
  LATHER_REQUIRE(n_head >= 1, "TransformerConfig::n_head must be >= 1, got ", n_head);
  LATHER_REQUIRE(d_model >= 1 && d_model % n_head == 0, "TransformerConfig::d_model ", d_model,
                 " must be a positive multiple of n_head ", n_head);
  LATHER_REQUIRE(block_size >= 1, "TransformerConfig::block_size must be >= 1, got ", block_size);
  LATHER_REQUIRE(shards >= 1 && n_head % shards == 0, "the ", shards, " weight shards must divide n_head ", n_head,
                 " (each shard holds whole attention heads)");
  LATHER_REQUIRE(z_loss >= 0 && std::isfinite(z_loss), "TransformerConfig::z_loss must be >= 0, got ", z_loss);
  LATHER_REQUIRE(layer_norm_epsilon > 0, "TransformerConfig::layer_norm_epsilon must be > 0, got ", layer_norm_epsilon);
}

std::int64_t TransformerConfig::parameter_count() const {
  const std::int64_t d = d_model, v = vocab_size;
  const std::int64_t per_block = 4 * d              // two LayerNorms
                                 + 4 * (d * d + d)  // query, key, value, output
                                 + (d * 4 * d + 4 * d) + (4 * d * d + d);
  return v * d + std::int64_t(block_size) * d + n_layer * per_block + 2 * d + d * v + v;
}

double TransformerConfig::training_flops_per_token(int time) const {
  // 6 flops per multiply-add weight per token (2 forward, 4 backward), plus the attention
  // products (q k^T and p v: 2 x 2 x time x d_model per token forward, 3x for training).
  const double d = d_model;
  const double matrix_weights = double(n_layer) * 12.0 * d * d + d * double(vocab_size);
  return 6.0 * matrix_weights + 12.0 * double(n_layer) * d * double(time);
}

std::vector<StageLayers> split_layers(const TransformerConfig& config, int stages) {
  LATHER_REQUIRE(stages >= 1 && stages <= config.n_layer, "the ", stages,
                 " pipeline stages need 1 to n_layer = ", config.n_layer, " stages (each holds at least one block)");
  const int L = config.n_layer;
  const double d = config.d_model;
  const double block = 6.0 * 12.0 * d * d + 12.0 * d * double(config.block_size);
  const double head = 6.0 * d * double(config.vocab_size);
  // cost(s, first, end): the stage's blocks, the head on the last stage. best[s][e]: the least
  // (largest stage cost, sum of squared stage costs) of stages 0..s-1 holding blocks [0, e).
  const auto cost = [&](int s, int first, int end) {
    return double(end - first) * block + (s == stages - 1 ? head : 0);
  };
  struct Best {
    double largest = 0, squares = 0;
    int previous_end = -1;
    bool set = false;
  };
  std::vector<std::vector<Best>> best(std::size_t(stages + 1), std::vector<Best>(std::size_t(L + 1)));
  best[0][0].set = true;
  for (int s = 1; s <= stages; ++s)
    for (int e = s; e <= L; ++e)
      for (int f = s - 1; f < e; ++f) {
        const auto& before = best[std::size_t(s - 1)][std::size_t(f)];
        if (!before.set) continue;
        const double c = cost(s - 1, f, e);
        const Best candidate{std::max(before.largest, c), before.squares + c * c, f, true};
        auto& here = best[std::size_t(s)][std::size_t(e)];
        if (!here.set || candidate.largest < here.largest ||
            (candidate.largest == here.largest && candidate.squares < here.squares))
          here = candidate;
      }
  std::vector<StageLayers> layers(static_cast<std::size_t>(stages));
  for (int s = stages, e = L; s > 0; --s) {
    const int f = best[std::size_t(s)][std::size_t(e)].previous_end;
    layers[std::size_t(s - 1)] = {f, e};
    e = f;
  }
  return layers;
}

namespace {

/// Draws of N(0, 1) from a 64-bit Mersenne twister by Box-Muller: the same numbers with every
/// standard library (std::normal_distribution's algorithm is not specified).
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : m_bits(seed) {}
  double operator()() {
    if (m_has_spare) {
      m_has_spare = false;
      return m_spare;
    }
    const double pi = 3.14159265358979323846;
    const double u1 = (double((m_bits() >> 11) + 1)) * 0x1.0p-53;  // (0, 1]
    const double u2 = double(m_bits() >> 11) * 0x1.0p-53;          // [0, 1)
    const double radius = std::sqrt(-2.0 * std::log(u1));
    m_spare = radius * std::sin(2 * pi * u2);
    m_has_spare = true;
    return radius * std::cos(2 * pi * u2);
  }

 private:
  std::mt19937_64 m_bits;
  double m_spare = 0;
  bool m_has_spare = false;
};

}  // namespace

template <class ExecutionSpace, class Scalar>
Transformer<ExecutionSpace, Scalar>::Transformer(const ExecutionSpace& space, const TransformerConfig& config,
                                                 std::uint64_t seed, const comm::Mesh& mesh)
    : m_config(config), m_state(std::make_unique<State>()) {
  auto& st = *m_state;
  st.shards = mesh.shards();
  st.shard_count = st.shards.size();
  st.shard = st.shards.rank();
  config.validate(st.shard_count);
  st.world = mesh.world();
  st.pipeline = mesh.pipeline();
  st.stage = mesh.stage();
  st.stages = mesh.pipeline_stages();
  const StageLayers own = split_layers(config, st.stages)[std::size_t(st.stage)];
  st.first_layer = own.first;
  st.end_layer = own.end;
  if (st.stages > 1) st.link = comm::StageLink<ExecutionSpace, Scalar>(mesh);
  const int D = config.d_model, V = config.vocab_size, L = config.n_layer;
  st.vocab_range = comm::shard_range(V, st.shard_count, st.shard);
  st.model_range = comm::shard_range(D, st.shard_count, st.shard);
  st.heads = config.n_head / st.shard_count;
  st.head_width = st.heads * config.head_dim();
  st.mlp_width = comm::shard_range(4 * D, st.shard_count, st.shard).count;

  // The parameter list of the whole model: name, this shard's shape, how it sits in the global
  // tensor, and whether this stage holds it; `specs` keeps this stage's, in the same order.
  std::vector<ParameterSpec> all, specs;
  std::vector<int> local_index;  // position in `specs`, -1 on another stage
  const auto add = [&](const std::string& name, TensorShape global, int split_axis, comm::ShardRange range, bool mine) {
    ParameterSpec spec;
    spec.name = name;
    spec.shape = global;
    if (split_axis >= 0) {
      spec.shape[std::size_t(split_axis)] = range.count;
      spec.split_axis = split_axis;
      spec.split_offset = range.begin;
      spec.global_shape = global;
    }
    all.push_back(spec);
    local_index.push_back(mine ? int(specs.size()) : -1);
    if (mine) specs.push_back(spec);
    return local_index.back();
  };
  const comm::ShardRange whole{};
  const auto heads_range = st.model_range;  // whole heads: n_head % shards == 0
  const auto mlp_range = comm::shard_range(4 * D, st.shard_count, st.shard);
  const bool first = st.first_stage(), last = st.last_stage();
  st.token_table = add("embedding/tokens", {V, D}, 0, st.vocab_range, first);
  st.position_table = add("embedding/positions", {config.block_size, D}, 1, st.model_range, first);
  st.blocks.resize(std::size_t(st.end_layer - st.first_layer));
  for (int l = 0; l < L; ++l) {
    const std::string prefix = "block" + std::to_string(l) + "/";
    const bool mine = l >= st.first_layer && l < st.end_layer;
    typename State::BlockParameters unused{};
    auto& p = mine ? st.blocks[std::size_t(l - st.first_layer)].p : unused;
    p.ln1_scale = add(prefix + "ln1/scale", {D}, -1, whole, mine);
    p.ln1_offset = add(prefix + "ln1/offset", {D}, -1, whole, mine);
    p.query_kernel = add(prefix + "attention/query/kernel", {D, D}, 1, heads_range, mine);
    p.query_bias = add(prefix + "attention/query/bias", {D}, 0, heads_range, mine);
    p.key_kernel = add(prefix + "attention/key/kernel", {D, D}, 1, heads_range, mine);
    p.key_bias = add(prefix + "attention/key/bias", {D}, 0, heads_range, mine);
    p.value_kernel = add(prefix + "attention/value/kernel", {D, D}, 1, heads_range, mine);
    p.value_bias = add(prefix + "attention/value/bias", {D}, 0, heads_range, mine);
    p.output_kernel = add(prefix + "attention/output/kernel", {D, D}, 0, heads_range, mine);
    p.output_bias = add(prefix + "attention/output/bias", {D}, -1, whole, mine);
    p.ln2_scale = add(prefix + "ln2/scale", {D}, -1, whole, mine);
    p.ln2_offset = add(prefix + "ln2/offset", {D}, -1, whole, mine);
    p.mlp_in_kernel = add(prefix + "mlp/in/kernel", {D, 4 * D}, 1, mlp_range, mine);
    p.mlp_in_bias = add(prefix + "mlp/in/bias", {4 * D}, 0, mlp_range, mine);
    p.mlp_out_kernel = add(prefix + "mlp/out/kernel", {4 * D, D}, 0, mlp_range, mine);
    p.mlp_out_bias = add(prefix + "mlp/out/bias", {D}, -1, whole, mine);
  }
  st.final_scale = add("final_ln/scale", {D}, -1, whole, last);
  st.final_offset = add("final_ln/offset", {D}, -1, whole, last);
  st.head_kernel = add("head/kernel", {D, V}, 1, st.vocab_range, last);
  st.head_bias = add("head/bias", {V}, 0, st.vocab_range, last);
  // The parameters' allocation and initial values may fail on one rank only (memory): the ranks
  // agree on it before the layers' constructors agree, and before any pass, so such a failure is
  // an error on every shard (on every rank of the mesh with pipeline stages, whose neighbours
  // would otherwise wait for its activations).
  const comm::Group& agreeing = st.stages > 1 ? st.world : st.shards;
  agreeing.run_agreed("Transformer: parameters", [&] {
    ::lather::Impl::fault_point("transformer.construct");
    m_parameters = Parameters(space, specs);

    // GPT-2's initialisation, drawn on the global tensors of the whole model in list order so that
    // every shard and stage count starts from the same model: weights N(0, 0.02), the projections
    // into the residual stream (attention output, MLP out) N(0, 0.02 / sqrt(2 n_layer)), biases 0,
    // LayerNorm scales 1. Another stage's tensors are drawn too, and dropped.
    Normal normal(seed);
    const double residual_scale = 1.0 / std::sqrt(2.0 * double(L));
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto& spec = all[i];
      const auto& global = spec.global();
      const std::string& name = spec.name;
      const auto ends_with = [&](const std::string& tail) {
        return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
      };
      const std::int64_t rows = global[0], columns = global.size() > 1 ? global[1] : 1;
      std::vector<double> whole_tensor(std::size_t(rows * columns), 0.0);
      if (ends_with("/scale")) {
        std::fill(whole_tensor.begin(), whole_tensor.end(), 1.0);
      } else if (global.size() == 2) {
        const double deviation =
            0.02 * (ends_with("attention/output/kernel") || ends_with("mlp/out/kernel") ? residual_scale : 1.0);
        for (auto& w : whole_tensor) w = deviation * normal();
      }
      if (local_index[i] < 0) continue;
      // This shard's slice.
      const std::int64_t row0 = spec.split_axis == 0 ? spec.split_offset : 0;
      const std::int64_t col0 = spec.split_axis == 1 ? spec.split_offset : 0;
      const std::int64_t local_rows = spec.shape[0], local_columns = spec.shape.size() > 1 ? spec.shape[1] : 1;
      std::vector<Scalar> mine(std::size_t(local_rows * local_columns));
      for (std::int64_t r = 0; r < local_rows; ++r)
        for (std::int64_t c = 0; c < local_columns; ++c)
          mine[std::size_t(r * local_columns + c)] = Scalar(whole_tensor[std::size_t((row0 + r) * columns + col0 + c)]);
      m_parameters.set_value(space, std::size_t(local_index[i]), mine);
    }
  });

  // Every shard of a replica runs the same batch through the same layers: the shapes agree by
  // construction, so the layers skip their per-call agreement (the constructors still agree).
  comm::TensorParallelOptions trusted;
  trusted.verify_shapes = false;
  for (auto& block : st.blocks) {
    block.query = std::make_unique<typename State::Column>(st.shards, D, D, trusted);
    block.key = std::make_unique<typename State::Column>(st.shards, D, D, trusted);
    block.value = std::make_unique<typename State::Column>(st.shards, D, D, trusted);
    block.output = std::make_unique<typename State::Row>(st.shards, D, D, trusted);
    block.mlp_in = std::make_unique<typename State::Column>(st.shards, D, 4 * D, trusted);
    block.mlp_out = std::make_unique<typename State::Row>(st.shards, 4 * D, D, trusted);
  }
  if (last) {
    st.head = std::make_unique<typename State::Column>(st.shards, D, V, trusted);
    st.criterion = std::make_unique<nn::VocabParallelCrossEntropy<ExecutionSpace, Scalar>>(st.shards, V, trusted);
  }
  st.transport =
      comm::Transport<ExecutionSpace, Scalar>(st.shards, std::size_t(1) << 22, "Lather::Transformer::transport");
}

template <class ExecutionSpace, class Scalar>
Transformer<ExecutionSpace, Scalar>::~Transformer() = default;

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::train_batch(const ExecutionSpace& space, int batch, int time,
                                                                   const Tokens& inputs, const Tokens& targets,
                                                                   bool accumulate, const GradientsReady& ready,
                                                                   const ParametersNeeded& needed) {
  return train_micro_batches(space, PipelineSchedule::gpipe, {MicroBatch{batch, time, inputs, targets}}, accumulate,
                             nullptr, ready, needed);
}

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::evaluate(const ExecutionSpace& space, int batch, int time,
                                                                const Tokens& inputs, const Tokens& targets,
                                                                const ParametersNeeded& needed) {
  const NeededDuring<State> asking(*m_state, needed, "evaluate");
  if (m_state->stages > 1) return forward_through_stages(space, batch, time, inputs, &targets);
  reserve(space, 0, batch * time);
  forward(space, 0, batch, time, inputs);
  return loss(space, 0, batch * time, targets, false);
}

template <class ExecutionSpace, class Scalar>
void Transformer<ExecutionSpace, Scalar>::adopt_parameters(const Parameters& parameters) {
  LATHER_REQUIRE(parameters.size() == m_parameters.size(), "Transformer::adopt_parameters: ", parameters.size(),
                 " parameters for a model of ", m_parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto& mine = m_parameters.spec(i);
    const auto& theirs = parameters.spec(i);
    LATHER_REQUIRE(mine.name == theirs.name && mine.shape == theirs.shape, "Transformer::adopt_parameters: parameter ",
                   i, " is '", theirs.name, "' of shape ", ::lather::to_string(theirs.shape), "; the model's is '",
                   mine.name, "' of shape ", ::lather::to_string(mine.shape));
  }
  m_parameters = parameters;
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::size_t, std::size_t>> Transformer<ExecutionSpace, Scalar>::parameter_layers() const {
  const auto& st = *m_state;
  std::vector<std::pair<std::size_t, std::size_t>> layers;
  if (st.first_stage()) layers.emplace_back(std::size_t(st.token_table), std::size_t(st.position_table + 1));
  for (const auto& b : st.blocks) layers.emplace_back(std::size_t(b.p.ln1_scale), std::size_t(b.p.mlp_out_bias + 1));
  if (st.last_stage()) layers.emplace_back(std::size_t(st.final_scale), std::size_t(st.head_bias + 1));
  return layers;
}

template <class ExecutionSpace, class Scalar>
int Transformer<ExecutionSpace, Scalar>::stage() const {
  return m_state->stage;
}
template <class ExecutionSpace, class Scalar>
int Transformer<ExecutionSpace, Scalar>::stages() const {
  return m_state->stages;
}
template <class ExecutionSpace, class Scalar>
StageLayers Transformer<ExecutionSpace, Scalar>::layers() const {
  return {m_state->first_layer, m_state->end_layer};
}

template <class ExecutionSpace, class Scalar>
std::vector<double> Transformer<ExecutionSpace, Scalar>::next_token_logits(const ExecutionSpace& space,
                                                                           const std::vector<std::int32_t>& context) {
  LATHER_REQUIRE(!context.empty(), "Transformer::next_token_logits: the context is empty");
  auto& st = *m_state;
  // The model sees at most block_size tokens: the latest ones.
  const std::size_t first =
      context.size() > std::size_t(m_config.block_size) ? context.size() - m_config.block_size : 0;
  const int time = int(context.size() - first);
  Tokens tokens(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Transformer::context"), time);
  const Kokkos::View<const std::int32_t*, Kokkos::HostSpace> host(context.data() + first, std::size_t(time));
  Kokkos::deep_copy(space, tokens, host);
  std::vector<double> all(std::size_t(m_config.vocab_size));
  if (st.stages > 1) {
    forward_through_stages(space, 1, time, tokens, nullptr);
  } else {
    reserve(space, 0, time);
    forward(space, 0, 1, time, tokens);
  }
  if (st.last_stage()) {
    const int local = st.vocab_range.count;
    Kokkos::View<Scalar*, Kokkos::HostSpace> last("Lather::Transformer::last_logits", std::size_t(local));
    if (local > 0)
      Kokkos::deep_copy(space, last, Kokkos::subview(st.slots[0].logits, time - 1, std::make_pair(0, local)));
    ::lather::Impl::fence(space, "Lather::Transformer::next_token_logits: logits on the host");
    std::vector<double> mine(last.data(), last.data() + local);
    std::vector<std::size_t> counts;
    for (int d = 0; d < st.shard_count; ++d)
      counts.push_back(std::size_t(comm::shard_range(m_config.vocab_size, st.shard_count, d).count));
    st.shards.allgatherv(mine.data(), all.data(), counts);
  }
  // The last stage holds the logits; every stage of the pipeline gets them.
  if (st.stages > 1) st.pipeline.broadcast(all.data(), all.size(), st.stages - 1);
  return all;
}

template <class ExecutionSpace, class Scalar>
ModelMemory Transformer<ExecutionSpace, Scalar>::memory() const {
  const auto& st = *m_state;
  ModelMemory m;
  m.parameters = std::int64_t(m_parameters.value_buffer().span() * sizeof(Scalar));
  m.gradients = std::int64_t(m_parameters.gradient_buffer().span() * sizeof(Scalar));
  std::int64_t kept = 0, scratch = 0, communication = 0;
  const auto bytes = [](const auto& view) { return std::int64_t(view.span() * sizeof(Scalar)); };
  for (const auto& slot : st.slots) {
    for (const auto& b : slot.blocks) {
      for (const auto* view : {&b.x, &b.a, &b.q, &b.k, &b.v, &b.y, &b.x1, &b.b, &b.h, &b.g}) kept += bytes(*view);
      for (const auto* view : {&b.mean1, &b.rstd1, &b.mean2, &b.rstd2}) kept += bytes(*view);
      kept += std::int64_t(b.attention->scratch_bytes());
    }
    for (const auto* view : {&slot.x_final, &slot.f, &slot.logits, &slot.dlogits}) kept += bytes(*view);
    for (const auto* view : {&slot.mean_f, &slot.rstd_f, &slot.row_loss}) kept += bytes(*view);
    communication += bytes(slot.input_gradient);
  }
  for (const auto* view : {&st.positions, &st.dx, &st.dtmp, &st.dq, &st.dk, &st.dv, &st.dy, &st.dg})
    scratch += bytes(*view);
  m.kept_activations = kept;
  m.activations = kept + scratch;
  // Host staging of the model's own all-reduces where MPI cannot read the device's memory; the
  // copies of the input gradients that travel to the previous stage.
  m.communication = communication + (comm::mpi_reads_in_place<typename ExecutionSpace::memory_space>()
                                         ? 0
                                         : std::int64_t(std::size_t(1) << 22) * std::int64_t(sizeof(Scalar)));
  return m;
}

template class Transformer<DefaultExecutionSpace, float>;
template class Transformer<DefaultExecutionSpace, double>;

}  // namespace lather::nn
