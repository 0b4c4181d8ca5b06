#pragma once
// The interface every Lather optimizer (Shampoo and the baselines) offers, so that drivers,
// benchmarks and checkpoints treat them alike.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/parameters.hpp>
#include <lather/core/state_array.hpp>
#include <lather/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lather::optim {

using ::lather::ParameterSpec;

/// Bytes of optimizer state on this rank, by kind.
struct StateMemoryReport {
  std::int64_t stack_bytes = 0;      ///< statistics/preconditioner stacks in float or double
  std::int64_t local_bytes = 0;      ///< per-parameter state in float or double (momentum, ...)
  std::int64_t quantized_bytes = 0;  ///< int8/int16 buffers with their scales and diagonals
  std::int64_t workspace_bytes = 0;  ///< scratch the optimizer keeps between steps
  std::int64_t total() const { return stack_bytes + local_bytes + quantized_bytes + workspace_bytes; }
  std::string to_string() const;  ///< one line, MiB per kind
};

// The state-array description lives in core (checkpoints read it too); optim's names for it.
using ::lather::as_bytes;
using ::lather::DType;
using ::lather::dtype_of;
using ::lather::size_of;
using ::lather::StateArray;
using ::lather::step_array;
using ::lather::to_string;

/// Every optimizer is built on an execution space instance (where it allocates and initialises
/// its state) and takes the instance again in every call that launches work, as Kokkos Kernels
/// does; it never fences globally.
template <class ExecutionSpace, class Scalar>
class Optimizer {
 public:
  using execution_space = ExecutionSpace;
  using memory_space = typename ExecutionSpace::memory_space;
  using value_type = Scalar;
  using Tensors = TensorList<Scalar, memory_space>;
  using Parameters = ParameterList<Scalar, memory_space>;

  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  /// One update on `space`: values += update(gradients). The lists match parameters() in count
  /// and sizes. Shampoo, SOAP and Muon refuse a gradient that holds a NaN or an Inf on any rank
  /// of their group: each rank scans its whole gradient (one pass) and the ranks agree, so every
  /// rank throws the same lather::Error naming the parameter before any state or parameter
  /// changes, even where the rank with the bad value does not update that parameter's blocks.
  /// The first-order baselines (FirstOrder) do not check; ReduceOptions::check_finite does so
  /// for any optimizer, in the gradient reduction.
  void step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) {
    check_arguments(values, gradients);
    do_step(space, values, gradients);
  }
  void step(const ExecutionSpace& space, const Parameters& parameters) {
    step(space, parameters.values(), parameters.gradients());
  }
  [[deprecated("pass the execution space instance: step(space, values, gradients)")]] void step(
      const Tensors& values, const Tensors& gradients) {
    step(ExecutionSpace(), values, gradients);
  }
  /// Updates done so far; the learning-rate schedule is evaluated at this value.
  virtual long step_count() const = 0;
  virtual StateMemoryReport memory_report() const = 0;
  /// The state, for checkpoints: writing these arrays and the step count, then filling them back
  /// into an optimizer built with the same parameters and options, restores it exactly. Collective
  /// over the optimizer's group (an optimizer that splits its state gathers it here); copies are
  /// made on `space`.
  virtual std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) = 0;
  /// Called after the arrays of state_arrays() were overwritten (e.g. by a checkpoint load).
  virtual void state_restored(const ExecutionSpace& space, long step_count) = 0;
  /// Called when the arrays of state_arrays() are no longer read (after a checkpoint save): an
  /// optimizer may free what it assembled for them.
  virtual void state_released() {}
  /// The options as (name, value) pairs for logs and checkpoint attributes.
  virtual std::vector<std::pair<std::string, std::string>> describe() const = 0;

  // ---- the distributed step's exchange, overlapped with the next forward ----------------------

  /// From the next step on, the distributed step's exchange of new values runs as one nonblocking
  /// all-gather per layer (`layers`: consecutive ranges [first, last) of parameters covering the
  /// list, in the order the forward reads them), and step() returns with them in flight: the other
  /// ranks' blocks of a layer hold their old values until values_needed() covers it. Returns false
  /// where there is nothing to overlap (a replicated step, an optimizer without an exchange).
  /// Local (what it allocates, on `space`); empty `layers`: back to the whole exchange in step().
  virtual bool overlap_exchange(const ExecutionSpace& space, std::vector<std::pair<std::size_t, std::size_t>> layers) {
    (void)space, (void)layers;
    return false;
  }
  /// The new values of parameters [first, last) in place: waits for their layers' all-gathers
  /// and unpacks them. Call it before anything reads or writes those values (the forward through
  /// needed_hook(); an evaluation, a checkpoint, a copy of the values: values_needed(space)).
  /// step() and checkpoint::Checkpointer's save and restore complete every layer first
  /// themselves. Local.
  virtual void values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) {
    (void)space, (void)first, (void)last;
  }
  void values_needed(const ExecutionSpace& space) { values_needed(space, 0, m_parameters.size()); }
  /// values_needed() as the hook a model calls before each layer's forward (Mlp::train_batch).
  ParametersNeeded needed_hook(const ExecutionSpace& space) {
    return [this, space](std::size_t first, std::size_t last) { values_needed(space, first, last); };
  }

  const std::vector<ParameterSpec>& parameters() const { return m_parameters; }

 protected:
  /// Validates the parameters (names, shapes): throws on this rank.
  explicit Optimizer(std::vector<ParameterSpec> parameters);
  /// For optimizers built collectively over a group: a rank that threw here would leave the
  /// others waiting in the constructor's agreement, so the derived constructor calls
  /// validate_parameters() among the work whose failure its ranks agree on.
  struct ValidateLater {};
  Optimizer(std::vector<ParameterSpec> parameters, ValidateLater) : m_parameters(std::move(parameters)) {}
  /// Throws unless every parameter has a name of its own and a valid shape and split.
  void validate_parameters() const;
  virtual void do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) = 0;
  /// Throws unless values and gradients match parameters() (count, sizes, no aliasing).
  void check_arguments(const Tensors& values, const Tensors& gradients) const;

  std::vector<ParameterSpec> m_parameters;
};

}  // namespace lather::optim
