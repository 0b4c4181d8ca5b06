#pragma once
// Part of the implementation of Soap (included by <lather/optim/impl/soap_impl.hpp> only): the
// memory report and the checkpoint state, gathered from every rank's share into the layout of
// the replicated optimizer and taken back from it. Float and quantized state take one path: each
// is a list of kinds (state_kinds()), arrays of bytes whose per-block pieces for_each_piece finds.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/impl/soap_impl.hpp>

namespace lather::optim {

namespace Impl {

/// One array of the checkpoint state: its name under "soap/<parameter>/", which pieces of a
/// block it holds (Soap::for_each_piece), its element type and this rank's buffer.
struct SoapStateKind {
  /// Per block: the quantized exp_avg (int8 codes, or float for blocks of rank 1, and per-column
  /// scales), a packed block (exp_avg_sq; exp_avg unquantized), one n x n matrix or one length-n
  /// vector per factored dimension.
  using Piece = SoapStatePiece;
  std::string name;
  Piece piece = Piece::packed;
  DType dtype = DType::float32;
  std::size_t bytes = 0;             // per element
  char* local = nullptr;             // this rank's buffer
  std::vector<std::int64_t> counts;  // elements per rank
  std::int64_t total = 0;            // elements in the checkpoint layout
};

}  // namespace Impl

template <class ExecutionSpace, class Scalar>
StateMemoryReport Soap<ExecutionSpace, Scalar>::memory_report() const {
  if (quantized()) return quantized_memory_report();
  StateMemoryReport r;
  const auto bytes = [](const auto& b) {
    return std::int64_t(b.size() * sizeof(typename std::decay_t<decltype(b)>::value_type));
  };
  r.local_bytes = bytes(m_exp_avg) + bytes(m_exp_avg_sq);
  r.stack_bytes = bytes(m_factors) + bytes(m_bases);
  r.workspace_bytes = bytes(m_gradient) + bytes(m_update) + bytes(m_scratch_a) + bytes(m_block_sums) +
                      bytes(m_distributor->buffer()) + bytes(m_state_full) + bytes(m_state_gathered) + bytes(m_rounded);
  return r;
}

template <class ExecutionSpace, class Scalar>
std::vector<Impl::SoapStateKind> Soap<ExecutionSpace, Scalar>::state_kinds() {
  using Piece = Impl::SoapStateKind::Piece;
  const std::int64_t P = m_packed_total, F = m_factor_total, D = m_diagonal_total;
  const DType real = dtype_of<Scalar>();
  const auto kind = [](std::string name, Piece piece, DType dtype, std::size_t bytes, void* local,
                       const std::vector<std::int64_t>& counts, std::int64_t total) {
    return Impl::SoapStateKind{std::move(name), piece, dtype, bytes, static_cast<char*>(local), counts, total};
  };
  const std::size_t s = sizeof(Scalar);
  if (!quantized())
    return {kind("exp_avg", Piece::packed, real, s, m_exp_avg.data(), m_local_packed, P),
            kind("exp_avg_sq", Piece::packed, real, s, m_exp_avg_sq.data(), m_local_packed, P),
            kind("factors", Piece::matrix, real, s, m_factors.data(), m_local_factors, F),
            kind("bases", Piece::matrix, real, s, m_bases.data(), m_local_factors, F)};
  return {kind("exp_avg/codes", Piece::avg_codes, DType::int8, 1, m_avg_codes.data(), m_local_avg_codes, P),
          kind("exp_avg", Piece::avg_floats, real, s, m_exp_avg.data(), m_local_avg_floats, P),
          kind("exp_avg/scales", Piece::avg_scales, real, s, m_avg_scales.data(), m_local_avg_scales, m_column_total),
          kind("exp_avg_sq", Piece::packed, real, s, m_exp_avg_sq.data(), m_local_packed, P),
          kind("factors/codes", Piece::matrix, DType::int16, 2, m_factor_codes.data(), m_local_factors, F),
          kind("factors/diagonal", Piece::diagonal, real, s, m_factor_diagonal.data(), m_local_diagonal, D),
          kind("factors/scales", Piece::diagonal, real, s, m_factor_scales.data(), m_local_diagonal, D),
          kind("bases/codes", Piece::matrix, DType::int16, 2, m_basis_codes.data(), m_local_factors, F),
          kind("bases/scales", Piece::diagonal, real, s, m_basis_scales.data(), m_local_diagonal, D)};
}

template <class ExecutionSpace, class Scalar>
template <class F>
void Soap<ExecutionSpace, Scalar>::for_each_piece(std::size_t k, Impl::SoapStatePiece piece, F&& f) const {
  using Piece = Impl::SoapStateKind::Piece;
  const BlockInfo& b = m_blocks[k];
  const bool codes = b.avg_columns > 0;
  switch (piece) {
    case Piece::avg_codes:
      if (codes) f(b.avg_local, b.packed, b.block.elements());
      return;
    case Piece::avg_floats:
      if (!codes) f(b.avg_local, b.packed, b.block.elements());
      return;
    case Piece::avg_scales:
      if (codes) f(b.local_avg_scales, b.avg_scales, b.avg_columns);
      return;
    case Piece::packed:
      f(b.local, b.packed, b.block.elements());
      return;
    case Piece::matrix:
    case Piece::diagonal:
      break;
  }
  for (std::size_t d = 0; d < b.factor.size(); ++d) {
    if (b.factor[d] < 0) continue;
    const std::int64_t n = b.block.size[d];
    if (piece == Piece::matrix)
      f(b.local_factor[d], b.factor[d], n * n);
    else
      f(b.local_diagonal[d], b.diagonal[d], n);
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::copy_state(const ExecutionSpace& space, bool to_full) {
  // Between the checkpoint layout in m_state_full (kind after kind, each in the replicated
  // optimizer's block order) and this rank's buffers or (to_full, distributed) every rank's share
  // as gathered in m_state_gathered (rank after rank, each kind after kind).
  using Bytes = Kokkos::View<char*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const auto kinds = state_kinds();
  const std::size_t ranks = m_local_packed.size();
  std::vector<std::int64_t> full(1, 0);
  for (const auto& kind : kinds) full.push_back(full.back() + kind.total * std::int64_t(kind.bytes));
  std::vector<std::vector<std::int64_t>> at(ranks);  // per rank: each kind's start in m_state_gathered
  std::int64_t cursor = 0;
  for (std::size_t r = 0; r < ranks; ++r)
    for (const auto& kind : kinds) {
      at[r].push_back(cursor);
      cursor += kind.counts[r] * std::int64_t(kind.bytes);
    }
  const bool gathered = to_full && distributed();
  for (std::size_t k = 0; k < m_blocks.size(); ++k) {
    if (!gathered && m_blocks[k].owner != m_group.rank()) continue;
    const auto r = std::size_t(m_blocks[k].owner);
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const auto size = std::int64_t(kinds[i].bytes);
      char* local = gathered ? m_state_gathered.data() + at[r][i] : kinds[i].local;
      for_each_piece(k, kinds[i].piece, [&](std::int64_t local_start, std::int64_t full_start, std::int64_t n) {
        const Bytes l(local + local_start * size, std::size_t(n * size));
        const Bytes f(m_state_full.data() + full[i] + full_start * size, std::size_t(n * size));
        if (to_full)
          Kokkos::deep_copy(space, f, l);
        else
          Kokkos::deep_copy(space, l, f);
      });
    }
  }
  ::lather::Impl::fence(space, "Lather::soap: state copied");
}

template <class ExecutionSpace, class Scalar>
auto Soap<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace& space) -> std::vector<StateArray<memory_space>> {
  using Piece = Impl::SoapStateKind::Piece;
  using Bytes = Kokkos::View<char*, memory_space>;
  // Each rank's arrays hold the blocks of its pieces, block after block: a weight shard's blocks
  // are not a range of the whole tensor's, so its arrays would overwrite the other shards'.
  LATHER_REQUIRE(m_slice_name.empty(), "Soap::state_arrays: parameter '", m_slice_name,
                 "' is a weight shard's slice; SOAP's state with weight shards cannot be checkpointed yet");
  const int rank = m_group.rank();
  const auto kinds = state_kinds();
  std::int64_t full = 0;
  std::vector<std::size_t> counts(m_local_packed.size(), 0), segment(1, 0);  // bytes per rank
  for (const auto& kind : kinds) {
    full += kind.total * std::int64_t(kind.bytes);
    for (std::size_t r = 0; r < counts.size(); ++r) counts[r] += std::size_t(kind.counts[r]) * kind.bytes;
  }
  for (std::size_t c : counts) segment.push_back(segment.back() + c);
  const auto prepare = [&] {
    if (!m_state_full.data())
      m_state_full = Bytes(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::soap::state_full"),
                           std::size_t(std::max<std::int64_t>(full, 1)));
    if (distributed() && !m_state_gathered.data())
      m_state_gathered = Bytes(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::soap::state_gathered"),
                               std::max<std::size_t>(segment.back(), 1));
  };
  if (!distributed()) {
    prepare();
  } else {
    // Every rank's share to every rank: one all-gather of its buffers, back to back.
    m_group.run_agreed("Soap::state_arrays", [&] {
      ::lather::Impl::fault_point("soap.state_gather");
      prepare();
    });
    using Flat = Kokkos::View<char*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    char* mine = m_state_gathered.data() + segment[std::size_t(rank)];
    for (const auto& kind : kinds) {
      const std::size_t n = std::size_t(kind.counts[std::size_t(rank)]) * kind.bytes;
      Kokkos::deep_copy(space, Flat(mine, n), Flat(kind.local, n));
      mine += n;
    }
    m_group.allgatherv(space,
                       Kokkos::View<const char*, memory_space>(m_state_gathered.data() + segment[std::size_t(rank)],
                                                               counts[std::size_t(rank)]),
                       m_state_gathered, counts);
  }
  copy_state(space, true);
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  arrays.push_back(step_array<memory_space>(m_step_host, rank == 0));
  std::int64_t base = 0;
  std::vector<std::int64_t> bases;
  for (const auto& kind : kinds) {
    bases.push_back(base);
    base += kind.total * std::int64_t(kind.bytes);
  }
  for (std::size_t p = 0; p < this->m_parameters.size(); ++p) {
    // Quantized, a parameter's exp_avg is int8 codes with scales or float, by its blocks' rank.
    const auto [first, end] = m_parameter_blocks[p];
    const bool codes = first < end && m_blocks[first].avg_columns > 0;
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const Piece piece = kinds[i].piece;
      if ((piece == Piece::avg_codes || piece == Piece::avg_scales) && !codes) continue;
      if (piece == Piece::avg_floats && codes) continue;
      const auto range = piece == Piece::avg_scales ? m_parameter_columns[p]
                         : piece == Piece::matrix   ? m_parameter_factors[p]
                         : piece == Piece::diagonal ? m_parameter_diagonal[p]
                                                    : m_parameter_packed[p];
      if (range.second == range.first) continue;
      const auto size = std::int64_t(kinds[i].bytes);
      StateArray<memory_space> a;
      a.name = "soap/" + this->m_parameters[p].name + "/" + kinds[i].name;
      a.dtype = kinds[i].dtype;
      a.shape = {range.second - range.first};
      a.writer = rank == 0;
      const std::pair<std::int64_t, std::int64_t> bytes(bases[i] + range.first * size, bases[i] + range.second * size);
      a.device_bytes =
          as_bytes<memory_space>(Kokkos::subview(m_state_full, bytes), std::size_t(bytes.second - bytes.first));
      arrays.push_back(a);
    }
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::state_restored(const ExecutionSpace& space, long step_count) {
  m_step = step_count;
  // The arrays of the last state_arrays() were filled: this rank's share back from them.
  if (m_state_full.data()) copy_state(space, false);
  state_released();
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::state_released() {
  m_state_full = {};
  m_state_gathered = {};
}

}  // namespace lather::optim
