#include <lather/comm/impl/agreement.hpp>
#include <lather/comm/impl/support.hpp>
#include <lather/comm/impl/transport.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/core/impl/fault_injection.hpp>

#include "tensor_parallel_kernels.hpp"

#include <climits>
#include <cmath>

namespace lather::comm {

ShardRange shard_range(int total, int shards, int shard) {
  LATHER_REQUIRE(total >= 0 && shards >= 1 && shard >= 0 && shard < shards, "shard_range: shard ", shard,
                 " of ", shards, " shards of ", total, " features is not a valid shard");
  const int base = total / shards, extra = total % shards;
  return ShardRange{shard * base + std::min(shard, extra), base + (shard < extra ? 1 : 0)};
}

namespace {

std::string shape(std::size_t rows, std::size_t columns) {
  return "[" + std::to_string(rows) + ", " + std::to_string(columns) + "]";
}

/// Local shape checks: returns "" or what is wrong with the first View that does not fit.
template <class View>
std::string expect_shape(const char* what, const View& view, std::size_t rows, std::size_t columns) {
  if (view.extent(0) == rows && view.extent(1) == columns) return {};
  return ::lather::Impl::concat(what, " is ", shape(view.extent(0), view.extent(1)), ", expected ",
                                shape(rows, columns));
}
template <class View>
std::string expect_length(const char* what, const View& view, std::size_t length) {
  if (view.extent(0) == length) return {};
  return ::lather::Impl::concat(what, " has ", view.extent(0), " elements, expected ", length);
}
std::string first_error(std::initializer_list<std::string> errors) {
  for (const auto& e : errors)
    if (!e.empty()) return e;
  return {};
}

/// This shard's preparation for a communicating call (buffers, host copies), unless its arguments
/// already failed: what it throws becomes `error`, which the call's agreement then makes an error
/// on every shard. `point` is the call's fault-injection point (tests).
template <class Work>
void prepare_locally(const char* point, std::string& error, Work&& work) {
  if (error.empty()) error = ::lather::Impl::local_failure(point, std::forward<Work>(work));
}

/// Per-call agreement on the batch size and argument validity, unless switched off. Without it a
/// local error still throws, locally.
void agree_call(const Group& shards, bool verify, const std::string& context, std::int64_t batch,
                const std::string& local_error, std::vector<Impl::AgreementField> extra = {}) {
  if (!verify) {
    LATHER_REQUIRE(local_error.empty(), context, ": ", local_error);
    return;
  }
  std::vector<Impl::AgreementField> fields = {{"batch size", batch}};
  for (auto& f : extra) fields.push_back(std::move(f));
  Impl::Agreement(shards, context, std::move(fields), {}, local_error).require_agreement();
}

}  // namespace

// ---- the shared part of the column- and row-parallel layers -------------------------------------

namespace Impl {
template <class ExecutionSpace, class Scalar>
struct ParallelLinearState {
  using memory_space = typename ExecutionSpace::memory_space;
  std::string name;
  Group shards;
  int in = 0, out = 0;
  bool split_inputs = false;
  ShardRange range;
  TensorParallelOptions options;
  Transport<ExecutionSpace, Scalar> transport;

  /// This shard's weight shape [rows, columns].
  std::size_t weight_rows() const { return std::size_t(split_inputs ? range.count : in); }
  std::size_t weight_columns() const { return std::size_t(split_inputs ? out : range.count); }
  std::size_t x_columns() const { return weight_rows(); }
  std::size_t y_columns() const { return split_inputs ? std::size_t(out) : std::size_t(range.count); }

  /// What is wrong with the Views of a call ("" if nothing); empty dx / dweight / dbias are not
  /// checked (forward passes none of them, backward may skip dx).
  template <class X, class W, class B, class Y, class DX, class DW>
  std::string check(std::size_t batch, const X& x, const W& weight, const B& bias, const Y& y, const DX& dx,
                    const DW& dweight, bool backward) const {
    return first_error(
        {expect_shape("x", x, batch, x_columns()), expect_shape("weight", weight, weight_rows(), weight_columns()),
         expect_length(backward ? "dbias" : "bias", bias, y_columns()),
         expect_shape(backward ? "dy" : "y", y, batch, y_columns()),
         dx.data() ? expect_shape("dx", dx, batch, x_columns()) : std::string(),
         backward ? expect_shape("dweight", dweight, weight_rows(), weight_columns()) : std::string()});
  }
};
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>::ParallelLinear(const char* name, const Group& shards, int in_features,
                                                       int out_features, bool split_inputs,
                                                       const TensorParallelOptions& options)
    : m_state(std::make_unique<Impl::ParallelLinearState<ExecutionSpace, Scalar>>()) {
  const std::string error =
      in_features >= 1 && out_features >= 1
          ? std::string()
          : ::lather::Impl::concat("in_features ", in_features, " and out_features ", out_features,
                                   " must be >= 1");
  Impl::Agreement(shards, name, {{"in_features", in_features}, {"out_features", out_features}}, {}, error)
      .require_agreement();
  auto& st = *m_state;
  st.name = name;
  st.shards = shards;
  st.in = in_features;
  st.out = out_features;
  st.split_inputs = split_inputs;
  st.range = shard_range(split_inputs ? in_features : out_features, shards.size(), shards.rank());
  st.options = options;
  st.transport = Impl::Transport<ExecutionSpace, Scalar>(shards, std::size_t(1) << 24, std::string("Lather::") + name);
}

template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>::~ParallelLinear() = default;
template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>::ParallelLinear(ParallelLinear&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
ParallelLinear<ExecutionSpace, Scalar>& ParallelLinear<ExecutionSpace, Scalar>::operator=(ParallelLinear&&) noexcept =
    default;
template <class ExecutionSpace, class Scalar>
int ParallelLinear<ExecutionSpace, Scalar>::in_features() const { return m_state->in; }
template <class ExecutionSpace, class Scalar>
int ParallelLinear<ExecutionSpace, Scalar>::out_features() const { return m_state->out; }
template <class ExecutionSpace, class Scalar>
ShardRange ParallelLinear<ExecutionSpace, Scalar>::local() const { return m_state->range; }

// ---- ColumnParallelLinear -----------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
ColumnParallelLinear<ExecutionSpace, Scalar>::ColumnParallelLinear(const Group& shards, int in_features,
                                                                   int out_features,
                                                                   const TensorParallelOptions& options)
    : ParallelLinear<ExecutionSpace, Scalar>("ColumnParallelLinear", shards, in_features, out_features, false,
                                             options) {}

template <class ExecutionSpace, class Scalar>
void ColumnParallelLinear<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, const const_matrix& x,
                                                           const const_matrix& weight,
                                                           const const_vector& bias, const matrix& y) const {
  Impl::ScopedRegion region("Lather::ColumnParallelLinear::forward");
  const auto& st = *this->m_state;
  const auto error = st.check(x.extent(0), x, weight, bias, y, matrix(), matrix(), false);
  LATHER_REQUIRE(error.empty(), "ColumnParallelLinear::forward: ", error);
  Impl::gemm(space, "N", "N", Scalar(1), x, weight, Scalar(0), y);
  Impl::add_bias(space, y, bias);
}

template <class ExecutionSpace, class Scalar>
void ColumnParallelLinear<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, const const_matrix& x,
                                                            const const_matrix& weight, const const_matrix& dy,
                                                            const matrix& dx, const matrix& dweight,
                                                            const vector& dbias, bool accumulate) {
  Impl::ScopedRegion region("Lather::ColumnParallelLinear::backward");
  auto& st = *this->m_state;
  const std::size_t batch = x.extent(0), in = std::size_t(st.in);
  std::string error = st.check(batch, x, weight, dbias, dy, dx, dweight, true);
  if (error.empty() && dx.data() && !dx.span_is_contiguous()) error = "dx must be contiguous";
  const bool reduces = dx.data() && st.shards.size() > 1;
  prepare_locally("tensor_parallel.column_backward", error, [] {});
  if (reduces)
    agree_call(st.shards, st.options.verify_shapes, "ColumnParallelLinear::backward", std::int64_t(batch), error);
  else
    LATHER_REQUIRE(error.empty(), "ColumnParallelLinear::backward: ", error);
  const Scalar beta = accumulate ? Scalar(1) : Scalar(0);
  Impl::gemm(space, "T", "N", Scalar(1), x, dy, beta, dweight);
  Impl::column_sums(space, dy, dbias, accumulate);
  if (!dx.data()) return;
  Impl::gemm(space, "N", "T", Scalar(1), dy, weight, Scalar(0), dx);
  // The one all-reduce of the layer: every shard's contribution to the input gradient.
  if (reduces && batch * in > 0) st.transport.allreduce(space, Kokkos::View<Scalar*, memory_space>(dx.data(), batch * in));
}

// ---- RowParallelLinear --------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
RowParallelLinear<ExecutionSpace, Scalar>::RowParallelLinear(const Group& shards, int in_features, int out_features,
                                                             const TensorParallelOptions& options)
    : ParallelLinear<ExecutionSpace, Scalar>("RowParallelLinear", shards, in_features, out_features, true, options) {}

template <class ExecutionSpace, class Scalar>
void RowParallelLinear<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, const const_matrix& x,
                                                        const const_matrix& weight, const const_vector& bias,
                                                        const matrix& y) {
  Impl::ScopedRegion region("Lather::RowParallelLinear::forward");
  auto& st = *this->m_state;
  const std::size_t batch = x.extent(0), out = std::size_t(st.out);
  std::string error = st.check(batch, x, weight, bias, y, matrix(), matrix(), false);
  if (error.empty() && !y.span_is_contiguous()) error = "y must be contiguous";
  prepare_locally("tensor_parallel.row_forward", error, [] {});
  if (st.shards.size() > 1)
    agree_call(st.shards, st.options.verify_shapes, "RowParallelLinear::forward", std::int64_t(batch), error);
  else
    LATHER_REQUIRE(error.empty(), "RowParallelLinear::forward: ", error);
  Impl::gemm(space, "N", "N", Scalar(1), x, weight, Scalar(0), y);
  if (st.shards.size() > 1 && batch * out > 0)
    st.transport.allreduce(space, Kokkos::View<Scalar*, memory_space>(y.data(), batch * out));
  Impl::add_bias(space, y, bias);  // once, after the sum
}

template <class ExecutionSpace, class Scalar>
void RowParallelLinear<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, const const_matrix& x,
                                                         const const_matrix& weight, const const_matrix& dy,
                                                         const matrix& dx, const matrix& dweight,
                                                         const vector& dbias, bool accumulate) const {
  Impl::ScopedRegion region("Lather::RowParallelLinear::backward");
  const auto& st = *this->m_state;
  const auto error = st.check(dy.extent(0), x, weight, dbias, dy, dx, dweight, true);
  LATHER_REQUIRE(error.empty(), "RowParallelLinear::backward: ", error);
  if (dx.data()) Impl::gemm(space, "N", "T", Scalar(1), dy, weight, Scalar(0), dx);
  Impl::gemm(space, "T", "N", Scalar(1), x, dy, accumulate ? Scalar(1) : Scalar(0), dweight);
  Impl::column_sums(space, dy, dbias, accumulate);
}

// ---- all-gather ---------------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct FeatureAllGather<ExecutionSpace, Scalar>::State {
  Group shards;
  TensorParallelOptions options;
  Impl::Transport<ExecutionSpace, Scalar> transport;
  /// Column where each shard's block starts (+ the total), for the feature count last gathered.
  int features = -1;
  Kokkos::View<int*, memory_space> starts;
  Kokkos::View<Scalar*, memory_space> block, packed;
};

template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>::FeatureAllGather(const Group& shards, const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  m_state->shards = shards;
  m_state->options = options;
  m_state->transport = Impl::Transport<ExecutionSpace, Scalar>(shards, std::size_t(1) << 24, "Lather::FeatureAllGather");
}

template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>::~FeatureAllGather() = default;
template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>::FeatureAllGather(FeatureAllGather&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>& FeatureAllGather<ExecutionSpace, Scalar>::operator=(
    FeatureAllGather&&) noexcept = default;

template <class ExecutionSpace, class Scalar>
void FeatureAllGather<ExecutionSpace, Scalar>::operator()(const ExecutionSpace& space,
                                                          const Matrix<const Scalar, memory_space>& local,
                                                          const Matrix<Scalar, memory_space>& gathered) {
  Impl::ScopedRegion region("Lather::FeatureAllGather");
  auto& st = *m_state;
  const int shards = st.shards.size(), shard = st.shards.rank();
  const int features = int(gathered.extent(1)), batch = int(gathered.extent(0));
  const auto mine = shard_range(features, shards, shard);
  auto error = expect_shape("the local block", local, std::size_t(batch), std::size_t(mine.count));
  if (error.empty() && std::int64_t(batch) * features > std::int64_t(INT_MAX))
    error = "the gathered activation has more than INT_MAX elements (MPI counts are int)";
  const std::size_t total = std::size_t(batch) * features, own = std::size_t(batch) * mine.count;
  // The buffers, before the agreement: a shard that cannot allocate them tells the others.
  prepare_locally("tensor_parallel.all_gather", error, [&] {
    if (st.features != features) {
      auto starts_host = Kokkos::View<int*, Kokkos::HostSpace>("Lather::FeatureAllGather::starts", shards + 1);
      for (int d = 0; d < shards; ++d) starts_host(d) = shard_range(features, shards, d).begin;
      starts_host(shards) = features;
      st.starts = Kokkos::View<int*, memory_space>("Lather::FeatureAllGather::starts", shards + 1);
      Kokkos::deep_copy(space, st.starts, starts_host);
      ::lather::Impl::fence(space, "Lather::FeatureAllGather: block starts uploaded");
      st.features = features;
    }
    if (st.packed.extent(0) < total)
      st.packed = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::FeatureAllGather::packed"), total);
    if (st.block.extent(0) < own)
      st.block = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::FeatureAllGather::block"), own);
  });
  agree_call(st.shards, st.options.verify_shapes, "all_gather_features", batch, error,
             {{"gathered feature count", features}});
  std::vector<std::size_t> counts(shards);
  for (int d = 0; d < shards; ++d) counts[d] = std::size_t(shard_range(features, shards, d).count) * batch;
  // The local block (possibly a strided subview) becomes contiguous row-major [batch, count].
  const Matrix<Scalar, memory_space> block(st.block.data(), std::size_t(batch), std::size_t(mine.count));
  Kokkos::deep_copy(space, block, local);
  st.transport.allgatherv(space, Kokkos::subview(st.block, std::make_pair(std::size_t(0), own)),
                          Kokkos::subview(st.packed, std::make_pair(std::size_t(0), total)), counts);
  Impl::place_blocks(space, Kokkos::View<const Scalar*, memory_space>(st.packed),
                     Kokkos::View<const int*, memory_space>(st.starts), shards, gathered);
}

// ---- VocabParallelCrossEntropy ------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct VocabParallelCrossEntropy<ExecutionSpace, Scalar>::State {
  Group shards;
  int vocab = 0;
  ShardRange range;
  TensorParallelOptions options;
  Impl::Transport<ExecutionSpace, double> transport;
  Kokkos::View<double*, memory_space> maxima, sums, z_rows;
  Kokkos::View<int*, memory_space> correct_rows;
};

template <class ExecutionSpace, class Scalar>
VocabParallelCrossEntropy<ExecutionSpace, Scalar>::VocabParallelCrossEntropy(const Group& shards, int vocab_size,
                                                                             const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  const std::string error =
      vocab_size >= 1 ? std::string() : ::lather::Impl::concat("vocab_size must be >= 1, got ", vocab_size);
  Impl::Agreement(shards, "VocabParallelCrossEntropy", {{"vocab_size", vocab_size}}, {}, error).require_agreement();
  m_state->shards = shards;
  m_state->vocab = vocab_size;
  m_state->range = shard_range(vocab_size, shards.size(), shards.rank());
  m_state->options = options;
  m_state->transport =
      Impl::Transport<ExecutionSpace, double>(shards, std::size_t(1) << 24, "Lather::VocabParallelCrossEntropy");
}

template <class ExecutionSpace, class Scalar>
VocabParallelCrossEntropy<ExecutionSpace, Scalar>::~VocabParallelCrossEntropy() = default;
template <class ExecutionSpace, class Scalar>
VocabParallelCrossEntropy<ExecutionSpace, Scalar>::VocabParallelCrossEntropy(VocabParallelCrossEntropy&&) noexcept =
    default;
template <class ExecutionSpace, class Scalar>
VocabParallelCrossEntropy<ExecutionSpace, Scalar>& VocabParallelCrossEntropy<ExecutionSpace, Scalar>::operator=(
    VocabParallelCrossEntropy&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
int VocabParallelCrossEntropy<ExecutionSpace, Scalar>::vocab_size() const { return m_state->vocab; }
template <class ExecutionSpace, class Scalar>
ShardRange VocabParallelCrossEntropy<ExecutionSpace, Scalar>::local_vocab() const { return m_state->range; }

template <class ExecutionSpace, class Scalar>
double VocabParallelCrossEntropy<ExecutionSpace, Scalar>::forward_backward(const ExecutionSpace& space,
                                                                           const const_matrix& logits,
                                                                           const labels_view& labels,
                                                                           const vector& loss, const matrix& grad) {
  CrossEntropyTerms terms;
  terms.gradient_scale = logits.extent(0) > 0 ? 1.0 / double(logits.extent(0)) : 1.0;
  return forward_backward(space, logits, labels, loss, grad, terms).loss / double(logits.extent(0));
}

template <class ExecutionSpace, class Scalar>
CrossEntropySums VocabParallelCrossEntropy<ExecutionSpace, Scalar>::forward_backward(
    const ExecutionSpace& space, const const_matrix& logits, const labels_view& labels, const vector& loss,
    const matrix& grad, const CrossEntropyTerms& terms) {
  Impl::ScopedRegion region("Lather::VocabParallelCrossEntropy::forward_backward");
  auto& st = *m_state;
  const std::size_t batch = logits.extent(0), columns = std::size_t(st.range.count);
  std::string error = first_error({expect_shape("logits", logits, batch, columns),
                                   expect_length("labels", labels, batch), expect_length("loss", loss, batch),
                                   expect_shape("grad", grad, batch, columns)});
  if (error.empty() && batch == 0) error = "the batch is empty";
  // Labels are checked on the host, and hashed so that shards holding different labels disagree.
  Impl::Fnv1a label_hash;
  if (error.empty()) {
    Kokkos::View<int*, Kokkos::HostSpace> host(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::VocabParallelCrossEntropy::labels"), batch);
    Kokkos::deep_copy(space, host, labels);
    Impl::fence(space, "Lather::VocabParallelCrossEntropy: labels on the host");
    for (std::size_t i = 0; i < batch; ++i) {
      if (host(i) < 0 || host(i) >= st.vocab) {
        error = ::lather::Impl::concat("label ", host(i), " of row ", i, " is not a class of the vocabulary of ",
                                       st.vocab);
        break;
      }
      label_hash.add(std::uint64_t(host(i)));
    }
  }
  // The buffers of the row reductions, before the agreement: a shard that cannot allocate them
  // tells the others.
  prepare_locally("tensor_parallel.cross_entropy", error, [&] {
    if (st.maxima.extent(0) >= batch) return;
    st.maxima = Kokkos::View<double*, memory_space>("Lather::VocabParallelCrossEntropy::maxima", batch);
    st.sums = Kokkos::View<double*, memory_space>("Lather::VocabParallelCrossEntropy::sums", 2 * batch);
    st.z_rows = Kokkos::View<double*, memory_space>("Lather::VocabParallelCrossEntropy::z_rows", batch);
    st.correct_rows = Kokkos::View<int*, memory_space>("Lather::VocabParallelCrossEntropy::correct_rows", batch);
  });
  agree_call(st.shards, st.options.verify_shapes, "VocabParallelCrossEntropy::forward_backward",
             std::int64_t(batch), error, {{"hash of the labels", std::int64_t(label_hash.value())}});
  const auto maxima = Kokkos::subview(st.maxima, std::make_pair(std::size_t(0), batch));
  const auto sums = Kokkos::subview(st.sums, std::make_pair(std::size_t(0), 2 * batch));
  Impl::row_max(space, logits, Kokkos::View<double*, memory_space>(maxima));
  if (st.shards.size() > 1) st.transport.allreduce(space, maxima, Combine::max);
  Impl::local_sums(space, logits, labels, st.range.begin, Kokkos::View<const double*, memory_space>(maxima),
                   Kokkos::View<double*, memory_space>(sums));
  if (st.shards.size() > 1) st.transport.allreduce(space, sums, Combine::sum);
  const auto z_rows = Kokkos::subview(st.z_rows, std::make_pair(std::size_t(0), batch));
  const auto correct_rows = Kokkos::subview(st.correct_rows, std::make_pair(std::size_t(0), batch));
  Impl::finish_cross_entropy(space, logits, labels, st.range.begin,
                             Kokkos::View<const double*, memory_space>(maxima),
                             Kokkos::View<const double*, memory_space>(sums), terms.gradient_scale, terms.z_loss,
                             loss, Kokkos::View<double*, memory_space>(z_rows),
                             Kokkos::View<int*, memory_space>(correct_rows), grad);
  CrossEntropySums result;
  result.loss = Impl::sum_values(space, Kokkos::View<const Scalar*, memory_space>(loss));
  if (terms.z_loss != 0) result.z_loss = Impl::sum_values(space, Kokkos::View<const double*, memory_space>(z_rows));
  result.correct = long(Impl::sum_values(space, Kokkos::View<const int*, memory_space>(correct_rows)));
  Impl::fence(space, "Lather::VocabParallelCrossEntropy: loss and gradient ready");
  return result;
}

#define LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(SPACE, SCALAR) \
  template class ParallelLinear<SPACE, SCALAR>;                \
  template class ColumnParallelLinear<SPACE, SCALAR>;          \
  template class RowParallelLinear<SPACE, SCALAR>;             \
  template class FeatureAllGather<SPACE, SCALAR>;              \
  template class VocabParallelCrossEntropy<SPACE, SCALAR>;

LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultExecutionSpace, double)
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::comm
