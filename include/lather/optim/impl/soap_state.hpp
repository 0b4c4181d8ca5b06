#pragma once
// Part of the implementation of Soap (included by <lather/optim/impl/soap_impl.hpp> only): the
// memory report and the checkpoint state, gathered from every rank's share into the layout of
// the replicated optimizer and taken back from it.

#include <lather/optim/impl/soap_impl.hpp>

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
StateMemoryReport Soap<ExecutionSpace, Scalar>::memory_report() const {
  if (quantized()) return quantized_memory_report();
  StateMemoryReport r;
  const auto bytes = [](const auto& b) { return std::int64_t(b.size() * sizeof(typename std::decay_t<decltype(b)>::value_type)); };
  r.local_bytes = bytes(m_exp_avg) + bytes(m_exp_avg_sq);
  r.stack_bytes = bytes(m_factors) + bytes(m_bases);
  r.workspace_bytes = bytes(m_gradient) + bytes(m_update) + bytes(m_scratch_a) + bytes(m_block_sums) +
                      bytes(m_gathered) + bytes(m_full) + bytes(m_state_gathered);
  return r;
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::copy_state(const ExecutionSpace& space, bool to_full) {
  // Between the checkpoint layout in m_full (exp_avg [0, P), exp_avg_sq [P, 2P), factors
  // [2P, 2P + F), bases [2P + F, 2P + 2F), block after block as the replicated optimizer kept
  // them) and the owners' local layouts: this rank's buffers, or (to_full, distributed) every
  // rank's share as gathered into m_state_gathered.
  using Flat = Kokkos::View<Scalar*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int rank = m_group.rank();
  const std::int64_t P = m_packed_total, F = m_factor_total;
  std::vector<std::int64_t> state_segment(1, 0);
  for (std::size_t r = 0; r < m_local_packed.size(); ++r)
    state_segment.push_back(state_segment.back() + 2 * (m_local_packed[r] + m_local_factors[r]));
  for (const auto& b : m_blocks) {
    const bool gathered = to_full && distributed();
    if (!gathered && b.owner != rank) continue;
    const auto r = std::size_t(b.owner);
    const std::int64_t L = m_local_packed[r], LF = m_local_factors[r];
    Scalar* base = gathered ? m_state_gathered.data() + state_segment[r] : nullptr;
    Scalar* exp_avg = gathered ? base : m_exp_avg.data();
    Scalar* exp_avg_sq = gathered ? base + L : m_exp_avg_sq.data();
    Scalar* factors = gathered ? base + 2 * L : m_factors.data();
    Scalar* bases = gathered ? base + 2 * L + LF : m_bases.data();
    const auto copy = [&](Scalar* local, std::int64_t full, std::int64_t n) {
      const Flat l(local, std::size_t(n)), f(m_full.data() + full, std::size_t(n));
      if (to_full)
        Kokkos::deep_copy(space, f, l);
      else
        Kokkos::deep_copy(space, l, f);
    };
    const std::int64_t elements = b.block.elements();
    copy(exp_avg + b.local, b.packed, elements);
    copy(exp_avg_sq + b.local, P + b.packed, elements);
    for (std::size_t d = 0; d < b.factor.size(); ++d) {
      if (b.factor[d] < 0) continue;
      const std::int64_t nn = b.block.size[d] * b.block.size[d];
      copy(factors + b.local_factor[d], 2 * P + b.factor[d], nn);
      copy(bases + b.local_factor[d], 2 * P + F + b.factor[d], nn);
    }
  }
  ::lather::Impl::fence(space, "Lather::soap: state copied");
}

template <class ExecutionSpace, class Scalar>
auto Soap<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace& space) -> std::vector<StateArray<memory_space>> {
  if (quantized()) return quantized_state_arrays(space);
  const int rank = m_group.rank();
  const std::int64_t P = m_packed_total, F = m_factor_total;
  const auto prepare = [&] {
    if (!m_full.data())
      m_full = Buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::soap::state_full"),
                      std::size_t(std::max<std::int64_t>(2 * (P + F), 1)));
    if (!distributed()) return;
    std::int64_t total = 0;
    for (std::size_t r = 0; r < m_local_packed.size(); ++r) total += 2 * (m_local_packed[r] + m_local_factors[r]);
    if (!m_state_gathered.data())
      m_state_gathered = Buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::soap::state_gathered"),
                                std::size_t(std::max<std::int64_t>(total, 1)));
  };
  if (!distributed()) {
    prepare();
  } else {
    // Every rank's share to every rank: one all-gather of the four local buffers, back to back.
    m_group.run_agreed("Soap::state_arrays", [&] {
      ::lather::Impl::fault_point("soap.state_gather");
      prepare();
    });
    using Flat = Kokkos::View<Scalar*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    std::vector<std::size_t> counts, segment(1, 0);
    for (std::size_t r = 0; r < m_local_packed.size(); ++r) {
      counts.push_back(std::size_t(2 * (m_local_packed[r] + m_local_factors[r])));
      segment.push_back(segment.back() + counts.back());
    }
    Scalar* mine = m_state_gathered.data() + segment[std::size_t(rank)];
    std::int64_t at = 0;
    for (const Buffer* b : {&m_exp_avg, &m_exp_avg_sq, &m_factors, &m_bases}) {
      Kokkos::deep_copy(space, Flat(mine + at, b->size()), *b);
      at += std::int64_t(b->size());
    }
    m_group.allgatherv(space, Kokkos::View<const Scalar*, memory_space>(mine, counts[std::size_t(rank)]),
                       m_state_gathered, counts);
  }
  copy_state(space, true);
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  arrays.push_back(step_array<memory_space>(m_step_host, rank == 0));
  const auto add = [&](std::size_t p, const char* what, std::int64_t base, std::pair<std::int64_t, std::int64_t> range) {
    if (range.second == range.first) return;
    StateArray<memory_space> a;
    a.name = "soap/" + this->m_parameters[p].name + "/" + what;
    a.dtype = dtype_of<Scalar>();
    a.shape = {range.second - range.first};
    a.writer = rank == 0;
    const std::pair<std::int64_t, std::int64_t> in_full(base + range.first, base + range.second);
    a.device_bytes = as_bytes<memory_space>(Kokkos::subview(m_full, in_full), std::size_t(range.second - range.first));
    arrays.push_back(a);
  };
  for (std::size_t p = 0; p < this->m_parameters.size(); ++p) {
    add(p, "exp_avg", 0, m_parameter_packed[p]);
    add(p, "exp_avg_sq", P, m_parameter_packed[p]);
    add(p, "factors", 2 * P, m_parameter_factors[p]);
    add(p, "bases", 2 * P + F, m_parameter_factors[p]);
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::state_restored(const ExecutionSpace& space, long step_count) {
  m_step = step_count;
  // The arrays of the last state_arrays() were filled: this rank's share back from them.
  if (m_full.data()) copy_state(space, false);
  if (m_q_full.data()) copy_quantized_state(space, false);
  state_released();
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::state_released() {
  m_full = Buffer();
  m_state_gathered = Buffer();
  m_q_full = {};
  m_q_gathered = {};
}

}  // namespace lather::optim
