#pragma once
// A GPT-style causal decoder over characters, split as GPT-J and Megatron-LM split it over the S
// weight shards of a replica (a Mesh with S shards); replicas split the batch.
//
//   tokens -> token embedding (vocabulary-parallel) + learned positions (model-dimension slices)
//          -> n_layer x [ x += attention(LN(x));  x += MLP(LN(x)) ] -> LN -> head -> cross-entropy
//
// Per shard d of S, with D = d_model, H = n_head, V = vocabulary:
// - token embedding [V, D]: rows shard_range(V, S, d); positions [block_size, D]: columns
//   shard_range(D, S, d). The partial embeddings (zero outside the shard's tokens and columns) are
//   summed over the shards: one all-reduce of [tokens, D].
// - attention: heads [d H/S, (d+1) H/S); query, key and value projections column-parallel (no
//   communication), the output projection row-parallel (one all-reduce of [tokens, D]).
// - MLP: D -> 4D column-parallel, GELU (tanh form), 4D -> D row-parallel (one all-reduce).
// - head: vocabulary-parallel projection D -> V_d and the vocabulary-parallel cross-entropy, which
//   reduces row maxima and sums but never the logits.
// LayerNorms and the row-parallel biases are replicated. Backward mirrors it: one all-reduce of
// [tokens, D] per column-parallel group (query/key/value together), the head's and the MLP's.
// Parameters are initialised from a seed on the global tensors (GPT-2's scheme: N(0, 0.02), the
// residual projections N(0, 0.02 / sqrt(2 n_layer))), so every shard count starts from the same
// model.
//
// Pipeline stages (a Mesh with P > 1 stages) split the layers further: stage s holds the
// consecutive blocks split_layers() gives it, the embedding lives on stage 0 and the final
// LayerNorm, head and cross-entropy on stage P - 1, and each stage's parameter list holds only its
// own tensors (named as in the whole model, so checkpoints do not depend on the split).
// train_micro_batches() runs a schedule (pipeline_schedule.hpp): stage s receives the stream
// [micro-batch tokens, D] from stage s - 1, runs its blocks and sends it on; backward, the stream's
// gradient travels back the same way (comm::StageLink, shard d of a stage talking to shard d of
// its neighbours). The arithmetic of each micro-batch is that of one stage, so P stages give the
// numbers of one stage running the same micro-batches as gradient accumulation, bit for bit.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/mesh.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/core/parameters.hpp>
#include <lather/nn/pipeline_schedule.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lather::nn {

struct TransformerConfig {
  int vocab_size = 0;
  int n_layer = 4;
  int n_head = 4;
  int d_model = 128;
  int block_size = 64;  ///< the longest context (rows of the position table)
  /// PaLM's auxiliary loss weight on (log Z)^2 of the softmax; 0: off.
  double z_loss = 0;
  double layer_norm_epsilon = 1e-5;

  int head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  /// Throws lather::Error naming the first bad field (n_head must divide d_model; `shards` must
  /// divide n_head).
  void validate(int shards = 1) const;
  /// Parameters of the whole model (all shards together).
  std::int64_t parameter_count() const;
  /// Multiply-adds x 2 of one training step (forward + backward = 3 x forward) per token at
  /// context `time`: the GEMMs and the attention products, as in the PaLM paper's appendix B.
  double training_flops_per_token(int time) const;
};

/// The blocks [first, end) of one pipeline stage.
struct StageLayers {
  int first = 0, end = 0;
};
/// Consecutive, non-empty block ranges for `stages` stages that minimise the largest stage's cost
/// per token: a block's training flops at context block_size (training_flops_per_token's terms),
/// plus the head's 6 d_model vocab_size on the last stage (the embedding, a lookup, is free). Of
/// the splits with the same largest cost, the one with the smallest cost spread. Throws
/// lather::Error when stages < 1 or stages > n_layer.
std::vector<StageLayers> split_layers(const TransformerConfig& config, int stages);

/// What one pipeline stage did in train_micro_batches(): seconds from the call's start.
struct PipelineEvent {
  bool forward = true;
  int micro_batch = 0;
  double begin = 0, end = 0;
};
struct PipelineTimes {
  double seconds = 0;  ///< the whole schedule, through the last send's completion
  double busy = 0;     ///< in forward and backward passes (each fenced)
  std::vector<PipelineEvent> events;
  double idle() const { return seconds - busy; }
};

/// Sums over a batch, counted once per replica (the same on every shard).
struct LanguageModelSums {
  double loss = 0;    ///< summed cross-entropy, nats
  double z_loss = 0;  ///< summed z-loss term
  long correct = 0;   ///< tokens whose arg-max prediction is the target
  long tokens = 0;
};

/// Bytes of the Views a model holds, by kind (what sharding divides). `activations` counts
/// everything the passes allocate; `kept_activations`, its part that a forward keeps for its
/// backward (one set per micro-batch a pipeline schedule keeps in flight), without the backward's
/// scratch.
struct ModelMemory {
  std::int64_t parameters = 0, gradients = 0, activations = 0, communication = 0, kept_activations = 0;
};

template <class ExecutionSpace, class Scalar = float>
class Transformer {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using Tokens = Kokkos::View<std::int32_t*, memory_space>;
  using Parameters = ParameterList<Scalar, memory_space>;

  /// One micro-batch of train_micro_batches(): `batch` windows of `time` tokens (inputs read on
  /// the first stage, targets on the last).
  struct MicroBatch {
    int batch = 0, time = 0;
    Tokens inputs, targets;
  };

  /// Collective over mesh.shards() (and the mesh's world, with pipeline stages).
  Transformer(const ExecutionSpace& space, const TransformerConfig& config, std::uint64_t seed,
              const comm::Mesh& mesh = comm::Mesh());
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const TransformerConfig& config() const { return m_config; }
  const Parameters& parameters() const { return m_parameters; }
  const std::vector<ParameterSpec>& parameter_specs() const { return m_parameters.specs(); }
  /// Moves the gradients into `storage` (ParameterList::place_gradients): memory the gradient
  /// reducer sums where it lies (comm::GradientReducer::shared_gradient_storage).
  void place_gradients(const ExecutionSpace& space, const typename Parameters::tensor& storage) {
    m_parameters.place_gradients(space, storage);
  }
  /// The same tensors (names and shapes, in order), held elsewhere, become the ones the passes
  /// read and write, releasing the model's own: for sharded parameters, whose values live in
  /// gather buffers (comm::ParameterShards::gathered, with a ParametersNeeded hook on every pass).
  /// Throws lather::Error naming the first parameter that differs.
  void adopt_parameters(const Parameters& parameters);
  /// The ranges [first, last) of the parameter list that one layer's passes read together, in
  /// forward order: the embedding, each block, the final LayerNorm with the head (this stage's).
  std::vector<std::pair<std::size_t, std::size_t>> parameter_layers() const;

  /// Forward and backward on `batch` windows of `time` tokens: inputs and targets hold
  /// batch x time token ids, row b * time + t. The gradient of the summed loss (cross-entropy plus
  /// z-loss) is written to the parameters' gradients, or added when `accumulate`. Collective over
  /// the shards, which pass the same tokens. `ready`, when given, hears of each layer's gradients as
  /// the backward writes them (an overlapped reduction). `needed`, when given (no pipeline stages),
  /// is asked for each layer's parameters before its forward and before its backward.
  LanguageModelSums train_batch(const ExecutionSpace& space, int batch, int time, const Tokens& inputs,
                                const Tokens& targets, bool accumulate, const GradientsReady& ready = {},
                                const ParametersNeeded& needed = {});
  /// Forward and backward of `micro_batches` in the order of `schedule` on this pipeline stage; the
  /// gradients of the summed loss over all of them are written (added when `accumulate`), adding
  /// the micro-batches in order. Collective over the mesh: every rank passes the same batch and
  /// time per micro-batch. The sums are the last stage's (zero on the others). Any failure on any
  /// rank (including the test fault point "transformer.pipeline") becomes, after the schedule, a
  /// lather::Error on every rank of the mesh. `times`, when given, receives this rank's timeline
  /// (at the cost of a fence after every pass). `ready`, when given, hears of each layer's
  /// gradients during the last micro-batch's backward, which writes them for the last time.
  /// Without stages it runs the micro-batches one after the other; `needed` as in train_batch().
  LanguageModelSums train_micro_batches(const ExecutionSpace& space, PipelineSchedule schedule,
                                        const std::vector<MicroBatch>& micro_batches, bool accumulate,
                                        PipelineTimes* times = nullptr, const GradientsReady& ready = {},
                                        const ParametersNeeded& needed = {});
  /// Forward only. With pipeline stages the batch flows through every stage and the sums are the
  /// last stage's (zero on the others). `needed` as in train_batch().
  LanguageModelSums evaluate(const ExecutionSpace& space, int batch, int time, const Tokens& inputs,
                             const Tokens& targets, const ParametersNeeded& needed = {});
  /// The logits of the token after the last of `context` (time = its length <= block_size), over
  /// the whole vocabulary on every shard (gathered: one small all-gather). For sampling.
  std::vector<double> next_token_logits(const ExecutionSpace& space, const std::vector<std::int32_t>& context);

  /// Bytes held now; activations grow with the largest batch x time seen.
  ModelMemory memory() const;

  /// This rank's pipeline stage and its blocks.
  int stage() const;
  int stages() const;
  StageLayers layers() const;

  // Implementation steps. Public only because nvcc rejects an extended __host__ __device__ lambda
  // whose enclosing member function is private; not for users.
  struct State;
  void reserve(const ExecutionSpace& space, int slot, int rows);
  void forward(const ExecutionSpace& space, int slot, int batch, int time, const Tokens& inputs);
  LanguageModelSums loss(const ExecutionSpace& space, int slot, int rows, const Tokens& targets, bool backward);
  void backward(const ExecutionSpace& space, int slot, int batch, int time, const Tokens& inputs, bool accumulate);
  void embed(const ExecutionSpace& space, int slot, int batch, int time, const Tokens& inputs);
  /// Pipeline stages: one forward of slot 0 through every stage; the loss sums of `targets` on the
  /// last stage when given. Failures agreed over the mesh.
  LanguageModelSums forward_through_stages(const ExecutionSpace& space, int batch, int time, const Tokens& inputs,
                                           const Tokens* targets);
  void embed_backward(const ExecutionSpace& space, int batch, int time, const Tokens& inputs, bool accumulate);

 private:
  TransformerConfig m_config;
  Parameters m_parameters;
  std::unique_ptr<State> m_state;
};

}  // namespace lather::nn
