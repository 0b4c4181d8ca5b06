#pragma once
// Shampoo's checkpoint state, in the reference's sharded layout: the global stacks of statistics
// and preconditioners [N, max, max] (each rank the rows it stores), per-statistic metadata and
// metrics [N] (each rank the statistics of its weight shard), and per-parameter state shaped like
// the parameter. docs/reference/checkpoint-format.md lists the arrays.
//
// Included at the end of shampoo_engine.hpp: the definition of ShampooEngine::state_arrays().

#include <lather/optim/impl/shampoo_engine.hpp>

namespace lather::optim::Impl {

template <class ExecutionSpace, class Scalar, class T>
std::vector<StateArray<typename ExecutionSpace::memory_space>> ShampooEngine<ExecutionSpace, Scalar, T>::state_arrays() {
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  std::vector<StateArray<memory_space>> arrays;
  const auto host_array = [&](const std::string& name, DType dtype, TensorShape shape, void* data,
                              std::int64_t elements) {
    StateArray<memory_space> a;
    a.name = name;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.writer = m_rank == 0;
    a.host_bytes = Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(static_cast<char*>(data),
                                                                      std::size_t(elements) * size_of(dtype));
    return a;
  };
  const std::int64_t n = m_plan.num_statistics();
  m_step_host = m_step;
  arrays.push_back(host_array("step", DType::int64, {}, &m_step_host, 1));
  if (n > 0) {
    // Global stacks: the statistics this rank stores, by global row; replicated stacks are
    // written by rank 0 alone.
    std::vector<std::int64_t> rows;
    if (m_sharded || !m_plan.all_local()) rows.assign(m_stored.begin(), m_stored.end());
    std::vector<int> row_parameter;
    for (auto r : rows) row_parameter.push_back(m_plan.statistic_owner[r]);
    const std::int64_t local_rows = std::int64_t(m_stored.size());
    for (const auto& [name, store] : {std::pair<const char*, Store*>{"global/statistics", m_statistics.get()},
                                      std::pair<const char*, Store*>{"global/preconditioners", m_preconditioners.get()}})
      for (const auto& part : store->arrays()) {
        StateArray<memory_space> a;
        a.name = name + part.suffix;
        a.dtype = part.dtype;
        a.shape = {n};
        a.shape.insert(a.shape.end(), part.slot_shape.begin(), part.slot_shape.end());
        a.rows = rows;
        a.row_parameter = row_parameter;
        a.writer = m_sharded || m_rank == 0;
        // The stored slots come first; padding slots are not state.
        a.device_bytes = Kokkos::subview(
            part.bytes, std::make_pair(std::size_t(0), std::size_t(local_rows * a.row_elements()) * size_of(a.dtype)));
        arrays.push_back(a);
      }
    // Per-statistic metadata and metrics, for the statistics of this rank's blocks.
    const auto& local = m_plan.local_statistics;
    m_exponents_host.clear();
    m_errors_host.clear();
    m_failures_host.clear();
    for (int s : local) {
      m_exponents_host.push_back(m_plan.statistic_exponent[s]);
      m_errors_host.push_back(m_metrics[s].error);
      m_failures_host.push_back(m_metrics[s].consecutive_failures);
    }
    const auto per_statistic = [&](const std::string& name, DType dtype, void* data) {
      auto a = host_array(name, dtype, {n}, data, std::int64_t(local.size()));
      if (!m_plan.all_local()) {
        a.rows.assign(local.begin(), local.end());
        for (int s : local) a.row_parameter.push_back(m_plan.statistic_owner[s]);
      }
      arrays.push_back(a);
    };
    per_statistic("global/exponents", DType::int32, m_exponents_host.data());
    per_statistic("global/inverse_root_errors", DType::float64, m_errors_host.data());
    per_statistic("global/consecutive_failures", DType::int32, m_failures_host.data());
  }
  for (std::size_t p = 0; p < m_plan.parameters.size(); ++p) {
    const auto& pp = m_plan.parameters[p];
    auto& l = m_local[p];
    const std::string prefix = "local/" + pp.spec.name + "/";
    const auto local = [&](const std::string& name, auto& view, TensorShape shape) {
      if (view.size() == 0) return;
      const bool elementwise = shape == pp.spec.shape;
      using V = typename std::decay_t<decltype(view)>::value_type;
      StateArray<memory_space> a;
      a.name = prefix + name;
      a.dtype = dtype_of<V>();
      a.shape = std::move(shape);
      a.writer = m_rank == 0;  // replicated across the group
      a.parameter = elementwise ? int(p) : -1;
      a.device_bytes = as_bytes<memory_space>(view, view.size());
      arrays.push_back(a);
    };
    local("diagonal_statistics", l.diagonal, pp.spec.shape);
    if (pp.quantized_momentum) {
      const TensorShape columns(pp.spec.shape.begin() + 1, pp.spec.shape.end());
      local("momentum/codes", l.momentum_codes, pp.spec.shape);
      local("momentum/scales", l.momentum_scales, columns);
      local("diagonal_momentum/codes", l.diagonal_momentum_codes, pp.spec.shape);
      local("diagonal_momentum/scales", l.diagonal_momentum_scales, columns);
    } else {
      local("momentum", l.momentum, pp.spec.shape);
      local("diagonal_momentum", l.diagonal_momentum, pp.spec.shape);
    }
  }
  return arrays;
}

}  // namespace lather::optim::Impl
