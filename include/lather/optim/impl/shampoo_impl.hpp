#pragma once
// The implementation of Shampoo, for explicit instantiation: src/optim/shampoo.cpp instantiates it
// for lather::DefaultExecutionSpace (and the host space on device builds); a program that needs
// another execution space includes this header and uses the class as usual.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/impl/group_agreement.hpp>
#include <lather/optim/impl/shampoo_engine.hpp>
#include <lather/optim/shampoo.hpp>

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
Shampoo<ExecutionSpace, Scalar>::Shampoo(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                         ShampooOptions options, const comm::Mesh& mesh)
    : Shampoo(space, std::move(parameters), std::move(options), mesh.data_parallel(),
              mesh.weight_shards() > 1 ? mesh.shards() : comm::Group()) {}

template <class ExecutionSpace, class Scalar>
Shampoo<ExecutionSpace, Scalar>::Shampoo(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                         ShampooOptions options, const comm::Group& group, const comm::Group& shards)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters),
                                        typename Optimizer<ExecutionSpace, Scalar>::ValidateLater()) {
  // The one collective that does not wait for the agreement below: every rank reaches it, before
  // anything that may throw on one rank only.
  const Impl::HostThreads threads = Impl::host_threads(options, group, shards, space);
  const auto setup = [&] {
    ::lather::Impl::fault_point("shampoo.construct");
    this->validate_parameters();  // the engine validates the options
    if (options.statistics_precision == linalg::Precision::float64)
      m_engine = std::make_unique<Impl::ShampooEngine<ExecutionSpace, Scalar, double>>(space, this->m_parameters,
                                                                                       options, group, shards, threads);
    else
      m_engine = std::make_unique<Impl::ShampooEngine<ExecutionSpace, Scalar, float>>(space, this->m_parameters,
                                                                                      options, group, shards, threads);
  };
  if (group.size() == 1 && shards.size() == 1) {
    setup();
    return;
  }
  // Parameters, options, plan and allocations may fail on one rank only (a rank given other
  // options or parameters, memory): the ranks of both groups agree on it, with the check that they
  // hold the same parameters and options, before any of them can reach a step's collective.
  const std::string local_error = ::lather::Impl::local_failure(nullptr, setup);
  Impl::agree_on_construction(group, shards, "Shampoo", this->m_parameters, describe(options), local_error);
  if (shards.size() > 1) m_engine->set_counted_pieces(Impl::counted_pieces(shards, this->m_parameters));
}

template <class ExecutionSpace, class Scalar>
Shampoo<ExecutionSpace, Scalar>::~Shampoo() = default;

template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& values,
                                              const Tensors& gradients) {
  m_engine->step(space, values, gradients);
}

template <class ExecutionSpace, class Scalar>
bool Shampoo<ExecutionSpace, Scalar>::overlap_exchange(const ExecutionSpace& space,
                                                       std::vector<std::pair<std::size_t, std::size_t>> layers) {
  return m_engine->overlap_exchange(space, std::move(layers));
}
template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) {
  m_engine->values_needed(space, first, last);
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
auto Shampoo<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace& space)
    -> std::vector<StateArray<memory_space>> {
  return m_engine->state_arrays(space);
}
template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::state_restored(const ExecutionSpace& space, long step_count) {
  m_engine->state_restored(space, step_count);
}
template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::state_released() {
  m_engine->state_released();
}
template <class ExecutionSpace, class Scalar>
bool Shampoo<ExecutionSpace, Scalar>::distributed() const {
  return m_engine->distributed();
}
template <class ExecutionSpace, class Scalar>
void Shampoo<ExecutionSpace, Scalar>::measure_phases(bool on) {
  m_engine->measure_phases(on);
}
template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, double>> Shampoo<ExecutionSpace, Scalar>::phase_seconds() const {
  return m_engine->phase_seconds();
}
template <class ExecutionSpace, class Scalar>
long Shampoo<ExecutionSpace, Scalar>::gemm_launches() const {
  return m_engine->gemm_launches();
}
template <class ExecutionSpace, class Scalar>
double Shampoo<ExecutionSpace, Scalar>::product_flops() const {
  return m_engine->product_flops();
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
std::vector<double> Shampoo<ExecutionSpace, Scalar>::statistic(const ExecutionSpace& space, int s) const {
  return m_engine->matrix(space, s, false);
}
template <class ExecutionSpace, class Scalar>
std::vector<double> Shampoo<ExecutionSpace, Scalar>::preconditioner(const ExecutionSpace& space, int s) const {
  return m_engine->matrix(space, s, true);
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> Shampoo<ExecutionSpace, Scalar>::describe() const {
  return describe(options());
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> Shampoo<ExecutionSpace, Scalar>::describe(
    const ShampooOptions& options) {
  std::vector<std::pair<std::string, std::string>> out = {{"optimizer", "shampoo"},
                                                          {"learning_rate_schedule", options.learning_rate.describe()}};
  for (const auto& name : option_names())
    if (name != "learning_rate") out.emplace_back(name, option_value(options, name));
  return out;
}

}  // namespace lather::optim
