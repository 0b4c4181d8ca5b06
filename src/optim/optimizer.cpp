#include <lather/optim/optimizer.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <cstdio>
#include <set>

namespace lather::optim {

std::string StateMemoryReport::to_string() const {
  char line[256];
  const double mib = 1024.0 * 1024.0;
  std::snprintf(line, sizeof line,
                "optimizer state %.2f MiB (stacks %.2f, local %.2f, quantized %.2f, workspace %.2f)",
                total() / mib, stack_bytes / mib, local_bytes / mib, quantized_bytes / mib,
                workspace_bytes / mib);
  return line;
}

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int8: return "int8";
    case DType::int16: return "int16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
  }
  return "unknown";
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::int8: return 1;
    case DType::int16: return 2;
    case DType::int32: return 4;
    case DType::int64: return 8;
  }
  return 0;
}

void ParameterSpec::validate() const {
  LATHER_REQUIRE(!name.empty(), "a parameter has no name");
  LATHER_REQUIRE(element_count(shape) > 0, "parameter '", name, "' has shape ", lather::to_string(shape),
                 " with no elements");
  if (split_axis < 0) {
    LATHER_REQUIRE(global_shape.empty() || global_shape == shape, "parameter '", name, "' has global shape ",
                   lather::to_string(global_shape), " but is not split (shape ", lather::to_string(shape), ")");
    return;
  }
  LATHER_REQUIRE(split_axis < int(shape.size()), "parameter '", name, "': split_axis ", split_axis,
                 " out of range for shape ", lather::to_string(shape));
  LATHER_REQUIRE(global_shape.size() == shape.size(), "parameter '", name, "': global shape ",
                 lather::to_string(global_shape), " and local shape ", lather::to_string(shape),
                 " differ in rank");
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (int(d) != split_axis)
      LATHER_REQUIRE(global_shape[d] == shape[d], "parameter '", name, "': dimension ", d, " of the local shape ",
                     lather::to_string(shape), " differs from the global shape ", lather::to_string(global_shape));
  LATHER_REQUIRE(split_offset >= 0 && split_offset + shape[split_axis] <= global_shape[split_axis],
                 "parameter '", name, "': slice [", split_offset, ", ", split_offset + shape[split_axis],
                 ") outside dimension ", split_axis, " of extent ", global_shape[split_axis]);
}

template <class MemorySpace>
std::int64_t StateArray<MemorySpace>::row_elements() const {
  std::int64_t n = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

template <class MemorySpace>
std::int64_t StateArray<MemorySpace>::local_elements() const {
  if (rows.empty()) return element_count(shape);
  return std::int64_t(rows.size()) * row_elements();
}

template <class ExecutionSpace, class Scalar>
Optimizer<ExecutionSpace, Scalar>::Optimizer(const ExecutionSpace& space, std::vector<ParameterSpec> parameters)
    : m_space(space), m_parameters(std::move(parameters)) {
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
    LATHER_REQUIRE(std::int64_t(params[p].size()) == expected, name(), "::step: parameter '",
                   m_parameters[p].name, "' has ", params[p].size(), " elements, expected ", expected,
                   " for shape ", lather::to_string(m_parameters[p].shape));
    LATHER_REQUIRE(std::int64_t(grads[p].size()) == expected, name(), "::step: gradient of '",
                   m_parameters[p].name, "' has ", grads[p].size(), " elements, expected ", expected);
    LATHER_REQUIRE(params[p].data() != grads[p].data(), name(), "::step: parameter '",
                   m_parameters[p].name, "' and its gradient share memory");
  }
}

template struct StateArray<DefaultExecutionSpace::memory_space>;
template class Optimizer<DefaultExecutionSpace, float>;
template class Optimizer<DefaultExecutionSpace, double>;

}  // namespace lather::optim
