#pragma once
// The first-order baselines, with the same interface as Shampoo so that drivers and benchmarks
// compare like with like: SGD with momentum, AdaGrad, Adam and AdamW, as optax defines them.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/optim/optimizer.hpp>
#include <lather/optim/schedule.hpp>

#include <memory>
#include <string>
#include <vector>

namespace lather::optim {

struct SgdOptions {
  LearningRateSchedule learning_rate = LearningRateSchedule::constant(1e-2);
  double momentum = 0.9;      ///< optax.sgd: m = g + momentum m
  bool nesterov = false;      ///< update uses g + momentum m
  double weight_decay = 0.0;  ///< L2: weight_decay * p added to the gradient
  void validate() const;
};

struct AdagradOptions {
  LearningRateSchedule learning_rate = LearningRateSchedule::constant(1e-2);
  double initial_accumulator_value = 0.1;  ///< optax.adagrad's default
  double epsilon = 1e-7;                   ///< update = g / sqrt(sum g^2 + epsilon)
  double weight_decay = 0.0;
  void validate() const;
};

struct AdamOptions {
  LearningRateSchedule learning_rate = LearningRateSchedule::constant(1e-3);
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weight_decay = 0.0;
  /// true: AdamW (decoupled: update += weight_decay * p after the Adam direction, as optax.adamw);
  /// false: L2 (weight_decay * p added to the gradient).
  bool decoupled_weight_decay = false;
  void validate() const;
};

/// One class, three rules: which one is fixed at construction by the options type.
template <class ExecutionSpace, class Scalar>
class FirstOrder final : public Optimizer<ExecutionSpace, Scalar> {
 public:
  using typename Optimizer<ExecutionSpace, Scalar>::Tensors;
  using typename Optimizer<ExecutionSpace, Scalar>::Parameters;
  using typename Optimizer<ExecutionSpace, Scalar>::memory_space;

  /// The state is allocated and initialised on `space`.
  FirstOrder(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, SgdOptions options);
  FirstOrder(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, AdagradOptions options);
  FirstOrder(const ExecutionSpace& space, std::vector<ParameterSpec> parameters, AdamOptions options);
  template <class Options>
  FirstOrder(const ExecutionSpace& space, const Parameters& parameters, Options options)
      : FirstOrder(space, parameters.specs(), std::move(options)) {}
  ~FirstOrder() override;

  std::string name() const override;
  long step_count() const override { return m_step; }
  StateMemoryReport memory_report() const override;
  std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) override;
  void state_restored(const ExecutionSpace&, long step_count) override { m_step = step_count; }
  std::vector<std::pair<std::string, std::string>> describe() const override;

 protected:
  void do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& gradients) override;

 private:
  enum class Rule { sgd, adagrad, adam };
  void allocate(const ExecutionSpace& space, const std::vector<std::string>& slots, double initial);

  Rule m_rule;
  SgdOptions m_sgd;
  AdagradOptions m_adagrad;
  AdamOptions m_adam;
  std::vector<std::string> m_slot_names;
  std::vector<std::vector<FlatTensor<Scalar, memory_space>>> m_state;  // [slot][parameter]
  long m_step = 0;
  std::int64_t m_step_host = 0;
};

// Compiled into liblather (src/optim/first_order.cpp); other spaces:
// <lather/optim/impl/first_order_impl.hpp>.
extern template class FirstOrder<DefaultExecutionSpace, float>;
extern template class FirstOrder<DefaultExecutionSpace, double>;

}  // namespace lather::optim
