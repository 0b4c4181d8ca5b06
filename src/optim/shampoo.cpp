#include <lather/optim/shampoo.hpp>

#include "shampoo_engine.hpp"

#include <sstream>

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
Shampoo<ExecutionSpace, Scalar>::Shampoo(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                         ShampooOptions options, std::shared_ptr<WorkGroup> group)
    : Optimizer<ExecutionSpace, Scalar>(space, std::move(parameters)) {
  options.validate();
  if (options.statistics_precision == linalg::Precision::float64)
    m_engine = Impl::make_shampoo_engine<ExecutionSpace, Scalar, double>(space, this->m_parameters, options,
                                                                         std::move(group));
  else
    m_engine = Impl::make_shampoo_engine<ExecutionSpace, Scalar, float>(space, this->m_parameters, options,
                                                                        std::move(group));
}

template <class ExecutionSpace, class Scalar>
Shampoo<ExecutionSpace, Scalar>::~Shampoo() = default;

template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::step(const Tensors& params, const Tensors& grads) {
  this->check_arguments(params, grads);
  m_engine->step(params, grads);
}

template <class ExecutionSpace, class Scalar>
long Shampoo<ExecutionSpace, Scalar>::step_count() const {
  return m_engine->step_count();
}
template <class ExecutionSpace, class Scalar>
StateMemoryReport Shampoo<ExecutionSpace, Scalar>::memory_report() const {
  return m_engine->memory_report();
}
template <class ExecutionSpace, class Scalar>
auto Shampoo<ExecutionSpace, Scalar>::state_arrays() -> std::vector<StateArray<memory_space>> {
  return m_engine->state_arrays();
}
template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::state_restored(long step_count) {
  m_engine->state_restored(step_count);
}
template <class ExecutionSpace, class Scalar>
const ShampooOptions& Shampoo<ExecutionSpace, Scalar>::options() const {
  return m_engine->options();
}
template <class ExecutionSpace, class Scalar>
int Shampoo<ExecutionSpace, Scalar>::num_statistics() const {
  return m_engine->plan().num_statistics();
}
template <class ExecutionSpace, class Scalar>
bool Shampoo<ExecutionSpace, Scalar>::is_preconditioned(int parameter) const {
  return m_engine->plan().parameters.at(parameter).preconditioned;
}
template <class ExecutionSpace, class Scalar>
const BlockPartition& Shampoo<ExecutionSpace, Scalar>::partition(int parameter) const {
  return m_engine->plan().parameters.at(parameter).partition;
}
template <class ExecutionSpace, class Scalar>
std::vector<StatisticMetrics> Shampoo<ExecutionSpace, Scalar>::metrics() const {
  return m_engine->metrics();
}
template <class ExecutionSpace, class Scalar>
double Shampoo<ExecutionSpace, Scalar>::root_load_imbalance() const {
  return m_engine->root_load_imbalance();
}
template <class ExecutionSpace, class Scalar>
std::vector<double> Shampoo<ExecutionSpace, Scalar>::statistic(int s) const {
  return m_engine->statistic(s);
}
template <class ExecutionSpace, class Scalar>
std::vector<double> Shampoo<ExecutionSpace, Scalar>::preconditioner(int s) const {
  return m_engine->preconditioner(s);
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> Shampoo<ExecutionSpace, Scalar>::describe() const {
  const auto& o = options();
  const auto str = [](auto value) {
    std::ostringstream out;
    out << std::boolalpha << value;
    return out.str();
  };
  return {
      {"optimizer", "shampoo"},
      {"learning_rate", o.learning_rate.describe()},
      {"block_size", str(o.block_size)},
      {"beta1", str(o.beta1)},
      {"beta2", str(o.beta2)},
      {"diagonal_epsilon", str(o.diagonal_epsilon)},
      {"matrix_epsilon", str(o.matrix_epsilon)},
      {"weight_decay", str(o.weight_decay)},
      {"start_preconditioning_step", str(o.start_preconditioning_step)},
      {"preconditioning_compute_steps", str(o.preconditioning_compute_steps)},
      {"statistics_compute_steps", str(o.statistics_compute_steps)},
      {"best_effort_shape_interpretation", str(o.best_effort_shape_interpretation)},
      {"graft_type", to_string(o.graft_type)},
      {"nesterov", str(o.nesterov)},
      {"exponent_override", str(o.exponent_override)},
      {"shard_optimizer_states", str(o.shard_optimizer_states)},
      {"best_effort_memory_usage_reduction", str(o.best_effort_memory_usage_reduction)},
      {"inverse_failure_threshold", str(o.inverse_failure_threshold)},
      {"moving_average_for_momentum", str(o.moving_average_for_momentum)},
      {"skip_preconditioning_dim_size_gt", str(o.skip_preconditioning_dim_size_gt)},
      {"clip_by_scaled_gradient_norm", str(o.clip_by_scaled_gradient_norm)},
      {"relative_matrix_epsilon", str(o.relative_matrix_epsilon)},
      {"merge_small_dims_block_size", str(o.merge_small_dims_block_size)},
      {"skip_preconditioning_rank_lt", str(o.skip_preconditioning_rank_lt)},
      {"decoupled_learning_rate", str(o.decoupled_learning_rate)},
      {"decoupled_weight_decay", str(o.decoupled_weight_decay)},
      {"root_method", linalg::to_string(o.root.method)},
      {"root_compute_precision", linalg::to_string(o.root.compute_precision)},
      {"root_max_iterations", str(o.root.max_iterations)},
      {"root_tolerance", str(o.root.tolerance)},
      {"retry_failed_roots_in_double", str(o.retry_failed_roots_in_double)},
      {"max_consecutive_root_failures", str(o.max_consecutive_root_failures)},
      {"statistics_precision", linalg::to_string(o.statistics_precision)},
      {"balance_root_work", str(o.balance_root_work)},
  };
}

template class Shampoo<DefaultExecutionSpace, float>;
template class Shampoo<DefaultExecutionSpace, double>;

}  // namespace lather::optim
