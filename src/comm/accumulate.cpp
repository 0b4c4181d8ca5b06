#include <lather/comm/accumulate.hpp>

#include <lather/comm/impl/kernels.hpp>
#include <lather/comm/impl/support.hpp>
#include <lather/core/fault_injection.hpp>

#include <cmath>

namespace lather::comm {

std::string to_string(AccumulationMode mode) { return mode == AccumulationMode::mean ? "mean" : "token_weighted"; }

namespace {
/// Checks the count before the reducer's collective construction (every rank checks the same).
const Group& checked_group(const Group& group, int micro_batches) {
  LATHER_REQUIRE(micro_batches >= 1, "GradientAccumulator: micro_batches must be >= 1, got ", micro_batches);
  return group;
}
}  // namespace

template <class ExecutionSpace, class Scalar>
GradientAccumulator<ExecutionSpace, Scalar>::GradientAccumulator(const Group& group, int micro_batches,
                                                                 AccumulationMode mode, const ReduceOptions& options)
    : m_reducer(checked_group(group, micro_batches), options), m_micro_batches(micro_batches), m_mode(mode) {}

template <class ExecutionSpace, class Scalar>
void GradientAccumulator<ExecutionSpace, Scalar>::accumulate(const ExecutionSpace& space,
                                                             const tensor_list& micro_gradients, double tokens) {
  Impl::ScopedRegion region("Lather::GradientAccumulator::accumulate");
  LATHER_REQUIRE(m_accumulated < m_micro_batches, "GradientAccumulator::accumulate: micro-batch ", m_accumulated + 1,
                 " of a cycle of ", m_micro_batches, "; call reduce() after every ", m_micro_batches, " micro-batches");
  const bool weighted = m_mode == AccumulationMode::token_weighted;
  if (weighted)
    LATHER_REQUIRE(std::isfinite(tokens) && tokens >= 0,
                   "GradientAccumulator::accumulate: token count must be finite and >= 0, got ", tokens);
  const bool first = m_accumulated == 0;
  if (first) {
    // A new cycle may change the shapes: (re)build the accumulators.
    bool same = m_sums.size() == micro_gradients.size();
    for (std::size_t t = 0; same && t < m_sums.size(); ++t) same = m_sums[t].extent(0) == micro_gradients[t].extent(0);
    if (!same) {
      std::size_t total = 0;
      for (const auto& g : micro_gradients) total += g.extent(0);
      m_storage = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::GradientAccumulator::sums"), total);
      m_sums.clear();
      std::size_t offset = 0;
      for (const auto& g : micro_gradients) {
        m_sums.push_back(Kokkos::subview(m_storage, std::make_pair(offset, offset + g.extent(0))));
        offset += g.extent(0);
      }
    }
    m_tokens = 0;
  } else {
    LATHER_REQUIRE(micro_gradients.size() == m_sums.size(), "GradientAccumulator::accumulate: micro-batch ",
                   m_accumulated + 1, " has ", micro_gradients.size(), " tensors, the first had ", m_sums.size());
    for (std::size_t t = 0; t < m_sums.size(); ++t)
      LATHER_REQUIRE(micro_gradients[t].extent(0) == m_sums[t].extent(0), "GradientAccumulator::accumulate: tensor ", t,
                     " of micro-batch ", m_accumulated + 1, " has ", micro_gradients[t].extent(0),
                     " elements, the first micro-batch had ", m_sums[t].extent(0));
  }
  const double factor = weighted ? 1.0 : 1.0 / m_micro_batches;
  for (std::size_t t = 0; t < m_sums.size(); ++t)
    Impl::accumulate_scaled(space, m_sums[t], Kokkos::View<const Scalar*, memory_space>(micro_gradients[t]), factor,
                            first);
  m_tokens += weighted ? tokens : 0.0;
  ++m_accumulated;
}

template <class ExecutionSpace, class Scalar>
double GradientAccumulator<ExecutionSpace, Scalar>::reduce(const ExecutionSpace& space, const tensor_list& gradients) {
  Impl::ScopedRegion region("Lather::GradientAccumulator::reduce");
  // Shapes are checked locally, but the verdict travels with the agreement: a rank with a bad
  // output list must not leave the others waiting in the reduction. So does a failure of the copy
  // into the outputs (the reducer's `local_error`); the sums are not touched, so a failed reduce()
  // can be called again.
  bool shapes_match = m_accumulated > 0 && gradients.size() == m_sums.size();
  for (std::size_t t = 0; shapes_match && t < m_sums.size(); ++t)
    shapes_match = gradients[t].extent(0) == m_sums[t].extent(0);
  std::string local_error;
  if (shapes_match)
    local_error = ::lather::Impl::local_failure("accumulate.reduce", [&] {
      for (std::size_t t = 0; t < m_sums.size(); ++t) Kokkos::deep_copy(space, gradients[t], m_sums[t]);
    });
  const std::vector<AgreedValue> agreed = {
      {"accumulated micro-batches", m_accumulated, true, m_micro_batches},
      {"output tensors match the accumulated shapes (1 yes, 0 no)", shapes_match ? 1 : 0, true, 1}};
  const bool weighted = m_mode == AccumulationMode::token_weighted;
  const double global =
      m_reducer.reduce(space, gradients, weighted ? ReduceOp::weighted_mean : ReduceOp::mean, weighted ? m_tokens : 1.0,
                       agreed, local_error.empty() ? local_error : "GradientAccumulator::reduce: " + local_error);
  m_accumulated = 0;
  m_tokens = 0;
  return weighted ? global : global * m_micro_batches;
}

template <class ExecutionSpace, class Scalar>
void GradientAccumulator<ExecutionSpace, Scalar>::reset() {
  m_accumulated = 0;
  m_tokens = 0;
}

template class GradientAccumulator<DefaultExecutionSpace, float>;
template class GradientAccumulator<DefaultExecutionSpace, double>;
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
template class GradientAccumulator<DefaultHostExecutionSpace, float>;
template class GradientAccumulator<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::comm
