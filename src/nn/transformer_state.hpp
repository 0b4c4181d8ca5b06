#pragma once
// What a Transformer holds besides its parameters: the tensor-parallel layers, the activations
// kept for backward and the gradient scratch. Shared by transformer.cpp (construction, sampling,
// memory) and transformer_passes.cpp (forward and backward).

#include <lather/comm/stage_link.hpp>
#include <lather/comm/transport.hpp>
#include <lather/nn/causal_attention.hpp>
#include <lather/nn/parallel_linear.hpp>
#include <lather/nn/vocab_parallel_cross_entropy.hpp>
#include <lather/nn/transformer.hpp>

#include <deque>
#include <memory>
#include <vector>

namespace lather::nn {

template <class ExecutionSpace, class Scalar>
struct Transformer<ExecutionSpace, Scalar>::State {
  using Matrix = typename Transformer::Matrix;
  using Column = nn::ColumnParallelLinear<ExecutionSpace, Scalar>;
  using Row = nn::RowParallelLinear<ExecutionSpace, Scalar>;
  using Vector = Kokkos::View<Scalar*, memory_space>;

  /// Positions in the parameter list of one block's tensors.
  struct BlockParameters {
    int ln1_scale, ln1_offset, query_kernel, query_bias, key_kernel, key_bias, value_kernel, value_bias, output_kernel,
        output_bias, ln2_scale, ln2_offset, mlp_in_kernel, mlp_in_bias, mlp_out_kernel, mlp_out_bias;
  };
  struct Block {
    BlockParameters p;
    std::unique_ptr<Column> query, key, value, mlp_in;
    std::unique_ptr<Row> output, mlp_out;
  };
  /// One block's activations of one forward, [capacity, width]: the block's input x, LN1(x) = a,
  /// the heads' q, k, v and attention output y, x1 = x + attention, LN2(x1) = b, the MLP's
  /// pre-activation h and GELU(h) = g; LayerNorm row statistics; the attention, which keeps its
  /// probabilities.
  struct BlockActivations {
    Matrix x, a, q, k, v, y, x1, b, h, g;
    Vector mean1, rstd1, mean2, rstd2;
    std::unique_ptr<CausalAttention<ExecutionSpace, Scalar>> attention;
  };
  /// What one forward keeps for its backward: one slot per micro-batch a pipeline schedule keeps
  /// in flight (one without a pipeline). x_final is the stream after this stage's last block: the
  /// stage's output, or, on the last stage, the final LayerNorm's input.
  struct Activations {
    int capacity = 0;  ///< rows (batch x time) the buffers hold
    std::vector<BlockActivations> blocks;
    Matrix x_final, f, logits, dlogits;
    Vector mean_f, rstd_f, row_loss;
    // Pipeline transfers in flight from this slot: its output forward, its input's gradient (a copy
    // of the scratch dx, which the next backward overwrites) back.
    Matrix input_gradient;
    typename comm::StageLink<ExecutionSpace, Scalar>::Outgoing forward_send, backward_send;
  };

  comm::Group shards;
  int shard_count = 1, shard = 0;
  comm::ShardRange vocab_range, model_range;  ///< token rows, position columns of this shard
  int heads = 0;                              ///< heads on this shard
  int head_width = 0;                         ///< heads x head_dim
  int mlp_width = 0;                          ///< this shard's columns of the 4D hidden layer
  // Parameter positions of the embedding (first stage) and of the final LayerNorm and head (last
  // stage); -1 where this stage has none.
  int token_table = -1, position_table = -1, final_scale = -1, final_offset = -1, head_kernel = -1, head_bias = -1;
  /// Where backward() reports the gradients it writes for the last time (train_micro_batches).
  const GradientsReady* gradients_ready = nullptr;
  /// What the passes ask for each layer's parameters before reading them (sharded parameters).
  const ParametersNeeded* parameters_needed = nullptr;

  // Pipeline stages: this rank's stage of `stages`, holding layers [first_layer, end_layer).
  int stage = 0, stages = 1, first_layer = 0, end_layer = 0;
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  comm::Group world;     ///< the mesh's, where a pipeline's ranks agree on a failure
  comm::Group pipeline;  ///< this rank's (replica, shard) over the stages
  comm::StageLink<ExecutionSpace, Scalar> link;

  std::vector<Block> blocks;  ///< this stage's layers
  std::unique_ptr<Column> head;
  std::unique_ptr<nn::VocabParallelCrossEntropy<ExecutionSpace, Scalar>> criterion;
  /// The all-reduces the model makes itself: the embedding sum and the attention input's gradient.
  comm::Transport<ExecutionSpace, Scalar> transport;

  // A deque: growing it never moves a slot, whose sends in flight hold pointers into it.
  std::deque<Activations> slots;  ///< at least one
  // Gradient scratch, shared by the slots' backwards: the residual stream's, a second [rows, D],
  // the heads', the MLP's; the positions' columns (forward and backward).
  int scratch_capacity = 0;
  Matrix dx, dtmp, dq, dk, dv, dy, dg, positions;

  /// A [rows, width] View over the first rows of `buffer` (contiguous, so GEMMs take it as is).
  static Matrix rows_of(const Matrix& buffer, int rows) { return Matrix(buffer.data(), rows, buffer.extent(1)); }
  static Vector rows_of(const Vector& buffer, int rows) { return Vector(buffer.data(), rows); }

  /// The first rows of a block's activations, as the passes use them.
  struct BlockRows {
    Matrix x, a, q, k, v, y, x1, b, h, g;
  };
  static BlockRows rows_of(const BlockActivations& block, int rows) {
    return {rows_of(block.x, rows), rows_of(block.a, rows), rows_of(block.q, rows),  rows_of(block.k, rows),
            rows_of(block.v, rows), rows_of(block.y, rows), rows_of(block.x1, rows), rows_of(block.b, rows),
            rows_of(block.h, rows), rows_of(block.g, rows)};
  }

  /// The parameter list's tensors by position: values, gradients, and kernels as matrices.
  struct ParameterViews {
    const Parameters& list;
    Kokkos::View<const Scalar*, memory_space> value(int i) const { return list.value(std::size_t(i)); }
    Vector gradient(int i) const { return list.gradient(std::size_t(i)); }
    using ConstMatrix = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
    ConstMatrix kernel(int i) const {
      const auto& shape = list.spec(std::size_t(i)).shape;
      return ConstMatrix(list.value(std::size_t(i)).data(), shape[0], shape[1]);
    }
    Matrix kernel_gradient(int i) const {
      const auto& shape = list.spec(std::size_t(i)).shape;
      return Matrix(list.gradient(std::size_t(i)).data(), shape[0], shape[1]);
    }
  };
};

/// Sets the hook the passes ask for each layer's parameters, for the lifetime of this object (one
/// call of train_micro_batches() or evaluate()); an empty hook leaves none.
template <class State>
class NeededDuring {
 public:
  NeededDuring(State& st, const ParametersNeeded& needed, const char* call) : m_st(st) {
    if (!needed) return;
    LATHER_REQUIRE(st.stages == 1, "Transformer::", call, ": a ParametersNeeded hook (sharded parameters, an ",
                   "overlapped exchange) needs a model without pipeline stages");
    m_st.parameters_needed = &needed;
  }
  ~NeededDuring() { m_st.parameters_needed = nullptr; }
  NeededDuring(const NeededDuring&) = delete;
  NeededDuring& operator=(const NeededDuring&) = delete;

 private:
  State& m_st;
};

}  // namespace lather::nn
