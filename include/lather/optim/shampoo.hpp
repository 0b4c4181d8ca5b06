#pragma once
// Distributed Shampoo (Anil et al., arXiv 2002.09018) with the numerics of the JAX reference
// `distributed_shampoo` (optax-shampoo 0.0.6): block-partitioned Kronecker-factored
// preconditioners, inverse p-th roots by coupled Newton (or eigendecomposition), grafting,
// momentum, quantized state, and the global statistics stack shared by a group of ranks.
//
//   lather::optim::Shampoo<Kokkos::DefaultExecutionSpace, float> shampoo(space, params, options, mesh);
//   shampoo.step(space, params);   // every training step, after the gradient reduction
//
// The state layout is the reference's sharded layout: a global stack of statistics and
// preconditioners [N, max, max] (padded with identity to a multiple of the group size) plus local
// per-parameter state (diagonal statistics, momentum, diagonal momentum).
//
// Construction is collective over the group and the weight shards: the ranks agree that none
// failed (bad parameters or options, memory) and that all hold the same parameters and options
// (global shapes across shards), so such a failure is a lather::Error on every rank.
//
// Failures on a group: a step agrees on "did any rank fail" before each of its collectives, so
// an exception on one rank is a lather::Error on every rank of the group and of the weight
// shards, "Shampoo::step <t>: <message> (on group rank k of n)", and no rank blocks. The flag
// rides on collectives the step makes anyway (the norms, the exchange of root metrics); only its
// message costs one more small collective, and only when something failed. (Replicated, the
// preconditioning and update after the root exchange are not agreed: no collective over the group
// follows them, and every replica does the same work on the same data.) What is usable after:
//  * a failure before any state moves (a NaN or Inf in a gradient, the packing of the gradients):
//    the optimizer is unchanged, and the next step is the one it would have taken. Distributed,
//    every rank scans its whole gradient before it packs its own blocks, so a NaN or Inf in its
//    copy of a block that another rank updates is refused too; its verdict rides on the norms;
//  * a failure in the inverse roots or, distributed, in a rank's share of the update: the
//    statistics already took the step's gradient and some preconditioners or parameters may be
//    new on some ranks only. Every rank knows, but neither the optimizer nor the parameters may
//    be used further: restore both from a checkpoint (Checkpointer::restore_latest) or rebuild;
//  * a failure in state_arrays() (a checkpoint save): the optimizer is unchanged and usable.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/mesh.hpp>
#include <lather/optim/optimizer.hpp>
#include <lather/optim/partition.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/statistic_metrics.hpp>

#include <memory>
#include <vector>

namespace lather::optim {

namespace Impl {
template <class ExecutionSpace, class Scalar>
class ShampooEngineBase;
}

template <class ExecutionSpace, class Scalar>
class Shampoo final : public Optimizer<ExecutionSpace, Scalar> {
 public:
  using typename Optimizer<ExecutionSpace, Scalar>::Tensors;
  using typename Optimizer<ExecutionSpace, Scalar>::Parameters;
  using typename Optimizer<ExecutionSpace, Scalar>::memory_space;

  /// On a Mesh: the ranks of mesh.data_parallel() (which reduced the gradients) hold the same
  /// state and split the root work; with weight shards, the per-tensor norms of grafting are
  /// summed over mesh.shards(), so a split tensor is grafted as a whole. The default Mesh is one
  /// process. Allocates and initialises the state on `space`.
  Shampoo(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, ShampooOptions options,
          const comm::Mesh& mesh = comm::Mesh());
  Shampoo(const ExecutionSpace& space, const Parameters& parameters, ShampooOptions options,
          const comm::Mesh& mesh = comm::Mesh())
      : Shampoo(space, parameters.specs(), std::move(options), mesh) {}
  /// The groups given directly: `group` shares the state and the root work, `shards` holds the
  /// other slices of split parameters.
  Shampoo(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, ShampooOptions options,
          const comm::Group& group, const comm::Group& shards = comm::Group());
  ~Shampoo() override;
  Shampoo(const Shampoo&) = delete;
  Shampoo& operator=(const Shampoo&) = delete;

  std::string name() const override { return "shampoo"; }
  long step_count() const override;
  StateMemoryReport memory_report() const override;
  /// Collective over the group and the weight shards: each rank assembles its share, all agree
  /// that it worked (a failure on one is an error on all, the optimizer unchanged), then the
  /// shares are summed over the group when the step is distributed.
  std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) override;
  void state_restored(const ExecutionSpace& space, long step_count) override;
  void state_released() override;
  std::vector<std::pair<std::string, std::string>> describe() const override;
  /// describe() of an optimizer built with `options`.
  static std::vector<std::pair<std::string, std::string>> describe(const ShampooOptions& options);

  const ShampooOptions& options() const;
  /// True when the ranks of the group split the step (StepMode::distributed in effect).
  bool distributed() const;
  bool overlap_exchange(const ExecutionSpace& space, std::vector<std::pair<std::size_t, std::size_t>> layers) override;
  void values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) override;
  using Optimizer<ExecutionSpace, Scalar>::values_needed;
  int num_statistics() const;
  bool is_preconditioned(int parameter) const;
  const BlockPartition& partition(int parameter) const;
  std::vector<StatisticMetrics> metrics() const;
  /// Load imbalance (max / mean n^3 cost per rank) of the root assignment in use.
  double root_load_imbalance() const;
  /// Host copies (n x n, row-major, dequantized to double) of statistic / preconditioner s, made
  /// on `space`. In sharded mode only the statistics this rank stores can be read.
  std::vector<double> statistic(const ExecutionSpace& space, int s) const;
  std::vector<double> preconditioner(const ExecutionSpace& space, int s) const;

  /// Measure the seconds of each phase of a step (statistics, roots, precondition, graft,
  /// update, communication, ...): the execution space is fenced at each boundary, which costs
  /// time on a device, so it is off by default.
  void measure_phases(bool on);
  /// Seconds spent in each phase since construction (while measuring).
  std::vector<std::pair<std::string, double>> phase_seconds() const;
  /// GEMM launches since construction (statistics, preconditioning and roots; a batched call is
  /// one launch).
  long gemm_launches() const;
  /// Floating-point operations of this rank's statistics and preconditioning products since
  /// construction (the roots left out), as its BLAS computes them (syrk: the upper triangle).
  /// Divided by a GEMM rate, the least time those products can take.
  double product_flops() const;

 protected:
  void do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) override;

 private:
  std::unique_ptr<Impl::ShampooEngineBase<ExecutionSpace, Scalar>> m_engine;
};

// Compiled into liblather (src/optim/shampoo.cpp); other spaces: <lather/optim/impl/shampoo_impl.hpp>.
extern template class Shampoo<DefaultExecutionSpace, float>;
extern template class Shampoo<DefaultExecutionSpace, double>;

}  // namespace lather::optim
