#pragma once
// Part of the implementation of Soap (included by <lather/optim/impl/soap_impl.hpp> only): the
// memory report and the checkpoint state, gathered from every rank's share into the checkpoint's
// layout and taken back from it. Float and quantized state take one path: each is a list of kinds
// (state_kinds()), arrays of bytes whose per-block pieces for_each_piece finds.
//
// The checkpoint's arrays are indexed by the whole tensor's blocks as SOAP reads it (its merged
// shape, with a weight shard's split axis kept apart: soap_reading.hpp), one row per block, each
// row as long as the longest block's state of that kind (the rest zero): a piece's blocks are then
// a list of rows of the whole tensor's arrays, whatever the piece (a slice's blocks are not a
// range of them), and the pieces' rows assemble the whole tensor's state on any layout that reads
// it alike. A "blocks" array records that reading, so that a layout reading it otherwise refuses
// the state instead of misplacing it.

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
  std::int64_t total = 0;            // elements of this rank's rows of the checkpoint layout
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
std::vector<std::int64_t> Soap<ExecutionSpace, Scalar>::state_row_starts(Impl::SoapStatePiece piece) const {
  // Parameter after parameter, the rows of the blocks this rank holds, in block order.
  std::vector<std::int64_t> starts(1, 0);
  for (std::size_t p = 0; p < m_parameter_blocks.size(); ++p) {
    const auto held = std::int64_t(m_parameter_blocks[p].second - m_parameter_blocks[p].first);
    starts.push_back(starts.back() + held * m_row_lengths[p][std::size_t(piece)]);
  }
  return starts;
}

template <class ExecutionSpace, class Scalar>
std::vector<std::int64_t> Soap<ExecutionSpace, Scalar>::block_table(std::size_t p) const {
  // Per block of the whole tensor's reading: its offset, then its size, in each dimension.
  std::vector<std::int64_t> table;
  for (const auto& block : m_partitions[p].blocks()) {
    if (block.elements() == 0) continue;
    table.insert(table.end(), block.offset.begin(), block.offset.end());
    table.insert(table.end(), block.size.begin(), block.size.end());
  }
  return table;
}

template <class ExecutionSpace, class Scalar>
std::vector<Impl::SoapStateKind> Soap<ExecutionSpace, Scalar>::state_kinds() {
  using Piece = Impl::SoapStateKind::Piece;
  const DType real = dtype_of<Scalar>();
  const auto kind = [&](std::string name, Piece piece, DType dtype, std::size_t bytes, void* local,
                        const std::vector<std::int64_t>& counts) {
    return Impl::SoapStateKind{
        std::move(name), piece, dtype, bytes, static_cast<char*>(local), counts, state_row_starts(piece).back()};
  };
  const std::size_t s = sizeof(Scalar);
  if (!quantized())
    return {kind("exp_avg", Piece::packed, real, s, m_exp_avg.data(), m_local_packed),
            kind("exp_avg_sq", Piece::packed, real, s, m_exp_avg_sq.data(), m_local_packed),
            kind("factors", Piece::matrix, real, s, m_factors.data(), m_local_factors),
            kind("bases", Piece::matrix, real, s, m_bases.data(), m_local_factors)};
  return {kind("exp_avg/codes", Piece::avg_codes, DType::int8, 1, m_avg_codes.data(), m_local_avg_codes),
          kind("exp_avg", Piece::avg_floats, real, s, m_exp_avg.data(), m_local_avg_floats),
          kind("exp_avg/scales", Piece::avg_scales, real, s, m_avg_scales.data(), m_local_avg_scales),
          kind("exp_avg_sq", Piece::packed, real, s, m_exp_avg_sq.data(), m_local_packed),
          kind("factors/codes", Piece::matrix, DType::int16, 2, m_factor_codes.data(), m_local_factors),
          kind("factors/diagonal", Piece::diagonal, real, s, m_factor_diagonal.data(), m_local_diagonal),
          kind("factors/scales", Piece::diagonal, real, s, m_factor_scales.data(), m_local_diagonal),
          kind("bases/codes", Piece::matrix, DType::int16, 2, m_basis_codes.data(), m_local_factors),
          kind("bases/scales", Piece::diagonal, real, s, m_basis_scales.data(), m_local_diagonal)};
}

template <class ExecutionSpace, class Scalar>
template <class F>
void Soap<ExecutionSpace, Scalar>::for_each_piece(std::size_t k, Impl::SoapStatePiece piece, F&& f) const {
  using Piece = Impl::SoapStateKind::Piece;
  const BlockInfo& b = m_blocks[k];
  const bool codes = b.avg_columns > 0;
  switch (piece) {
    case Piece::avg_codes:
      if (codes) f(b.avg_local, b.block.elements());
      return;
    case Piece::avg_floats:
      if (!codes) f(b.avg_local, b.block.elements());
      return;
    case Piece::avg_scales:
      if (codes) f(b.local_avg_scales, b.avg_columns);
      return;
    case Piece::packed:
      f(b.local, b.block.elements());
      return;
    case Piece::matrix:
    case Piece::diagonal:
      break;
  }
  for (std::size_t d = 0; d < b.factor.size(); ++d) {
    if (b.factor[d] < 0) continue;
    const std::int64_t n = b.block.size[d];
    if (piece == Piece::matrix)
      f(b.local_factor[d], n * n);
    else
      f(b.local_diagonal[d], n);
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::copy_state(const ExecutionSpace& space, bool to_full) {
  // Between the checkpoint layout in m_state_full (kind after kind, each parameter after parameter
  // the rows of this rank's blocks, a block's pieces one after the other at the start of its row)
  // and this rank's buffers or (to_full, distributed) every rank's share as gathered in
  // m_state_gathered (rank after rank, each kind after kind).
  using Bytes = Kokkos::View<char*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const auto kinds = state_kinds();
  const std::size_t ranks = m_local_packed.size();
  std::vector<std::int64_t> full(1, 0);
  std::vector<std::vector<std::int64_t>> starts;  // per kind: each parameter's first row
  for (const auto& kind : kinds) {
    full.push_back(full.back() + kind.total * std::int64_t(kind.bytes));
    starts.push_back(state_row_starts(kind.piece));
  }
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
    const auto p = std::size_t(m_blocks[k].parameter);
    const auto row = std::int64_t(k - m_parameter_blocks[p].first);
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const auto size = std::int64_t(kinds[i].bytes);
      char* local = gathered ? m_state_gathered.data() + at[r][i] : kinds[i].local;
      std::int64_t full_start = starts[i][p] + row * m_row_lengths[p][std::size_t(kinds[i].piece)];
      for_each_piece(k, kinds[i].piece, [&](std::int64_t local_start, std::int64_t n) {
        const Bytes l(local + local_start * size, std::size_t(n * size));
        const Bytes f(m_state_full.data() + full[i] + full_start * size, std::size_t(n * size));
        full_start += n;
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
  using Bytes = Kokkos::View<char*, memory_space>;
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
    // Zero-filled: the rows' ends past a shorter block are written as zeros.
    if (!m_state_full.data())
      m_state_full =
          Bytes(Kokkos::view_alloc(space, "Lather::soap::state_full"), std::size_t(std::max<std::int64_t>(full, 1)));
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
  std::vector<std::vector<std::int64_t>> starts;
  for (const auto& kind : kinds) {
    bases.push_back(base);
    base += kind.total * std::int64_t(kind.bytes);
    starts.push_back(state_row_starts(kind.piece));
  }
  m_block_tables.assign(this->m_parameters.size(), {});
  for (std::size_t p = 0; p < this->m_parameters.size(); ++p) {
    const auto [first, end] = m_parameter_blocks[p];
    const auto [global_first, global_end] = m_parameter_global[p];
    // A piece without a block (a band of a small parameter) lists none of its arrays.
    if (global_first == global_end || (m_pieces[p] && first == end)) continue;
    // Of the ranks holding the same piece (replicas, or every shard's copy of a whole parameter),
    // the first writes it.
    const bool writes = rank == 0 && (m_sums_counted.empty() || m_sums_counted[p]);
    std::vector<std::int64_t> rows;
    if (m_pieces[p])
      for (std::size_t k = first; k < end; ++k) rows.push_back(m_blocks[k].global - global_first);
    const std::string prefix = "soap/" + this->m_parameters[p].name + "/";
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const std::int64_t length = m_row_lengths[p][std::size_t(kinds[i].piece)];
      if (length == 0) continue;
      const auto size = std::int64_t(kinds[i].bytes);
      StateArray<memory_space> a;
      a.name = prefix + kinds[i].name;
      a.dtype = kinds[i].dtype;
      a.shape = {global_end - global_first, length};
      a.rows = rows;
      a.writer = writes;
      const std::pair<std::int64_t, std::int64_t> bytes(bases[i] + starts[i][p] * size,
                                                        bases[i] + starts[i][p + 1] * size);
      a.device_bytes =
          as_bytes<memory_space>(Kokkos::subview(m_state_full, bytes), std::size_t(bytes.second - bytes.first));
      arrays.push_back(a);
    }
    const int dimensions = m_partitions[p].rank();
    if (dimensions == 0) continue;  // a scalar: one block, read alike by any layout
    m_block_tables[p] = block_table(p);
    auto& table = m_block_tables[p];
    StateArray<memory_space> blocks;
    blocks.name = prefix + "blocks";
    blocks.dtype = DType::int64;
    blocks.shape = {global_end - global_first, 2 * std::int64_t(dimensions)};
    blocks.writer = rank == 0;  // the same on every rank: a checkpoint writes one copy
    blocks.host_bytes =
        StateBytes<Kokkos::HostSpace>(reinterpret_cast<char*>(table.data()), table.size() * sizeof(std::int64_t));
    arrays.push_back(blocks);
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::state_restored(const ExecutionSpace& space, long step_count) {
  // A checkpoint of a layout that blocks a tensor otherwise (SOAP with weight shards keeps the split
  // axis apart from the small dimensions merged around it) is refused before any state moves.
  for (std::size_t p = 0; p < m_block_tables.size(); ++p) {
    if (m_block_tables[p].empty()) continue;
    const auto expected = block_table(p);
    if (m_block_tables[p] == expected) continue;
    const auto dimensions = std::size_t(m_partitions[p].rank());
    std::size_t k = 0;
    while (k + 1 < expected.size() / (2 * dimensions) &&
           std::equal(expected.begin() + std::ptrdiff_t(2 * dimensions * k),
                      expected.begin() + std::ptrdiff_t(2 * dimensions * (k + 1)),
                      m_block_tables[p].begin() + std::ptrdiff_t(2 * dimensions * k)))
      ++k;
    const auto describe_block = [&](const std::vector<std::int64_t>& table) {
      std::ostringstream text;
      for (std::size_t d = 0; d < 2 * dimensions; ++d)
        text << (d == 0 ? "offset [" : d == dimensions ? "], size [" : ", ") << table[2 * dimensions * k + d];
      text << "]";
      return text.str();
    };
    const std::string name = this->m_parameters[p].name;
    const std::string there = describe_block(m_block_tables[p]), here = describe_block(expected);
    state_released();
    LATHER_FAIL("Soap: the checkpoint's state of parameter '", name, "' (soap/", name, "/blocks) is blocked otherwise ",
                "than this run reads the tensor: block ", k, " has ", there, " there, ", here,
                " here (with weight shards SOAP keeps the split axis apart from the dimensions merged around it); ",
                "resume on a layout that reads the tensor alike");
  }
  m_step = step_count;
  // The arrays of the last state_arrays() were filled: this rank's share back from them.
  if (m_state_full.data()) copy_state(space, false);
  state_released();
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::state_released() {
  m_state_full = {};
  m_state_gathered = {};
  m_block_tables.clear();
}

}  // namespace lather::optim
