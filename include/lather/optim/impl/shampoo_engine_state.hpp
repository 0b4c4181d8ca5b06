#pragma once
// ShampooEngine's state for checkpoints and its memory report. The file layout is the same for
// both step modes and every rank count: the global stacks of statistics and preconditioners
// [N, max, max] (each rank the rows it stores), per-statistic metadata and metrics [N] (each rank
// the statistics of its weight shard), and per-parameter state shaped like the parameter. A rank
// keeps its per-element state in the packed order of its units; state_arrays() spreads it into
// parameter-shaped arrays (distributed: summed over the group, each element held by one rank) and
// state_restored() packs them back. docs/reference/checkpoint-format.md lists the arrays.
// Included at the end of shampoo_engine.hpp.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/impl/shampoo_engine.hpp>

#include <functional>

namespace lather::optim::Impl {

template <class ExecutionSpace, class Scalar, class T>
StateMemoryReport ShampooEngine<ExecutionSpace, Scalar, T>::memory_report() const {
  StateMemoryReport r;
  const auto bytes = [](const auto& view) {
    return std::int64_t(view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type));
  };
  for (const Store* store : {m_statistics.get(), m_preconditioners.get()})
    (store->quantized() ? r.quantized_bytes : r.stack_bytes) += store->bytes();
  r.local_bytes = bytes(m_diagonal) + bytes(m_momentum) + bytes(m_diagonal_momentum);
  r.quantized_bytes += bytes(m_momentum_codes) + bytes(m_diagonal_momentum_codes) + bytes(m_scales[0]);
  r.workspace_bytes = bytes(m_packed) + bytes(m_packed_t) + bytes(m_direction) + bytes(m_distributor->buffer()) +
                      bytes(m_scales[1]) + m_roots->workspace_bytes() + m_products->workspace_bytes() +
                      (m_async_roots ? m_async_roots->workspace_bytes() : 0);
  for (const auto& v : m_state_scalars) r.workspace_bytes += bytes(v);
  for (const auto& v : m_state_codes) r.workspace_bytes += bytes(v);
  return r;
}

namespace ShampooState {

/// The table of this rank's units of one kind of state (int8 momentum or not), whose "packed"
/// column is where the unit starts in that kind's buffer (`diagonal`: every unit, packed order).
template <class ExecutionSpace>
UnitTable<typename ExecutionSpace::memory_space> state_table(const ExecutionSpace& space, const ShampooPlan& plan,
                                                             const StepPlan& step, int kind) {
  std::vector<int> units;
  std::vector<std::int64_t> at;
  std::int64_t floats = 0, codes = 0;
  for (int u : step.mine()) {
    const auto& unit = step.units[u];
    const bool quantized = plan.parameters[unit.parameter].quantized_momentum;
    std::int64_t& offset = quantized ? codes : floats;
    if (kind == 2 || (kind == 1) == quantized) {
      units.push_back(u);
      at.push_back(kind == 2 ? step.packed_offset[u] : offset);
    }
    offset += unit.elements;
  }
  return make_unit_table(space, plan, step, units, at, std::vector<std::int64_t>(units.size(), 0));
}

}  // namespace ShampooState

template <class ExecutionSpace, class Scalar, class T>
auto ShampooEngine<ExecutionSpace, Scalar, T>::state_arrays(const ExecutionSpace& space)
    -> std::vector<StateArray<memory_space>> {
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  const int rank = m_group.rank();
  std::vector<StateArray<memory_space>> arrays;
  const auto host_array = [&](const std::string& name, DType dtype, TensorShape shape, void* data,
                              std::int64_t elements) {
    StateArray<memory_space> a;
    a.name = name;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.writer = rank == 0;
    a.host_bytes = Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(static_cast<char*>(data),
                                                                     std::size_t(elements) * size_of(dtype));
    return a;
  };
  const std::int64_t n = m_plan.num_statistics();
  statistics_symmetric(space);
  m_step_host = m_step;
  arrays.push_back(step_array<memory_space>(m_step_host, rank == 0));
  if (n > 0) {
    // The stacks: the statistics this rank stores, by global row. Replicated stacks are written
    // by rank 0 alone; distributed, each rank writes its own rows.
    const auto& stored = m_step_plan.stored;
    const std::vector<std::int64_t> rows(stored.begin(), stored.end());
    std::vector<int> row_parameter;
    for (int s : stored) row_parameter.push_back(m_plan.statistic_owner[s]);
    for (const auto& [name, store] :
         {std::pair<const char*, Store*>{"global/statistics", m_statistics.get()},
          std::pair<const char*, Store*>{"global/preconditioners", m_preconditioners.get()}})
      for (const auto& part : store->arrays()) {
        StateArray<memory_space> a;
        a.name = name + part.suffix;
        a.dtype = part.dtype;
        a.shape = {n};
        a.shape.insert(a.shape.end(), part.slot_shape.begin(), part.slot_shape.end());
        a.rows = rows;
        a.row_parameter = row_parameter;
        a.writer = m_step_plan.distributed || rank == 0;
        a.stacked = true;  // rows are statistics, numbered over this optimizer's parameters
        // The stored slots; an unused slot (no statistic here) is not state.
        a.device_bytes = Kokkos::subview(
            part.bytes, std::make_pair(std::size_t(0), std::size_t(rows.size() * a.row_elements()) * size_of(a.dtype)));
        arrays.push_back(a);
      }
    // Per-statistic metadata and metrics, for the statistics of this rank's shard.
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
      a.stacked = true;
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

  // Per-element state, parameter-shaped: spread out of the packed buffers into full tensors
  // (zero where another rank's units are), then summed over the group when distributed.
  const std::size_t parameters = m_plan.parameters.size();
  m_state_scalars.assign(3 * parameters, V1<Scalar>());
  m_state_codes.assign(2 * parameters, V1<std::int8_t>());
  std::vector<std::function<void()>> sums;  // distributed: the sums over the group, run after the agreement
  const auto spread = [&](auto& full, std::size_t first, const auto& buffer, int kind,
                          const std::vector<char>& wanted) {
    using Value = typename std::decay_t<decltype(buffer)>::value_type;
    // One zeroed buffer holds the wanted tensors one after the other: one allreduce sums them all.
    std::size_t total = 0;
    for (std::size_t p = 0; p < parameters; ++p)
      if (wanted[p]) total += std::size_t(m_plan.parameters[p].elements);
    // Nothing of this kind (a graft without diagonal statistics): its table would still list
    // every unit, and the scatter would write through null tensors.
    if (total == 0) return;
    const V1<Value> all(Kokkos::view_alloc(space, "Lather::Shampoo::state"), total);
    std::vector<V1<Value>> tensors(parameters);
    for (std::size_t p = 0, offset = 0; p < parameters; ++p) {
      if (!wanted[p]) continue;
      const std::size_t n = std::size_t(m_plan.parameters[p].elements);
      full[first + p] = tensors[p] = Kokkos::subview(all, std::make_pair(offset, offset + n));
      offset += n;
    }
    PointerTable<Value, memory_space> pointers;
    pointers.update(space, tensors);
    const auto table = ShampooState::state_table(space, m_plan, m_step_plan, kind);
    scatter<ExecutionSpace, Value, Value, memory_space>(space, table, pointers.device(),
                                                        Kokkos::View<const Value*, memory_space>(buffer));
    if (m_step_plan.distributed)
      sums.push_back([this, space, all] { m_group.allreduce(space, all, comm::Combine::sum); });
  };
  // From the options, not from this rank's buffer: a rank that updates no unit (distributed)
  // holds an empty one, and must still join the sum.
  std::vector<char> diagonal(parameters, graft_has_diagonal_statistics(m_options.graft_type)), floats(parameters),
      codes(parameters);
  for (std::size_t p = 0; p < parameters; ++p)
    floats[p] = !m_plan.parameters[p].quantized_momentum, codes[p] = m_plan.parameters[p].quantized_momentum;
  // Every rank spreads its share first (allocations and copies that may fail), then all agree on
  // whether that worked, and only then are the shares summed: a rank that failed does not leave
  // the others waiting in the sums (nor the other weight shards in the checkpoint that follows).
  const std::string local_error = ::lather::Impl::local_failure("shampoo.state_gather", [&] {
    spread(m_state_scalars, 0, m_diagonal, 2, diagonal);
    spread(m_state_scalars, parameters, m_momentum, 0, floats);
    spread(m_state_scalars, 2 * parameters, m_diagonal_momentum, 0, floats);
    spread(m_state_codes, 0, m_momentum_codes, 1, codes);
    spread(m_state_codes, parameters, m_diagonal_momentum_codes, 1, codes);
  });
  agree_everywhere(local_error.empty() ? local_error : "Shampoo::state_arrays: " + local_error);
  for (const auto& sum : sums) sum();
  ::lather::Impl::fence(space, "Lather::Shampoo: parameter-shaped state ready");

  for (std::size_t p = 0; p < parameters; ++p) {
    const auto& pp = m_plan.parameters[p];
    const std::string prefix = "local/" + pp.spec.name + "/";
    const auto local = [&](const std::string& name, const auto& view, TensorShape shape) {
      if (view.size() == 0) return;
      using V = typename std::decay_t<decltype(view)>::value_type;
      StateArray<memory_space> a;
      a.name = prefix + name;
      a.dtype = dtype_of<V>();
      // The same on every rank of the group: shaped like the parameter, each writes a share of it;
      // otherwise (column scales) rank 0 writes it.
      a.parameter = shape == pp.spec.shape ? int(p) : -1;
      a.writer = a.parameter >= 0 || rank == 0;
      a.shape = std::move(shape);
      a.device_bytes = as_bytes<memory_space>(view, view.size());
      arrays.push_back(a);
    };
    local("diagonal_statistics", m_state_scalars[p], pp.spec.shape);
    if (pp.quantized_momentum) {
      const auto& s = m_parameter_scalars_host[p];
      const TensorShape columns(pp.spec.shape.begin() + 1, pp.spec.shape.end());
      const auto range = [&](std::int64_t base) {
        return V1<Scalar>(
            Kokkos::subview(m_scales[0], std::make_pair(std::size_t(base), std::size_t(base + s.columns))));
      };
      local("momentum/codes", m_state_codes[p], pp.spec.shape);
      local("momentum/scales", range(s.column_base), columns);
      local("diagonal_momentum/codes", m_state_codes[parameters + p], pp.spec.shape);
      local("diagonal_momentum/scales", range(m_quantized_columns + s.column_base), columns);
    } else {
      local("momentum", m_state_scalars[parameters + p], pp.spec.shape);
      local("diagonal_momentum", m_state_scalars[2 * parameters + p], pp.spec.shape);
    }
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar, class T>
void ShampooEngine<ExecutionSpace, Scalar, T>::state_restored(const ExecutionSpace& space, long step_count) {
  m_step = step_count;
  // Roots in flight belong to the state before the restore; the next preconditioning step starts
  // new ones (a resumed asynchronous run keeps the checkpoint's preconditioners one interval more).
  if (m_async_roots) m_async_roots->discard();
  const auto& local = m_plan.local_statistics;
  for (std::size_t k = 0; k < local.size() && k < m_errors_host.size(); ++k) {
    m_metrics[local[k]].error = m_errors_host[k];
    m_metrics[local[k]].consecutive_failures = m_failures_host[k];
  }
  // The parameter-shaped arrays the checkpoint filled, back into this rank's packed buffers.
  const std::size_t parameters = m_plan.parameters.size();
  const auto pack = [&](const auto& full, std::size_t first, const auto& buffer, int kind) {
    using Value = typename std::decay_t<decltype(buffer)>::value_type;
    if (buffer.extent(0) == 0) return;
    std::vector<V1<Value>> tensors(full.begin() + std::ptrdiff_t(first),
                                   full.begin() + std::ptrdiff_t(first + parameters));
    PointerTable<Value, memory_space> pointers;
    pointers.update(space, tensors);
    gather<ExecutionSpace, Value, Value, memory_space>(
        space, ShampooState::state_table(space, m_plan, m_step_plan, kind), pointers.device(), buffer);
  };
  if (m_state_scalars.size() == 3 * parameters) {
    pack(m_state_scalars, 0, m_diagonal, 2);
    pack(m_state_scalars, parameters, m_momentum, 0);
    pack(m_state_scalars, 2 * parameters, m_diagonal_momentum, 0);
    pack(m_state_codes, 0, m_momentum_codes, 1);
    pack(m_state_codes, parameters, m_diagonal_momentum_codes, 1);
  }
  ::lather::Impl::fence(space, "Lather::Shampoo: state restored");
  state_released();
}

template <class ExecutionSpace, class Scalar, class T>
void ShampooEngine<ExecutionSpace, Scalar, T>::state_released() {
  // The parameter-shaped copies are not needed between checkpoints.
  m_state_scalars.clear();
  m_state_codes.clear();
}

}  // namespace lather::optim::Impl
