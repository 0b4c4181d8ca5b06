#include <lather/optim/shampoo.hpp>

#include "shampoo_engine.hpp"


namespace lather::optim {

template <class ExecutionSpace, class Scalar>
Shampoo<ExecutionSpace, Scalar>::Shampoo(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                         ShampooOptions options, std::shared_ptr<WorkGroup> group,
                                         std::shared_ptr<WorkGroup> shards)
    : Optimizer<ExecutionSpace, Scalar>(space, std::move(parameters)) {
  options.validate();
  if (options.statistics_precision == linalg::Precision::float64)
    m_engine = Impl::make_shampoo_engine<ExecutionSpace, Scalar, double>(space, this->m_parameters, options,
                                                                         std::move(group), std::move(shards));
  else
    m_engine = Impl::make_shampoo_engine<ExecutionSpace, Scalar, float>(space, this->m_parameters, options,
                                                                        std::move(group), std::move(shards));
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
  std::vector<std::pair<std::string, std::string>> out = {{"optimizer", "shampoo"},
                                                          {"learning_rate_schedule", options().learning_rate.describe()}};
  for (const auto& name : option_names())
    if (name != "learning_rate") out.emplace_back(name, option_value(options(), name));
  return out;
}

template class Shampoo<DefaultExecutionSpace, float>;
template class Shampoo<DefaultExecutionSpace, double>;

}  // namespace lather::optim
