#include <lather/comm/communicator.hpp>
#include <lather/comm/tensor_parallel.hpp>

#include "agreement.hpp"
#include "mpi_support.hpp"
#include "tensor_parallel_kernels.hpp"
#include "transport.hpp"

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

/// Shard count, shard and the agreed feature counts of a layer: collective construction.
struct ShardInfo {
  MPI_Comm comm = MPI_COMM_NULL;
  int shards = 1, shard = 0;
};

ShardInfo agree_layer(MPI_Comm shards, const std::string& context, std::vector<Impl::AgreementField> fields,
                      const std::string& local_error) {
  ShardInfo info;
  info.comm = shards;
  info.shards = comm_size(shards);
  info.shard = comm_rank(shards);
  Impl::Agreement agreement(shards, context, std::move(fields), {}, local_error);
  agreement.require_agreement();
  return info;
}

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

/// Per-call agreement on the batch size and argument validity, unless switched off. Without it a
/// local error still throws, locally.
void agree_call(const ShardInfo& info, bool verify, const std::string& context, std::int64_t batch,
                const std::string& local_error, std::vector<Impl::AgreementField> extra = {}) {
  if (!verify) {
    LATHER_REQUIRE(local_error.empty(), context, ": ", local_error);
    return;
  }
  std::vector<Impl::AgreementField> fields = {{"batch size", batch}};
  for (auto& f : extra) fields.push_back(std::move(f));
  Impl::Agreement(info.comm, context, std::move(fields), {}, local_error).require_agreement();
}

}  // namespace

// ---- ColumnParallelLinear -----------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct ColumnParallelLinear<ExecutionSpace, Scalar>::State {
  ShardInfo info;
  int in = 0, out = 0;
  ShardRange range;
  TensorParallelOptions options;
  Impl::Transport<ExecutionSpace, Scalar> transport;
};

template <class ExecutionSpace, class Scalar>
ColumnParallelLinear<ExecutionSpace, Scalar>::ColumnParallelLinear(MPI_Comm shards, int in_features,
                                                                   int out_features,
                                                                   const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  const std::string error =
      in_features >= 1 && out_features >= 1
          ? std::string()
          : ::lather::Impl::concat("in_features ", in_features, " and out_features ", out_features,
                                   " must be >= 1");
  m_state->info = agree_layer(shards, "ColumnParallelLinear",
                              {{"in_features", in_features}, {"out_features", out_features}}, error);
  m_state->in = in_features;
  m_state->out = out_features;
  m_state->range = shard_range(out_features, m_state->info.shards, m_state->info.shard);
  m_state->options = options;
  m_state->transport = Impl::Transport<ExecutionSpace, Scalar>(shards, std::size_t(1) << 24,
                                                               "Lather::ColumnParallelLinear");
}

template <class ExecutionSpace, class Scalar>
ColumnParallelLinear<ExecutionSpace, Scalar>::~ColumnParallelLinear() = default;
template <class ExecutionSpace, class Scalar>
ColumnParallelLinear<ExecutionSpace, Scalar>::ColumnParallelLinear(ColumnParallelLinear&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
ColumnParallelLinear<ExecutionSpace, Scalar>& ColumnParallelLinear<ExecutionSpace, Scalar>::operator=(
    ColumnParallelLinear&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
int ColumnParallelLinear<ExecutionSpace, Scalar>::in_features() const { return m_state->in; }
template <class ExecutionSpace, class Scalar>
int ColumnParallelLinear<ExecutionSpace, Scalar>::out_features() const { return m_state->out; }
template <class ExecutionSpace, class Scalar>
ShardRange ColumnParallelLinear<ExecutionSpace, Scalar>::local_out() const { return m_state->range; }

template <class ExecutionSpace, class Scalar>
void ColumnParallelLinear<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, const const_matrix& x,
                                                           const const_matrix& weight,
                                                           const const_vector& bias, const matrix& y) const {
  Impl::ScopedRegion region("Lather::ColumnParallelLinear::forward");
  const auto& st = *m_state;
  const std::size_t batch = x.extent(0), in = std::size_t(st.in), out = std::size_t(st.range.count);
  const auto error = first_error({expect_shape("x", x, batch, in), expect_shape("weight", weight, in, out),
                                  expect_length("bias", bias, out), expect_shape("y", y, batch, out)});
  LATHER_REQUIRE(error.empty(), "ColumnParallelLinear::forward: ", error);
  Impl::gemm(space, "N", "N", x, weight, y);
  Impl::add_bias(space, y, bias);
}

template <class ExecutionSpace, class Scalar>
void ColumnParallelLinear<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, const const_matrix& x,
                                                            const const_matrix& weight, const const_matrix& dy,
                                                            const matrix& dx, const matrix& dweight,
                                                            const vector& dbias) {
  Impl::ScopedRegion region("Lather::ColumnParallelLinear::backward");
  auto& st = *m_state;
  const std::size_t batch = x.extent(0), in = std::size_t(st.in), out = std::size_t(st.range.count);
  const auto error = first_error({expect_shape("x", x, batch, in), expect_shape("weight", weight, in, out),
                                  expect_shape("dy", dy, batch, out), expect_shape("dx", dx, batch, in),
                                  expect_shape("dweight", dweight, in, out), expect_length("dbias", dbias, out)});
  agree_call(st.info, st.options.verify_shapes, "ColumnParallelLinear::backward", std::int64_t(batch), error);
  LATHER_REQUIRE(dx.span_is_contiguous(), "ColumnParallelLinear::backward: dx must be contiguous");
  Impl::gemm(space, "T", "N", x, dy, dweight);
  Impl::column_sums(space, dy, dbias);
  Impl::gemm(space, "N", "T", dy, weight, dx);
  // The one all-reduce of the layer: every shard's contribution to the input gradient.
  if (st.info.shards > 1 && batch * in > 0)
    st.transport.allreduce_sum(space, Kokkos::View<Scalar*, memory_space>(dx.data(), batch * in));
  Impl::fence(space, "Lather::ColumnParallelLinear::backward: gradients ready");
}

// ---- RowParallelLinear --------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct RowParallelLinear<ExecutionSpace, Scalar>::State {
  ShardInfo info;
  int in = 0, out = 0;
  ShardRange range;
  TensorParallelOptions options;
  Impl::Transport<ExecutionSpace, Scalar> transport;
};

template <class ExecutionSpace, class Scalar>
RowParallelLinear<ExecutionSpace, Scalar>::RowParallelLinear(MPI_Comm shards, int in_features, int out_features,
                                                             const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  const std::string error =
      in_features >= 1 && out_features >= 1
          ? std::string()
          : ::lather::Impl::concat("in_features ", in_features, " and out_features ", out_features,
                                   " must be >= 1");
  m_state->info = agree_layer(shards, "RowParallelLinear",
                              {{"in_features", in_features}, {"out_features", out_features}}, error);
  m_state->in = in_features;
  m_state->out = out_features;
  m_state->range = shard_range(in_features, m_state->info.shards, m_state->info.shard);
  m_state->options = options;
  m_state->transport =
      Impl::Transport<ExecutionSpace, Scalar>(shards, std::size_t(1) << 24, "Lather::RowParallelLinear");
}

template <class ExecutionSpace, class Scalar>
RowParallelLinear<ExecutionSpace, Scalar>::~RowParallelLinear() = default;
template <class ExecutionSpace, class Scalar>
RowParallelLinear<ExecutionSpace, Scalar>::RowParallelLinear(RowParallelLinear&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
RowParallelLinear<ExecutionSpace, Scalar>& RowParallelLinear<ExecutionSpace, Scalar>::operator=(
    RowParallelLinear&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
int RowParallelLinear<ExecutionSpace, Scalar>::in_features() const { return m_state->in; }
template <class ExecutionSpace, class Scalar>
int RowParallelLinear<ExecutionSpace, Scalar>::out_features() const { return m_state->out; }
template <class ExecutionSpace, class Scalar>
ShardRange RowParallelLinear<ExecutionSpace, Scalar>::local_in() const { return m_state->range; }

template <class ExecutionSpace, class Scalar>
void RowParallelLinear<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, const const_matrix& x,
                                                        const const_matrix& weight, const const_vector& bias,
                                                        const matrix& y) {
  Impl::ScopedRegion region("Lather::RowParallelLinear::forward");
  auto& st = *m_state;
  const std::size_t batch = x.extent(0), in = std::size_t(st.range.count), out = std::size_t(st.out);
  const auto error = first_error({expect_shape("x", x, batch, in), expect_shape("weight", weight, in, out),
                                  expect_length("bias", bias, out), expect_shape("y", y, batch, out)});
  agree_call(st.info, st.options.verify_shapes, "RowParallelLinear::forward", std::int64_t(batch), error);
  LATHER_REQUIRE(y.span_is_contiguous(), "RowParallelLinear::forward: y must be contiguous");
  Impl::gemm(space, "N", "N", x, weight, y);
  if (st.info.shards > 1 && batch * out > 0)
    st.transport.allreduce_sum(space, Kokkos::View<Scalar*, memory_space>(y.data(), batch * out));
  Impl::add_bias(space, y, bias);  // once, after the sum
  Impl::fence(space, "Lather::RowParallelLinear::forward: output ready");
}

template <class ExecutionSpace, class Scalar>
void RowParallelLinear<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, const const_matrix& x,
                                                         const const_matrix& weight, const const_matrix& dy,
                                                         const matrix& dx, const matrix& dweight,
                                                         const vector& dbias) const {
  Impl::ScopedRegion region("Lather::RowParallelLinear::backward");
  const auto& st = *m_state;
  const std::size_t batch = dy.extent(0), in = std::size_t(st.range.count), out = std::size_t(st.out);
  const auto error = first_error({expect_shape("x", x, batch, in), expect_shape("weight", weight, in, out),
                                  expect_shape("dy", dy, batch, out), expect_shape("dx", dx, batch, in),
                                  expect_shape("dweight", dweight, in, out), expect_length("dbias", dbias, out)});
  LATHER_REQUIRE(error.empty(), "RowParallelLinear::backward: ", error);
  Impl::gemm(space, "N", "T", dy, weight, dx);
  Impl::gemm(space, "T", "N", x, dy, dweight);
  Impl::column_sums(space, dy, dbias);
}

// ---- all-gather ---------------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
void all_gather_features(const ExecutionSpace& space, MPI_Comm shards,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& local,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& gathered,
                         const TensorParallelOptions& options) {
  using memory_space = typename ExecutionSpace::memory_space;
  Impl::ScopedRegion region("Lather::all_gather_features");
  ShardInfo info;
  info.comm = shards;
  info.shards = comm_size(shards);
  info.shard = comm_rank(shards);
  const int features = int(gathered.extent(1)), batch = int(gathered.extent(0));
  const auto mine = shard_range(features, info.shards, info.shard);
  auto error = first_error({expect_shape("the local block", local, std::size_t(batch), std::size_t(mine.count))});
  if (error.empty() && !local.span_is_contiguous()) error = "the local block must be contiguous";
  if (error.empty() && std::int64_t(batch) * features > std::int64_t(INT_MAX))
    error = "the gathered activation has more than INT_MAX elements (MPI counts are int)";
  agree_call(info, options.verify_shapes, "all_gather_features", batch, error,
             {{"gathered feature count", features}});
  std::vector<int> counts(info.shards), displacements(info.shards);
  auto starts_host = Kokkos::View<int*, Kokkos::HostSpace>("Lather::all_gather_features::starts", info.shards + 1);
  for (int d = 0; d < info.shards; ++d) {
    const auto r = shard_range(features, info.shards, d);
    counts[d] = r.count * batch;
    displacements[d] = r.begin * batch;
    starts_host(d) = r.begin;
  }
  starts_host(info.shards) = features;
  Kokkos::View<int*, memory_space> starts("Lather::all_gather_features::starts", info.shards + 1);
  Kokkos::deep_copy(space, starts, starts_host);
  Kokkos::View<Scalar*, memory_space> packed(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::all_gather_features::packed"),
      std::size_t(batch) * features);
  // The local block is contiguous row-major [batch, count]: it travels as is.
  Kokkos::View<Scalar*, memory_space> block("Lather::all_gather_features::block", std::size_t(batch) * mine.count);
  Kokkos::deep_copy(space, block, Kokkos::View<const Scalar*, memory_space>(local.data(), block.extent(0)));
  Impl::Transport<ExecutionSpace, Scalar> transport(shards, std::size_t(1) << 24, "Lather::all_gather_features");
  transport.allgatherv(space, block, packed, counts, displacements);
  Impl::place_blocks(space, Kokkos::View<const Scalar*, memory_space>(packed),
                     Kokkos::View<const int*, memory_space>(starts), info.shards, gathered);
  Impl::fence(space, "Lather::all_gather_features: gathered");
}

// ---- VocabParallelCrossEntropy ------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct VocabParallelCrossEntropy<ExecutionSpace, Scalar>::State {
  ShardInfo info;
  int vocab = 0;
  ShardRange range;
  TensorParallelOptions options;
  Impl::Transport<ExecutionSpace, double> transport;
  Kokkos::View<double*, memory_space> maxima, sums;
};

template <class ExecutionSpace, class Scalar>
VocabParallelCrossEntropy<ExecutionSpace, Scalar>::VocabParallelCrossEntropy(MPI_Comm shards, int vocab_size,
                                                                             const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  const std::string error =
      vocab_size >= 1 ? std::string() : ::lather::Impl::concat("vocab_size must be >= 1, got ", vocab_size);
  m_state->info = agree_layer(shards, "VocabParallelCrossEntropy", {{"vocab_size", vocab_size}}, error);
  m_state->vocab = vocab_size;
  m_state->range = shard_range(vocab_size, m_state->info.shards, m_state->info.shard);
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
  Impl::ScopedRegion region("Lather::VocabParallelCrossEntropy::forward_backward");
  auto& st = *m_state;
  const std::size_t batch = logits.extent(0), columns = std::size_t(st.range.count);
  std::string error = first_error({expect_shape("logits", logits, batch, columns),
                                   expect_length("labels", labels, batch), expect_length("loss", loss, batch),
                                   expect_shape("grad", grad, batch, columns)});
  if (error.empty() && batch == 0) error = "the batch is empty";
  // Labels are checked on the host, and hashed so that shards holding different labels disagree.
  std::uint64_t label_hash = Impl::fnv1a_start;
  if (error.empty()) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), labels);
    for (std::size_t i = 0; i < batch; ++i) {
      if (host(i) < 0 || host(i) >= st.vocab) {
        error = ::lather::Impl::concat("label ", host(i), " of row ", i, " is not a class of the vocabulary of ",
                                       st.vocab);
        break;
      }
      label_hash = Impl::fnv1a(label_hash, std::uint64_t(host(i)));
    }
  }
  agree_call(st.info, st.options.verify_shapes, "VocabParallelCrossEntropy::forward_backward",
             std::int64_t(batch), error, {{"hash of the labels", std::int64_t(label_hash)}});
  if (st.maxima.extent(0) < batch) {
    st.maxima = Kokkos::View<double*, memory_space>("Lather::VocabParallelCrossEntropy::maxima", batch);
    st.sums = Kokkos::View<double*, memory_space>("Lather::VocabParallelCrossEntropy::sums", 2 * batch);
  }
  const auto maxima = Kokkos::subview(st.maxima, std::make_pair(std::size_t(0), batch));
  const auto sums = Kokkos::subview(st.sums, std::make_pair(std::size_t(0), 2 * batch));
  Impl::row_max(space, logits, Kokkos::View<double*, memory_space>(maxima));
  if (st.info.shards > 1) st.transport.allreduce(space, maxima, MPI_MAX);
  Impl::local_sums(space, logits, labels, st.range.begin, Kokkos::View<const double*, memory_space>(maxima),
                   Kokkos::View<double*, memory_space>(sums));
  if (st.info.shards > 1) st.transport.allreduce(space, sums, MPI_SUM);
  Impl::finish_cross_entropy(space, logits, labels, st.range.begin,
                             Kokkos::View<const double*, memory_space>(maxima),
                             Kokkos::View<const double*, memory_space>(sums), loss, grad);
  const double total = Impl::sum_values(space, Kokkos::View<const Scalar*, memory_space>(loss));
  Impl::fence(space, "Lather::VocabParallelCrossEntropy: loss and gradient ready");
  return total / double(batch);
}

#define LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(SPACE, SCALAR)                                        \
  template class ColumnParallelLinear<SPACE, SCALAR>;                                                 \
  template class RowParallelLinear<SPACE, SCALAR>;                                                    \
  template class VocabParallelCrossEntropy<SPACE, SCALAR>;                                            \
  template void all_gather_features<SPACE, SCALAR>(                                                   \
      const SPACE&, MPI_Comm, const Matrix<const SCALAR, SPACE::memory_space>&,                       \
      const Matrix<SCALAR, SPACE::memory_space>&, const TensorParallelOptions&);

LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultExecutionSpace, double)
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::comm
