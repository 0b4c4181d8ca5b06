#include <lather/nn/vocab_parallel_cross_entropy.hpp>

#include <lather/comm/agreement.hpp>
#include <lather/comm/transport.hpp>
#include <lather/core/fault_injection.hpp>

#include <lather/core/shape_checks.hpp>
#include <lather/core/hash.hpp>

#include "cross_entropy_kernels.hpp"

namespace lather::nn {

using comm::Agreement;
using comm::Combine;
using comm::Group;
using comm::shard_range;
using comm::Transport;
using ::lather::Impl::expect_length;
using ::lather::Impl::expect_shape;
using ::lather::Impl::first_error;
using ::lather::Impl::prepare_locally;

// ---- VocabParallelCrossEntropy ------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct VocabParallelCrossEntropy<ExecutionSpace, Scalar>::State {
  Group shards;
  int vocab = 0;
  ShardRange range;
  TensorParallelOptions options;
  Transport<ExecutionSpace, double> transport;
  Kokkos::View<double*, memory_space> maxima, sums, z_rows;
  Kokkos::View<int*, memory_space> correct_rows;
};

template <class ExecutionSpace, class Scalar>
VocabParallelCrossEntropy<ExecutionSpace, Scalar>::VocabParallelCrossEntropy(const Group& shards, int vocab_size,
                                                                             const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  const std::string error =
      vocab_size >= 1 ? std::string() : ::lather::Impl::concat("vocab_size must be >= 1, got ", vocab_size);
  Agreement(shards, "VocabParallelCrossEntropy", {{"vocab_size", vocab_size}}, {}, error).require_agreement();
  m_state->shards = shards;
  m_state->vocab = vocab_size;
  m_state->range = shard_range(vocab_size, shards.size(), shards.rank());
  m_state->options = options;
  m_state->transport =
      Transport<ExecutionSpace, double>(shards, std::size_t(1) << 24, "Lather::VocabParallelCrossEntropy");
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
int VocabParallelCrossEntropy<ExecutionSpace, Scalar>::vocab_size() const {
  return m_state->vocab;
}
template <class ExecutionSpace, class Scalar>
ShardRange VocabParallelCrossEntropy<ExecutionSpace, Scalar>::local_vocab() const {
  return m_state->range;
}

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
  std::string error =
      first_error({expect_shape("logits", logits, batch, columns), expect_length("labels", labels, batch),
                   expect_length("loss", loss, batch), expect_shape("grad", grad, batch, columns)});
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
        error =
            ::lather::Impl::concat("label ", host(i), " of row ", i, " is not a class of the vocabulary of ", st.vocab);
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
  comm::agree_on_call(st.shards, st.options.verify_shapes, "VocabParallelCrossEntropy::forward_backward",
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
  Impl::finish_cross_entropy(space, logits, labels, st.range.begin, Kokkos::View<const double*, memory_space>(maxima),
                             Kokkos::View<const double*, memory_space>(sums), terms.gradient_scale, terms.z_loss, loss,
                             Kokkos::View<double*, memory_space>(z_rows),
                             Kokkos::View<int*, memory_space>(correct_rows), grad);
  CrossEntropySums result;
  result.loss = Impl::sum_values(space, Kokkos::View<const Scalar*, memory_space>(loss));
  if (terms.z_loss != 0) result.z_loss = Impl::sum_values(space, Kokkos::View<const double*, memory_space>(z_rows));
  result.correct = long(Impl::sum_values(space, Kokkos::View<const int*, memory_space>(correct_rows)));
  Impl::fence(space, "Lather::VocabParallelCrossEntropy: loss and gradient ready");
  return result;
}

#define LATHER_NN_CROSS_ENTROPY_INSTANTIATE(SPACE, SCALAR) template class VocabParallelCrossEntropy<SPACE, SCALAR>;

LATHER_NN_CROSS_ENTROPY_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_NN_CROSS_ENTROPY_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_NN_CROSS_ENTROPY_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_NN_CROSS_ENTROPY_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::nn
