#pragma once
// Muon (Jordan et al. 2024, "Muon: MomentUm Orthogonalized by Newton-schulz"), with the numerics
// of optax.contrib.muon (optax 0.2.8): the momentum of every matrix parameter is orthogonalized
// by a quintic Newton-Schulz iteration before it is applied; every other parameter takes AdamW.
//
//   lather::optim::Muon<Kokkos::DefaultExecutionSpace, float> muon(space, params.specs(), options, group);
//   muon.step(space, params);   // every training step, after the gradient reduction
//
// Which parameters are matrices: every parameter of rank >= 2 not named in
// MuonOptions::adamw_parameters, seen as the 2-D matrix [shape[0], product of the other
// dimensions] (a dense kernel [in, out] as it is; a conv kernel [h, w, in, out] as [h, w*in*out]).
// That is optax's MuonDimensionNumbers(reduction_axis=0, output_axis=(1, ..., rank-1)): one
// matrix per tensor, no batch axes, and shape[0] is the fan-in of the shape factor below (JAX's
// [in, out] convention). The orthogonalization itself does not care which side is which (NS(G^T)
// = NS(G)^T); only the factor sqrt(max(1, fan_out / fan_in)) does. A kernel whose natural matrix
// is another split (HWIO conv kernels: [h*w*in, out]) is best reshaped by the caller or listed in
// adamw_parameters; we chose one rule over per-parameter dimension numbers to keep the plan
// trivially identical on every rank. Rank 0/1 parameters (biases, scalars, norms) take AdamW, as
// optax's muon does; embeddings and output heads should too (Jordan et al.), which is what
// adamw_parameters is for.
//
// Per Muon matrix G of shape m x n, at step t (1-based), as optax.contrib.scale_by_muon:
//   mu   = beta mu + (1 - beta) g                                   (an average, not a sum)
//   mu^  = beta mu / (1 - beta^(t+1)) + (1 - beta) g / (1 - beta^t)  (nesterov)
//        = mu / (1 - beta^t)                                         (otherwise)
//   O    = NS(mu^): transpose when m > n, X = X / (||X||_F + epsilon), ns_steps times
//          X = a X + (b A + c A A) X with A = X X^T, transpose back
//   p   -= lr(t-1) (sqrt(max(1, n / m)) O + weight_decay p)
// and every other parameter takes optax.adamw with the Muon's nesterov flag (optax's muon hands
// its `nesterov` to its AdamW too).
//
// Distributed (a group of more than one rank, every rank holding the same reduced gradients):
// the matrices are assigned to the ranks greedily by the Newton-Schulz cost m n min(m, n)
// (longest processing time first); each rank keeps the momentum of its own matrices only,
// orthogonalizes and updates them, and one all-gather per step brings every rank every new
// matrix value. AdamW parameters are updated on every rank (cheap and identical everywhere).
// A failure in a rank's share travels as a flag with the all-gather, then every rank throws the
// same lather::Error ("Muon::step <t>: <message> (on group rank k of n)"); the parameters are
// then partly updated and must be restored from a checkpoint. A NaN or Inf in any rank's gradient
// is refused before any state moves: every rank scans its whole gradient (its share reads only
// its own matrices) and the ranks agree, one small collective per step, so every rank throws the
// same lather::Error naming the parameter and the optimizer and the parameters are unchanged.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>
#include <lather/core/product_precision.hpp>
#include <lather/optim/distribution.hpp>
#include <lather/optim/optimizer.hpp>
#include <lather/optim/schedule.hpp>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lather::optim {

struct MuonOptions {
  LearningRateSchedule learning_rate = LearningRateSchedule::constant(2e-2);
  double beta = 0.95;    ///< momentum decay: mu = beta mu + (1 - beta) g
  bool nesterov = true;  ///< Muon's and AdamW's update use the Nesterov look-ahead
  int ns_steps = 5;      ///< Newton-Schulz iterations
  /// (a, b, c) of X <- a X + b (X X^T) X + c (X X^T)^2 X: Jordan's quintic, maximal slope at 0.
  std::array<double, 3> ns_coefficients{3.4445, -4.7750, 2.0315};
  double epsilon = 1e-8;  ///< X / (||X||_F + epsilon) before the iteration (optax's eps)
  /// Lather's: what the inputs of the Newton-Schulz products (X X^T, A A, B X) are rounded to,
  /// accumulated in float32; the iterates stay float32 between products. bfloat16 is the
  /// precision of Jordan's reference (which also keeps the iterates in bfloat16). tf32 or
  /// bfloat16 run on tensor cores on CUDA (cuBLAS), elsewhere through rounded copies (for
  /// testing: slower than float32). Muon<..., double> takes float32 only.
  ProductPrecision newton_schulz_precision = ProductPrecision::float32;
  double weight_decay = 0.0;  ///< decoupled, times the learning rate: p -= lr wd p
  double adam_beta1 = 0.9, adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;  ///< optax's muon passes its `eps` to AdamW as well: keep equal to match it
  double adam_epsilon_root = 0.0;
  double adam_weight_decay = 0.0;  ///< decoupled, times the learning rate
  /// Names of rank >= 2 parameters that take AdamW instead (embeddings, output heads).
  std::vector<std::string> adamw_parameters;
  void validate() const;  ///< Throws lather::Error naming the bad field.
};

/// The options as a checkpoint records them and the ranks compare them (Optimizer::describe()).
std::vector<std::pair<std::string, std::string>> describe_muon(const MuonOptions& options);

/// How a parameter is treated, and (Muon matrices) where its Newton-Schulz runs.
struct MuonParameterPlan {
  bool matrix = false;                 ///< true: Muon; false: AdamW
  std::int64_t rows = 0, columns = 0;  ///< the 2-D view [shape[0], product of the rest]
  int owner = 0;                       ///< rank of the group that orthogonalizes it
  double cost() const;                 ///< rows columns min(rows, columns): the Newton-Schulz flops / 6 per step
};

/// For each parameter: Muon matrix or AdamW, and (matrices) the owning part that `assign` gives
/// it from the matrices' cost(), in parameter order.
std::vector<MuonParameterPlan> plan_muon(const std::vector<ParameterSpec>& parameters, const MuonOptions& options,
                                         const PartAssignment& assign);
/// The same with the owning rank of `ranks`, by greedy longest-processing-time on cost() (ties:
/// the lower parameter index first, the lower rank).
std::vector<MuonParameterPlan> plan_muon(const std::vector<ParameterSpec>& parameters, const MuonOptions& options,
                                         int ranks);

namespace Impl {
template <class ExecutionSpace, class Scalar>
struct MuonState;
}

template <class ExecutionSpace, class Scalar>
class Muon final : public Optimizer<ExecutionSpace, Scalar> {
 public:
  using typename Optimizer<ExecutionSpace, Scalar>::Tensors;
  using typename Optimizer<ExecutionSpace, Scalar>::Parameters;
  using typename Optimizer<ExecutionSpace, Scalar>::memory_space;

  /// The ranks of `group` hold the same parameters and reduced gradients and share the
  /// Newton-Schulz work (collective over `group`: the ranks check that they agree on the
  /// parameters and options). The state is allocated and initialised on `space`.
  Muon(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, MuonOptions options,
       const comm::Group& group = comm::Group());
  Muon(const ExecutionSpace& space, const Parameters& parameters, MuonOptions options,
       const comm::Group& group = comm::Group())
      : Muon(space, parameters.specs(), std::move(options), group) {}
  ~Muon() override;
  Muon(const Muon&) = delete;
  Muon& operator=(const Muon&) = delete;

  std::string name() const override { return "muon"; }
  long step_count() const override { return m_step; }
  StateMemoryReport memory_report() const override;
  /// Distributed, the momentum of every matrix is gathered to every rank (rank 0 writes it).
  std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) override;
  void state_restored(const ExecutionSpace& space, long step_count) override;
  void state_released() override;
  std::vector<std::pair<std::string, std::string>> describe() const override;

  const MuonOptions& options() const { return m_options; }
  const std::vector<MuonParameterPlan>& plan() const { return m_plan; }
  bool distributed() const { return m_distributor->distributed(); }
  bool overlap_exchange(const ExecutionSpace& space, std::vector<std::pair<std::size_t, std::size_t>> layers) override;
  void values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) override;
  using Optimizer<ExecutionSpace, Scalar>::values_needed;

 protected:
  void do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) override;

 private:
  /// The other ranks' new matrices among parameters [first, last), from the exchange into `values`.
  void unpack_matrices(const ExecutionSpace& space, const Tensors& values, std::size_t first, std::size_t last);

  /// Matrix p's momentum in the buffer state_arrays() gathers (distributed).
  Kokkos::View<Scalar*, memory_space> state_view(std::size_t p) const;

  MuonOptions m_options;
  comm::Group m_group;
  /// Where each matrix is orthogonalized and how its new values reach every rank.
  std::unique_ptr<Distributor<ExecutionSpace, Scalar>> m_distributor;
  std::vector<MuonParameterPlan> m_plan;
  std::unique_ptr<Impl::MuonState<ExecutionSpace, Scalar>> m_state;
  long m_step = 0;
  std::int64_t m_step_host = 0;
  Tensors m_exchanged;  ///< the values of the step whose exchange by layers is pending
};

// Compiled into liblather (src/optim/muon.cpp); other spaces: <lather/optim/impl/muon_impl.hpp>.
extern template class Muon<DefaultExecutionSpace, float>;
extern template class Muon<DefaultExecutionSpace, double>;

}  // namespace lather::optim
