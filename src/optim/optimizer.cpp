#include <lather/optim/optimizer.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <cstdio>
#include <set>

namespace lather::optim {

std::string StateMemoryReport::to_string() const {
  char line[256];
  const double mib = 1024.0 * 1024.0;
  std::snprintf(line, sizeof line, "optimizer state %.2f MiB (stacks %.2f, local %.2f, quantized %.2f, workspace %.2f)",
                total() / mib, stack_bytes / mib, local_bytes / mib, quantized_bytes / mib, workspace_bytes / mib);
  return line;
}

template <class ExecutionSpace, class Scalar>
Optimizer<ExecutionSpace, Scalar>::Optimizer(std::vector<ParameterSpec> parameters)
    : m_parameters(std::move(parameters)) {
  validate_parameters();
}

template <class ExecutionSpace, class Scalar>
void Optimizer<ExecutionSpace, Scalar>::validate_parameters() const {
  std::set<std::string> names;
  for (std::size_t p = 0; p < m_parameters.size(); ++p) {
    const auto& spec = m_parameters[p];
    LATHER_REQUIRE(!spec.name.empty(), "parameter ", p, " has no name");
    spec.validate();
    LATHER_REQUIRE(names.insert(spec.name).second, "parameter name '", spec.name, "' is used twice");
  }
}

template <class ExecutionSpace, class Scalar>
void Optimizer<ExecutionSpace, Scalar>::check_arguments(const Tensors& params, const Tensors& grads) const {
  LATHER_REQUIRE(params.size() == m_parameters.size(), name(), "::step: got ", params.size(),
                 " parameters, the optimizer was built for ", m_parameters.size());
  LATHER_REQUIRE(grads.size() == m_parameters.size(), name(), "::step: got ", grads.size(),
                 " gradients, the optimizer was built for ", m_parameters.size());
  for (std::size_t p = 0; p < m_parameters.size(); ++p) {
    const auto expected = element_count(m_parameters[p].shape);
    LATHER_REQUIRE(std::int64_t(params[p].size()) == expected, name(), "::step: parameter '", m_parameters[p].name,
                   "' has ", params[p].size(), " elements, expected ", expected, " for shape ",
                   lather::to_string(m_parameters[p].shape));
    LATHER_REQUIRE(std::int64_t(grads[p].size()) == expected, name(), "::step: gradient of '", m_parameters[p].name,
                   "' has ", grads[p].size(), " elements, expected ", expected);
    LATHER_REQUIRE(params[p].data() != grads[p].data(), name(), "::step: parameter '", m_parameters[p].name,
                   "' and its gradient share memory");
  }
}

template class Optimizer<DefaultExecutionSpace, float>;
template class Optimizer<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class Optimizer<DefaultHostExecutionSpace, float>;
template class Optimizer<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::optim
