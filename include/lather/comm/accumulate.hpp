#pragma once
// Gradient accumulation over K micro-batches with one reduction per K (DDP's no_sync): the
// micro-batch gradients are added locally, and the K-th is followed by one fused reduction over
// the group, so the result equals the gradient of one batch K times larger per rank.
//
//  * AccumulationMode::mean: every micro-batch gradient is a mean over its (equally sized)
//    micro-batch; the accumulator adds g / K and reduce() takes the mean over the group:
//    result = (1 / (n K)) sum_{r,k} g_{r,k}, the mean over all n K micro-batches.
//  * AccumulationMode::token_weighted: every micro-batch gradient is a SUM over its tokens and
//    accumulate() gets the token count; reduce() divides the group-wide sum of gradients by the
//    group-wide sum of tokens: result = sum_{r,k} g_{r,k} / sum_{r,k} w_{r,k}.
//
// Counting: accumulate() beyond K micro-batches throws on the calling rank (no communication is
// involved); reduce() with a count other than K on any rank throws on every rank (the count joins
// the layout agreement).
//
// Failures: whatever fails in reduce() before the data moves, on any rank (a count, a shape, the
// copy into the outputs, the reducer's own preparation), is one lather::Error on every rank,
// agreed in the reducer's layout agreement. The accumulated micro-batches are then kept: reduce()
// may be called again (and gives what the failed call would have), or reset() drops them.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/reduce.hpp>

#include <string>

namespace lather::comm {

enum class AccumulationMode { mean, token_weighted };
std::string to_string(AccumulationMode mode);

template <class ExecutionSpace, class Scalar>
class GradientAccumulator {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using tensor_list = TensorList<Scalar, memory_space>;

  /// Reduces over `group` (a GradientReducer). micro_batches >= 1.
  GradientAccumulator(const Group& group, int micro_batches, AccumulationMode mode = AccumulationMode::mean,
                      const ReduceOptions& options = {});
  /// Over the mesh's data-parallel group.
  GradientAccumulator(const Mesh& mesh, int micro_batches, AccumulationMode mode = AccumulationMode::mean,
                      const ReduceOptions& options = {})
      : GradientAccumulator(mesh.data_parallel(), micro_batches, mode, options) {}

  /// Adds one micro-batch's gradients (local, no communication). `tokens` is that micro-batch's
  /// token count in token_weighted mode (finite, >= 0) and ignored in mean mode. The first call of
  /// a cycle fixes the tensor shapes; later calls must match them.
  void accumulate(const ExecutionSpace& space, const tensor_list& micro_gradients, double tokens = 1.0);

  /// After exactly K accumulate() calls on every rank: writes the reduced big-batch gradient into
  /// `gradients` (same shapes as the micro-batches) and starts a new cycle. Collective. Returns
  /// the group-wide token count (token_weighted) or n K (mean). When it throws, the cycle is not
  /// over: the accumulated micro-batches are kept for another reduce() (or reset()).
  double reduce(const ExecutionSpace& space, const tensor_list& gradients);

  /// Drops what was accumulated (local).
  void reset();

  int micro_batches() const { return m_micro_batches; }
  int accumulated() const { return m_accumulated; }
  double local_tokens() const { return m_tokens; }
  AccumulationMode mode() const { return m_mode; }
  GradientReducer<ExecutionSpace, Scalar>& reducer() { return m_reducer; }

 private:
  GradientReducer<ExecutionSpace, Scalar> m_reducer;
  int m_micro_batches = 1;
  AccumulationMode m_mode = AccumulationMode::mean;
  int m_accumulated = 0;
  double m_tokens = 0;
  Kokkos::View<Scalar*, memory_space> m_storage;  ///< all accumulators, one allocation
  tensor_list m_sums;                             ///< subviews of m_storage, one per tensor
};

}  // namespace lather::comm
