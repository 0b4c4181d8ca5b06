// The transformer's forward and backward passes over the shards of a replica (the layout is in
// include/lather/nn/transformer.hpp).
#include "transformer_state.hpp"

#include <algorithm>

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/gemm.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/nn/embedding.hpp>
#include <lather/nn/gelu.hpp>
#include <lather/nn/layer_norm.hpp>

namespace lather::nn {

namespace {

template <class State, class ExecutionSpace>
auto make_matrix(const ExecutionSpace& space, const char* label, int rows, int width) {
  return typename State::Matrix(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("Lather::Transformer::") + label), rows,
      width);
}
template <class State, class ExecutionSpace>
auto make_vector(const ExecutionSpace& space, const char* label, int rows) {
  return typename State::Vector(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("Lather::Transformer::") + label), rows);
}

/// One slot's activations for `rows` rows: this stage's blocks, and what the stage's ends keep.
template <class State, class ExecutionSpace>
void allocate_slot(State& st, typename State::Activations& slot, const ExecutionSpace& space, int rows, int D) {
  const auto matrix = [&](const char* label, int width) { return make_matrix<State>(space, label, rows, width); };
  const auto vector = [&](const char* label) { return make_vector<State>(space, label, rows); };
  for (auto& b : slot.blocks) {
    b.x = matrix("x", D), b.a = matrix("ln1", D), b.x1 = matrix("x1", D), b.b = matrix("ln2", D);
    b.q = matrix("q", st.head_width), b.k = matrix("k", st.head_width), b.v = matrix("v", st.head_width);
    b.y = matrix("attention", st.head_width);
    b.h = matrix("mlp_pre", st.mlp_width), b.g = matrix("mlp_gelu", st.mlp_width);
    b.mean1 = vector("mean1"), b.rstd1 = vector("rstd1"), b.mean2 = vector("mean2"), b.rstd2 = vector("rstd2");
  }
  slot.x_final = matrix("x_final", D);
  if (st.last_stage()) {
    slot.f = matrix("final_ln", D);
    slot.logits = matrix("logits", st.vocab_range.count), slot.dlogits = matrix("dlogits", st.vocab_range.count);
    slot.mean_f = vector("mean_f"), slot.rstd_f = vector("rstd_f"), slot.row_loss = vector("row_loss");
  }
  if (!st.first_stage()) slot.input_gradient = matrix("input_gradient", D);
}

template <class State, class ExecutionSpace>
void allocate_scratch(State& st, const ExecutionSpace& space, int rows, int D) {
  const auto matrix = [&](const char* label, int width) { return make_matrix<State>(space, label, rows, width); };
  st.dx = matrix("dx", D), st.dtmp = matrix("dtmp", D);
  st.dq = matrix("dq", st.head_width), st.dk = matrix("dk", st.head_width), st.dv = matrix("dv", st.head_width);
  st.dy = matrix("dattention", st.head_width), st.dg = matrix("dmlp", st.mlp_width);
  st.positions = matrix("positions", st.model_range.count);
}

/// Pipeline stages: MPI moves a large message only inside MPI calls on both sides, so a stage
/// computing for long between calls would hold back the activations and gradients it sent
/// before, while its neighbour waits for them. Between blocks it lets them progress.
template <class State>
void progress_sends(State& st) {
  if (st.stages == 1) return;
  for (auto& slot : st.slots) {
    if (slot.forward_send.status_request.active() || slot.forward_send.payload_request.active())
      (void)slot.forward_send.test();
    if (slot.backward_send.status_request.active() || slot.backward_send.payload_request.active())
      (void)slot.backward_send.test();
  }
}

/// Tensors [first, last) of the stage's list hold their final gradients (or, empty, a point
/// between layers), where train_micro_batches asked for it.
template <class State>
void report_ready(State& st, int first, int last) {
  if (st.gradients_ready) (*st.gradients_ready)(std::size_t(first), std::size_t(last));
}

/// Tensors [first, last) of the stage's list, one layer's, are about to be read (sharded
/// parameters: their values are gathered now, where train_batch or evaluate was given the hook).
template <class State>
void ask_needed(State& st, int first, int last) {
  if (st.parameters_needed) (*st.parameters_needed)(std::size_t(first), std::size_t(last));
}

}  // namespace

template <class ExecutionSpace, class Scalar>
void Transformer<ExecutionSpace, Scalar>::reserve(const ExecutionSpace& space, int slot, int rows) {
  // Grows the activations of `slot` (created on first use) and the scratch to `rows`. The layers
  // skip their per-call agreement (the shards run the same batch), so the one local failure a pass
  // can meet, an allocation, is agreed here: every shard grows its buffers at the same call, and
  // one agreement over the shards then makes a failure on one an error on all, before the first
  // all-reduce. Not on the hot path: only when the buffers grow.
  auto& st = *m_state;
  LATHER_REQUIRE(slot >= 0 && slot < 4096, "Transformer: activation slot ", slot, " out of range");
  const auto at = std::size_t(slot);
  const bool grow_slot = at >= st.slots.size() || st.slots[at].capacity < rows;
  const bool grow_scratch = st.scratch_capacity < rows;
  if (!grow_slot && !grow_scratch) return;
  st.shards.run_agreed(::lather::Impl::concat("Transformer: activations for ", rows, " rows"), [&] {
    ::lather::Impl::fault_point("transformer.allocate");
    while (st.slots.size() <= at) {
      typename State::Activations fresh;
      fresh.blocks.resize(st.blocks.size());
      for (auto& b : fresh.blocks)
        b.attention = std::make_unique<CausalAttention<ExecutionSpace, Scalar>>(st.heads, m_config.head_dim());
      st.slots.push_back(std::move(fresh));
    }
    auto& activations = st.slots[at];
    if (activations.capacity < rows) {
      // A transfer may still read the slot's buffers: it ends before they are replaced.
      activations.forward_send.wait();
      activations.backward_send.wait();
      allocate_slot(st, activations, space, rows, m_config.d_model);
    }
    if (grow_scratch) allocate_scratch(st, space, rows, m_config.d_model);
  });
  // The capacities change only once every shard has grown its buffers: after a failure on one,
  // all of them grow again at the next call, together.
  st.slots[at].capacity = std::max(st.slots[at].capacity, rows);
  st.scratch_capacity = std::max(st.scratch_capacity, rows);
}

template <class ExecutionSpace, class Scalar>
void Transformer<ExecutionSpace, Scalar>::embed(const ExecutionSpace& space, int slot, int batch, int time,
                                                const Tokens& inputs) {
  auto& st = *m_state;
  const int rows = batch * time;
  const Matrix h0 = State::rows_of(st.slots[std::size_t(slot)].blocks[0].x, rows);
  const Kokkos::View<const std::int32_t*, memory_space> tokens(inputs.data(), std::size_t(rows));
  token_embedding_forward<ExecutionSpace, Scalar>(
      space, tokens, Matrix(m_parameters.value(st.token_table).data(), st.vocab_range.count, m_config.d_model),
      st.vocab_range.begin, h0);
  // This shard's columns of the learned positions, added where they belong; the sum over the
  // shards then completes both the token embeddings and the positions (one all-reduce).
  const int columns = st.model_range.count, column0 = st.model_range.begin;
  if (columns > 0) {
    const Matrix positions = State::rows_of(st.positions, rows);
    position_embedding_forward<ExecutionSpace, Scalar>(
        space, batch, time, Matrix(m_parameters.value(st.position_table).data(), m_config.block_size, columns),
        positions);
    Kokkos::parallel_for(
        "Lather::Transformer::add_positions",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0}, {rows, columns}),
        KOKKOS_LAMBDA(int i, int j) { h0(i, column0 + j) += positions(i, j); });
  }
  if (st.shard_count > 1)
    st.transport.allreduce(space, Kokkos::View<Scalar*, memory_space>(h0.data(), h0.span()), comm::Combine::sum);
}

template <class ExecutionSpace, class Scalar>
void Transformer<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, int slot, int batch, int time,
                                                  const Tokens& inputs) {
  ::lather::Impl::ScopedRegion region("Lather::Transformer::forward");
  LATHER_REQUIRE(batch >= 1 && time >= 1 && time <= m_config.block_size, "Transformer: ", batch, " windows of ", time,
                 " tokens; the context holds 1 to ", m_config.block_size);
  auto& st = *m_state;
  const int rows = batch * time;
  auto& activations = st.slots.at(std::size_t(slot));
  if (st.first_stage()) {
    LATHER_REQUIRE(inputs.extent(0) >= std::size_t(batch) * std::size_t(time), "Transformer: ", inputs.extent(0),
                   " input tokens for ", batch, " x ", time);
    ask_needed(st, st.token_table, st.position_table + 1);
    embed(space, slot, batch, time, inputs);
  }
  const double eps = m_config.layer_norm_epsilon;
  const typename State::ParameterViews views{m_parameters};
  const auto value = [&](int i) { return views.value(i); };
  const auto kernel = [&](int i) { return views.kernel(i); };
  for (std::size_t l = 0; l < st.blocks.size(); ++l) {
    progress_sends(st);
    auto& b = st.blocks[l];
    auto& ba = activations.blocks[l];
    const auto& p = b.p;
    ask_needed(st, p.ln1_scale, p.mlp_out_bias + 1);
    // Named copies, not structured bindings: C++17 lambdas cannot capture those.
    const auto r = State::rows_of(ba, rows);
    const Matrix x = r.x, a = r.a, q = r.q, k = r.k, v = r.v, y = r.y, x1 = r.x1, bn = r.b, h = r.h, g = r.g;
    layer_norm_forward<ExecutionSpace, Scalar>(space, x, value(p.ln1_scale), value(p.ln1_offset), a,
                                               State::rows_of(ba.mean1, rows), State::rows_of(ba.rstd1, rows), eps);
    b.query->forward(space, a, kernel(p.query_kernel), value(p.query_bias), q);
    b.key->forward(space, a, kernel(p.key_kernel), value(p.key_bias), k);
    b.value->forward(space, a, kernel(p.value_kernel), value(p.value_bias), v);
    ba.attention->forward(space, batch, time, q, k, v, y);
    b.output->forward(space, y, kernel(p.output_kernel), value(p.output_bias), x1);
    Kokkos::parallel_for(
        "Lather::Transformer::residual",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0}, {rows, int(x.extent(1))}),
        KOKKOS_LAMBDA(int i, int j) { x1(i, j) += x(i, j); });
    layer_norm_forward<ExecutionSpace, Scalar>(space, x1, value(p.ln2_scale), value(p.ln2_offset), bn,
                                               State::rows_of(ba.mean2, rows), State::rows_of(ba.rstd2, rows), eps);
    b.mlp_in->forward(space, bn, kernel(p.mlp_in_kernel), value(p.mlp_in_bias), h);
    gelu_forward<ExecutionSpace, Scalar>(space, h, g);
    // The next block's input (or the stage's output stream) = x1 + MLP.
    const Matrix next =
        State::rows_of(l + 1 < st.blocks.size() ? activations.blocks[l + 1].x : activations.x_final, rows);
    b.mlp_out->forward(space, g, kernel(p.mlp_out_kernel), value(p.mlp_out_bias), next);
    Kokkos::parallel_for(
        "Lather::Transformer::residual",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0}, {rows, int(x.extent(1))}),
        KOKKOS_LAMBDA(int i, int j) { next(i, j) += x1(i, j); });
  }
  if (!st.last_stage()) return;
  ask_needed(st, st.final_scale, st.head_bias + 1);
  const Matrix f = State::rows_of(activations.f, rows);
  layer_norm_forward<ExecutionSpace, Scalar>(space, State::rows_of(activations.x_final, rows), value(st.final_scale),
                                             value(st.final_offset), f, State::rows_of(activations.mean_f, rows),
                                             State::rows_of(activations.rstd_f, rows), eps);
  st.head->forward(space, f, kernel(st.head_kernel), value(st.head_bias), State::rows_of(activations.logits, rows));
}

template <class ExecutionSpace, class Scalar>
LanguageModelSums Transformer<ExecutionSpace, Scalar>::loss(const ExecutionSpace& space, int slot, int rows,
                                                            const Tokens& targets, bool backward) {
  auto& st = *m_state;
  auto& activations = st.slots.at(std::size_t(slot));
  LATHER_REQUIRE(targets.extent(0) >= std::size_t(rows), "Transformer: ", targets.extent(0), " targets for ", rows,
                 " tokens");
  nn::CrossEntropyTerms terms;
  terms.gradient_scale = backward ? 1.0 : 0.0;  // the summed loss's gradient
  terms.z_loss = m_config.z_loss;
  const auto sums = st.criterion->forward_backward(
      space, State::rows_of(activations.logits, rows),
      Kokkos::View<const int*, memory_space>(targets.data(), std::size_t(rows)),
      State::rows_of(activations.row_loss, rows), State::rows_of(activations.dlogits, rows), terms);
  LanguageModelSums result;
  result.loss = sums.loss;
  result.z_loss = sums.z_loss;
  result.correct = sums.correct;
  result.tokens = rows;
  return result;
}

template <class ExecutionSpace, class Scalar>
void Transformer<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, int slot, int batch, int time,
                                                   const Tokens& inputs, bool accumulate) {
  ::lather::Impl::ScopedRegion region("Lather::Transformer::backward");
  auto& st = *m_state;
  auto& activations = st.slots.at(std::size_t(slot));
  const int rows = batch * time;
  const typename State::ParameterViews views{m_parameters};
  const auto value = [&](int i) { return views.value(i); };
  const auto gradient = [&](int i) { return views.gradient(i); };
  const auto kernel = [&](int i) { return views.kernel(i); };
  const auto kernel_gradient = [&](int i) { return views.kernel_gradient(i); };
  const Matrix dx = State::rows_of(st.dx, rows), dtmp = State::rows_of(st.dtmp, rows);
  const Matrix dq = State::rows_of(st.dq, rows), dk = State::rows_of(st.dk, rows), dv = State::rows_of(st.dv, rows);
  const Matrix dy = State::rows_of(st.dy, rows), dg = State::rows_of(st.dg, rows);

  if (st.last_stage()) {
    // Head: dF = sum over shards of dlogits_d W_d^T; then the final LayerNorm starts dX.
    ask_needed(st, st.final_scale, st.head_bias + 1);
    st.head->backward(space, State::rows_of(activations.f, rows), kernel(st.head_kernel),
                      State::rows_of(activations.dlogits, rows), dtmp, kernel_gradient(st.head_kernel),
                      gradient(st.head_bias), accumulate);
    layer_norm_backward<ExecutionSpace, Scalar>(space, State::rows_of(activations.x_final, rows), value(st.final_scale),
                                                State::rows_of(activations.mean_f, rows),
                                                State::rows_of(activations.rstd_f, rows), dtmp, dx, false,
                                                gradient(st.final_scale), gradient(st.final_offset), accumulate);
    // The final LayerNorm's and the head's tensors, consecutive in the list.
    report_ready(st, st.final_scale, st.head_bias + 1);
  }  // else dX holds the gradient of the stage's output, received from the next stage
  for (std::size_t l = st.blocks.size(); l-- > 0;) {
    progress_sends(st);
    report_ready(st, 0, 0);
    auto& b = st.blocks[l];
    auto& ba = activations.blocks[l];
    const auto& p = b.p;
    ask_needed(st, p.ln1_scale, p.mlp_out_bias + 1);
    // Named copies, not structured bindings: C++17 lambdas cannot capture those.
    const auto r = State::rows_of(ba, rows);
    const Matrix x = r.x, a = r.a, q = r.q, k = r.k, v = r.v, y = r.y, x1 = r.x1, bn = r.b, h = r.h, g = r.g;
    // MLP: dX is the gradient of its output (the residual carries it past unchanged).
    b.mlp_out->backward(space, g, kernel(p.mlp_out_kernel), dx, dg, kernel_gradient(p.mlp_out_kernel),
                        gradient(p.mlp_out_bias), accumulate);
    gelu_backward<ExecutionSpace, Scalar>(space, h, dg, dg);
    b.mlp_in->backward(space, bn, kernel(p.mlp_in_kernel), dg, dtmp, kernel_gradient(p.mlp_in_kernel),
                       gradient(p.mlp_in_bias), accumulate);
    layer_norm_backward<ExecutionSpace, Scalar>(space, x1, value(p.ln2_scale), State::rows_of(ba.mean2, rows),
                                                State::rows_of(ba.rstd2, rows), dtmp, dx, true, gradient(p.ln2_scale),
                                                gradient(p.ln2_offset), accumulate);
    // Attention: dX is now the gradient of x1.
    b.output->backward(space, y, kernel(p.output_kernel), dx, dy, kernel_gradient(p.output_kernel),
                       gradient(p.output_bias), accumulate);
    ba.attention->backward(space, batch, time, q, k, v, dy, dq, dk, dv);
    // The three projections read the same input: their input gradients are summed here and
    // reduced over the shards once (each layer's own backward would reduce three times).
    const Matrix none;
    b.query->backward(space, a, kernel(p.query_kernel), dq, none, kernel_gradient(p.query_kernel),
                      gradient(p.query_bias), accumulate);
    b.key->backward(space, a, kernel(p.key_kernel), dk, none, kernel_gradient(p.key_kernel), gradient(p.key_bias),
                    accumulate);
    b.value->backward(space, a, kernel(p.value_kernel), dv, none, kernel_gradient(p.value_kernel),
                      gradient(p.value_bias), accumulate);
    ::lather::Impl::gemm(space, "N", "T", Scalar(1), dq, kernel(p.query_kernel), Scalar(0), dtmp);
    ::lather::Impl::gemm(space, "N", "T", Scalar(1), dk, kernel(p.key_kernel), Scalar(1), dtmp);
    ::lather::Impl::gemm(space, "N", "T", Scalar(1), dv, kernel(p.value_kernel), Scalar(1), dtmp);
    if (st.shard_count > 1)
      st.transport.allreduce(space, Kokkos::View<Scalar*, memory_space>(dtmp.data(), dtmp.span()), comm::Combine::sum);
    layer_norm_backward<ExecutionSpace, Scalar>(space, x, value(p.ln1_scale), State::rows_of(ba.mean1, rows),
                                                State::rows_of(ba.rstd1, rows), dtmp, dx, true, gradient(p.ln1_scale),
                                                gradient(p.ln1_offset), accumulate);
    report_ready(st, p.ln1_scale, p.mlp_out_bias + 1);  // the block's tensors, consecutive in the list
  }
  if (st.first_stage()) {
    // The embedding's backward reads no value, but the gathers of sharded parameters run on a
    // fixed schedule: a need() before every layer's backward.
    ask_needed(st, st.token_table, st.position_table + 1);
    embed_backward(space, batch, time, inputs, accumulate);
    report_ready(st, st.token_table, st.position_table + 1);
  }
  // else dX holds the gradient of the stage's input, for the previous stage
}

template <class ExecutionSpace, class Scalar>
void Transformer<ExecutionSpace, Scalar>::embed_backward(const ExecutionSpace& space, int batch, int time,
                                                         const Tokens& inputs, bool accumulate) {
  auto& st = *m_state;
  const int rows = batch * time;
  const Matrix dx = State::rows_of(st.dx, rows);
  const Kokkos::View<const std::int32_t*, memory_space> tokens(inputs.data(), std::size_t(rows));
  // The sum over the shards hands every shard the whole gradient: each takes its tokens' rows and
  // its columns of the positions.
  token_embedding_backward<ExecutionSpace, Scalar>(
      space, tokens, dx, st.vocab_range.begin,
      Matrix(m_parameters.gradient(st.token_table).data(), st.vocab_range.count, m_config.d_model), accumulate);
  const int columns = st.model_range.count, column0 = st.model_range.begin;
  if (columns == 0) return;
  const Matrix positions = State::rows_of(st.positions, rows);
  Kokkos::parallel_for(
      "Lather::Transformer::position_gradient_columns",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0}, {rows, columns}),
      KOKKOS_LAMBDA(int i, int j) { positions(i, j) = dx(i, column0 + j); });
  position_embedding_backward<ExecutionSpace, Scalar>(
      space, batch, time, positions,
      Matrix(m_parameters.gradient(st.position_table).data(), m_config.block_size, columns), accumulate);
}

#define LATHER_NN_TRANSFORMER_PASSES(SPACE, SCALAR)                                                         \
  template void Transformer<SPACE, SCALAR>::reserve(const SPACE&, int, int);                                \
  template void Transformer<SPACE, SCALAR>::embed(const SPACE&, int, int, int, const Tokens&);              \
  template void Transformer<SPACE, SCALAR>::forward(const SPACE&, int, int, int, const Tokens&);            \
  template LanguageModelSums Transformer<SPACE, SCALAR>::loss(const SPACE&, int, int, const Tokens&, bool); \
  template void Transformer<SPACE, SCALAR>::backward(const SPACE&, int, int, int, const Tokens&, bool);     \
  template void Transformer<SPACE, SCALAR>::embed_backward(const SPACE&, int, int, const Tokens&, bool);

LATHER_NN_TRANSFORMER_PASSES(DefaultExecutionSpace, float)
LATHER_NN_TRANSFORMER_PASSES(DefaultExecutionSpace, double)

}  // namespace lather::nn
