#pragma once
// Part of the implementation of Soap (included by <lather/optim/impl/soap_impl.hpp> only):
// best_effort_memory_usage_reduction. This rank's quantized state, in its local layout:
//   exp_avg of a class of rank > 1: int8 codes (m_avg_codes, block after block, row-major) and
//     per-column scales (m_avg_scales, block after block): each block viewed as
//     [size[0], elements / size[0]]; other classes: float (m_exp_avg), block after block;
//   exp_avg_sq: float, as the float path keeps it (m_exp_avg_sq at BlockInfo::local);
//   factors: int16 off-diagonal codes (m_factor_codes, n x n at local_factor, as the float
//     layout), the diagonal and per-column scales (m_factor_diagonal / m_factor_scales, n per
//     matrix at local_diagonal); quantize_symmetric_matrices' format;
//   bases: int16 codes (m_basis_codes, n x n at local_factor) and per-column scales
//     (m_basis_scales, n per matrix at local_diagonal); quantize_columns' format.
// Codes are round-half-to-even of value / scale, scale = the column's max |value| / 32767 (int16)
// or / 127 (int8). The checkpoint arrays hold the same codes and scales in the replicated
// optimizer's block order, so a restore reproduces the state bit for bit on any rank count.

#include <lather/optim/impl/soap_impl.hpp>
#include <lather/optim/quantization.hpp>

namespace lather::optim {

namespace Impl {

/// One array of the quantized state (kinds 0..8, see Soap::for_each_piece).
struct SoapStateKind {
  std::string name;
  DType dtype = DType::float32;
  std::size_t bytes = 0;               // per element
  char* local = nullptr;               // this rank's buffer
  std::vector<std::int64_t> counts;    // elements per rank
  std::int64_t total = 0;              // elements in the checkpoint layout
};

/// quantize_columns (the same rounding and scales) for `count` consecutive [rows, columns]
/// blocks, each with its own scales: scales[b * columns + j].
template <class ExecutionSpace, class Value, class Code>
void soap_quantize_columns(const ExecutionSpace& space, const Value* values, std::int64_t count, std::int64_t rows,
                           std::int64_t columns, Code* codes, Value* scales) {
  const Value buckets = Value(max_code<Code>());
  const std::int64_t elements = rows * columns;
  Kokkos::parallel_for(
      "Lather::soap::quantize_columns", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count * columns),
      KOKKOS_LAMBDA(std::int64_t c) {
        const std::int64_t start = (c / columns) * elements + c % columns;
        Value largest = 0;
        for (std::int64_t i = 0; i < rows; ++i) {
          const Value a = kmath::fabs(values[start + i * columns]);
          if (a > largest) largest = a;
        }
        const Value scale = largest / buckets;
        scales[c] = scale;
        const Value divisor = scale > Value(0) ? scale : Value(1);
        for (std::int64_t i = 0; i < rows; ++i)
          codes[start + i * columns] = Code(kmath::nearbyint(values[start + i * columns] / divisor));
      });
}

/// The inverse: values = code * scale of its block and column.
template <class ExecutionSpace, class Value, class Code>
void soap_dequantize_columns(const ExecutionSpace& space, const Code* codes, const Value* scales, std::int64_t count,
                             std::int64_t rows, std::int64_t columns, Value* values) {
  const std::int64_t elements = rows * columns;
  Kokkos::parallel_for(
      "Lather::soap::dequantize_columns", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count * elements),
      KOKKOS_LAMBDA(std::int64_t e) { values[e] = Value(codes[e]) * scales[(e / elements) * columns + e % columns]; });
}

/// `count` consecutive n x n matrices (row-major) for quantize_symmetric_matrices.
template <class Value>
struct SoapMatrices {
  Value* data;
  std::int64_t n;
  KOKKOS_INLINE_FUNCTION Value& operator()(int k, int i, int j) const { return data[(std::int64_t(k) * n + i) * n + j]; }
};

}  // namespace Impl

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::plan_quantized(const ExecutionSpace& space) {
  const int ranks = m_group.size(), rank = m_group.rank();
  // Every rank's local layout (the checkpoint gathers them), class by class as the float layout.
  m_local_avg_codes.assign(std::size_t(ranks), 0);
  m_local_avg_floats.assign(std::size_t(ranks), 0);
  m_local_avg_scales.assign(std::size_t(ranks), 0);
  m_local_diagonal.assign(std::size_t(ranks), 0);
  for (auto& c : m_classes) {
    const auto r = std::size_t(c.owner);
    const auto count = std::int64_t(c.blocks.size());
    c.columns = c.size.size() >= 2 ? c.elements / c.size[0] : 0;
    std::int64_t& cursor = c.columns > 0 ? m_local_avg_codes[r] : m_local_avg_floats[r];
    c.avg = cursor;
    cursor += count * c.elements;
    c.avg_scales = m_local_avg_scales[r];
    m_local_avg_scales[r] += count * c.columns;
    c.diagonal.assign(c.size.size(), -1);
    for (std::size_t d = 0; d < c.size.size(); ++d)
      if (c.factor[d] >= 0) {
        c.diagonal[d] = m_local_diagonal[r];
        m_local_diagonal[r] += count * c.size[d];
      }
    for (std::size_t i = 0; i < c.blocks.size(); ++i) {
      auto& b = m_blocks[c.blocks[i]];
      b.avg_local = c.avg + std::int64_t(i) * c.elements;
      b.avg_columns = c.columns;
      b.local_avg_scales = c.avg_scales + std::int64_t(i) * c.columns;
      b.local_diagonal.assign(c.size.size(), -1);
      for (std::size_t d = 0; d < c.size.size(); ++d)
        if (c.factor[d] >= 0) b.local_diagonal[d] = c.diagonal[d] + std::int64_t(i) * c.size[d];
    }
  }
  // The checkpoint layout: scales and diagonals block after block, parameter after parameter.
  std::int64_t columns = 0, diagonal = 0;
  for (std::size_t p = 0; p < m_parameter_blocks.size(); ++p) {
    const std::int64_t columns_begin = columns, diagonal_begin = diagonal;
    for (std::size_t k = m_parameter_blocks[p].first; k < m_parameter_blocks[p].second; ++k) {
      auto& b = m_blocks[k];
      b.avg_scales = columns;
      columns += b.avg_columns;
      b.diagonal.assign(b.factor.size(), -1);
      for (std::size_t d = 0; d < b.factor.size(); ++d)
        if (b.factor[d] >= 0) {
          b.diagonal[d] = diagonal;
          diagonal += b.block.size[d];
        }
    }
    m_parameter_columns.emplace_back(columns_begin, columns);
    m_parameter_diagonal.emplace_back(diagonal_begin, diagonal);
  }
  m_column_total = columns;
  m_diagonal_total = diagonal;
  // m_q_index: 0, 1, ..., count - 1 (the matrices' slots), then count copies of n per own class
  // and dimension (their sizes).
  std::vector<int> index;
  std::size_t most = 0;
  for (std::size_t ci : m_own_classes) most = std::max(most, m_classes[ci].blocks.size());
  for (std::size_t i = 0; i < most; ++i) index.push_back(int(i));
  for (std::size_t ci : m_own_classes) {
    auto& c = m_classes[ci];
    c.sizes.assign(c.size.size(), -1);
    for (std::size_t d = 0; d < c.size.size(); ++d)
      if (c.factor[d] >= 0) {
        c.sizes[d] = std::int64_t(index.size());
        index.insert(index.end(), c.blocks.size(), int(c.size[d]));
      }
  }
  const auto alloc = [&](auto& view, const char* what, std::int64_t n) {
    using View = std::decay_t<decltype(view)>;
    view = View(Kokkos::view_alloc(space, std::string("Lather::soap::") + what), std::size_t(n));
  };
  const auto r = std::size_t(rank);
  alloc(m_q_index, "quantized_index", std::int64_t(index.size()));
  Kokkos::deep_copy(space, m_q_index, Kokkos::View<const int*, Kokkos::HostSpace>(index.data(), index.size()));
  alloc(m_avg_codes, "exp_avg_codes", m_local_avg_codes[r]);
  alloc(m_exp_avg, "exp_avg", m_local_avg_floats[r]);
  alloc(m_avg_scales, "exp_avg_scales", m_local_avg_scales[r]);
  alloc(m_factor_codes, "factor_codes", m_local_factors[r]);
  alloc(m_factor_diagonal, "factor_diagonal", m_local_diagonal[r]);
  alloc(m_factor_scales, "factor_scales", m_local_diagonal[r]);
  alloc(m_basis_codes, "basis_codes", m_local_factors[r]);
  alloc(m_basis_scales, "basis_scales", m_local_diagonal[r]);
  alloc(m_avg_work, "exp_avg_work", m_local_packed[r]);
  alloc(m_matrix_work, "matrix_work", m_local_factors[r]);
  ::lather::Impl::fence(space, "Lather::soap: quantized index copied");  // `index` is freed on return
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::load_exp_avg(const ExecutionSpace& space) {
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    const auto count = std::int64_t(c.blocks.size());
    Scalar* work = m_avg_work.data() + c.local;
    if (c.columns > 0) {
      Impl::soap_dequantize_columns(space, m_avg_codes.data() + c.avg, m_avg_scales.data() + c.avg_scales, count,
                                    c.size[0], c.columns, work);
    } else {
      const Scalar* in = m_exp_avg.data() + c.avg;
      Kokkos::parallel_for(
          "Lather::soap::load_exp_avg", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count * c.elements),
          KOKKOS_LAMBDA(std::int64_t e) { work[e] = in[e]; });
    }
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::store_exp_avg(const ExecutionSpace& space) {
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    const auto count = std::int64_t(c.blocks.size());
    const Scalar* work = m_avg_work.data() + c.local;
    if (c.columns > 0) {
      Impl::soap_quantize_columns(space, work, count, c.size[0], c.columns, m_avg_codes.data() + c.avg,
                                  m_avg_scales.data() + c.avg_scales);
    } else {
      Scalar* out = m_exp_avg.data() + c.avg;
      Kokkos::parallel_for(
          "Lather::soap::store_exp_avg", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count * c.elements),
          KOKKOS_LAMBDA(std::int64_t e) { out[e] = work[e]; });
    }
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::load_matrices(const ExecutionSpace& space, bool bases) {
  using Codes = Kokkos::View<const std::int16_t***, Kokkos::LayoutRight, memory_space>;
  using Rows = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
  using Index = Kokkos::View<const int*, memory_space>;
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    const auto count = std::int64_t(c.blocks.size());
    for (std::size_t d = 0; d < c.size.size(); ++d) {
      if (c.factor[d] < 0) continue;
      const std::int64_t n = c.size[d];
      Scalar* work = m_matrix_work.data() + c.factor[d];
      if (bases) {
        Impl::soap_dequantize_columns(space, m_basis_codes.data() + c.factor[d], m_basis_scales.data() + c.diagonal[d],
                                      count, n, n, work);
        continue;
      }
      const Index slots(m_q_index.data(), std::size_t(count)), sizes(m_q_index.data() + c.sizes[d], std::size_t(count));
      Impl::dequantize_symmetric_matrices<ExecutionSpace, Impl::SoapMatrices<Scalar>, Scalar>(
          space, Codes(m_factor_codes.data() + c.factor[d], count, n, n),
          Rows(m_factor_diagonal.data() + c.diagonal[d], count, n), Rows(m_factor_scales.data() + c.diagonal[d], count, n),
          slots, sizes, Impl::SoapMatrices<Scalar>{work, n});
    }
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::store_matrices(const ExecutionSpace& space, bool bases) {
  using Codes = Kokkos::View<std::int16_t***, Kokkos::LayoutRight, memory_space>;
  using Rows = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using Index = Kokkos::View<const int*, memory_space>;
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    const auto count = std::int64_t(c.blocks.size());
    for (std::size_t d = 0; d < c.size.size(); ++d) {
      if (c.factor[d] < 0) continue;
      const std::int64_t n = c.size[d];
      const Scalar* work = m_matrix_work.data() + c.factor[d];
      if (bases) {
        Impl::soap_quantize_columns(space, work, count, n, n, m_basis_codes.data() + c.factor[d],
                                    m_basis_scales.data() + c.diagonal[d]);
        continue;
      }
      const Index slots(m_q_index.data(), std::size_t(count)), sizes(m_q_index.data() + c.sizes[d], std::size_t(count));
      Impl::quantize_symmetric_matrices<ExecutionSpace, Impl::SoapMatrices<const Scalar>, Scalar>(
          space, Impl::SoapMatrices<const Scalar>{work, n}, slots, sizes,
          Codes(m_factor_codes.data() + c.factor[d], count, n, n), Rows(m_factor_diagonal.data() + c.diagonal[d], count, n),
          Rows(m_factor_scales.data() + c.diagonal[d], count, n));
    }
  }
}

template <class ExecutionSpace, class Scalar>
StateMemoryReport Soap<ExecutionSpace, Scalar>::quantized_memory_report() const {
  StateMemoryReport r;
  const auto bytes = [](const auto& b) {
    return std::int64_t(b.size() * sizeof(typename std::decay_t<decltype(b)>::value_type));
  };
  r.local_bytes = bytes(m_exp_avg) + bytes(m_exp_avg_sq);  // rank-1 blocks' exp_avg, exp_avg_sq
  r.quantized_bytes = bytes(m_avg_codes) + bytes(m_avg_scales) + bytes(m_factor_codes) + bytes(m_factor_diagonal) +
                      bytes(m_factor_scales) + bytes(m_basis_codes) + bytes(m_basis_scales);
  r.workspace_bytes = bytes(m_gradient) + bytes(m_update) + bytes(m_scratch_a) + bytes(m_block_sums) +
                      bytes(m_gathered) + bytes(m_avg_work) + bytes(m_matrix_work) + bytes(m_q_index) +
                      bytes(m_q_full) + bytes(m_q_gathered);
  return r;
}

template <class ExecutionSpace, class Scalar>
std::vector<Impl::SoapStateKind> Soap<ExecutionSpace, Scalar>::quantized_kinds() {
  const std::int64_t P = m_packed_total, F = m_factor_total, D = m_diagonal_total;
  const DType real = dtype_of<Scalar>();
  const auto kind = [](std::string name, DType dtype, std::size_t bytes, void* local,
                       const std::vector<std::int64_t>& counts, std::int64_t total) {
    return Impl::SoapStateKind{std::move(name), dtype, bytes, static_cast<char*>(local), counts, total};
  };
  const std::size_t s = sizeof(Scalar);
  return {kind("exp_avg/codes", DType::int8, 1, m_avg_codes.data(), m_local_avg_codes, P),
          kind("exp_avg", real, s, m_exp_avg.data(), m_local_avg_floats, P),
          kind("exp_avg/scales", real, s, m_avg_scales.data(), m_local_avg_scales, m_column_total),
          kind("exp_avg_sq", real, s, m_exp_avg_sq.data(), m_local_packed, P),
          kind("factors/codes", DType::int16, 2, m_factor_codes.data(), m_local_factors, F),
          kind("factors/diagonal", real, s, m_factor_diagonal.data(), m_local_diagonal, D),
          kind("factors/scales", real, s, m_factor_scales.data(), m_local_diagonal, D),
          kind("bases/codes", DType::int16, 2, m_basis_codes.data(), m_local_factors, F),
          kind("bases/scales", real, s, m_basis_scales.data(), m_local_diagonal, D)};
}

template <class ExecutionSpace, class Scalar>
template <class F>
void Soap<ExecutionSpace, Scalar>::for_each_piece(std::size_t k, int kind, F&& f) const {
  const BlockInfo& b = m_blocks[k];
  const bool codes = b.avg_columns > 0;
  switch (kind) {
    case 0: if (codes) f(b.avg_local, b.packed, b.block.elements()); return;
    case 1: if (!codes) f(b.avg_local, b.packed, b.block.elements()); return;
    case 2: if (codes) f(b.local_avg_scales, b.avg_scales, b.avg_columns); return;
    case 3: f(b.local, b.packed, b.block.elements()); return;
    default: break;
  }
  for (std::size_t d = 0; d < b.factor.size(); ++d) {
    if (b.factor[d] < 0) continue;
    const std::int64_t n = b.block.size[d];
    if (kind == 4 || kind == 7)
      f(b.local_factor[d], b.factor[d], n * n);
    else
      f(b.local_diagonal[d], b.diagonal[d], n);
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::copy_quantized_state(const ExecutionSpace& space, bool to_full) {
  // Between the checkpoint layout in m_q_full (kind after kind, each in the replicated order) and
  // this rank's buffers or (to_full, distributed) every rank's share as gathered in m_q_gathered
  // (rank after rank, each kind after kind).
  using Bytes = Kokkos::View<char*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const auto kinds = quantized_kinds();
  const std::size_t ranks = m_local_packed.size();
  std::vector<std::int64_t> full(1, 0);
  for (const auto& kind : kinds) full.push_back(full.back() + kind.total * std::int64_t(kind.bytes));
  std::vector<std::vector<std::int64_t>> at(ranks);  // per rank: each kind's start in m_q_gathered
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
      char* local = gathered ? m_q_gathered.data() + at[r][i] : kinds[i].local;
      for_each_piece(k, int(i), [&](std::int64_t local_start, std::int64_t full_start, std::int64_t n) {
        const Bytes l(local + local_start * size, std::size_t(n * size));
        const Bytes f(m_q_full.data() + full[i] + full_start * size, std::size_t(n * size));
        if (to_full)
          Kokkos::deep_copy(space, f, l);
        else
          Kokkos::deep_copy(space, l, f);
      });
    }
  }
  ::lather::Impl::fence(space, "Lather::soap: quantized state copied");
}

template <class ExecutionSpace, class Scalar>
auto Soap<ExecutionSpace, Scalar>::quantized_state_arrays(const ExecutionSpace& space)
    -> std::vector<StateArray<memory_space>> {
  using Bytes = Kokkos::View<char*, memory_space>;
  const int rank = m_group.rank();
  const auto kinds = quantized_kinds();
  std::int64_t full = 0;
  std::vector<std::size_t> counts(m_local_packed.size(), 0), segment(1, 0);  // bytes per rank
  for (const auto& kind : kinds) {
    full += kind.total * std::int64_t(kind.bytes);
    for (std::size_t r = 0; r < counts.size(); ++r) counts[r] += std::size_t(kind.counts[r]) * kind.bytes;
  }
  for (std::size_t c : counts) segment.push_back(segment.back() + c);
  const auto prepare = [&] {
    if (!m_q_full.data())
      m_q_full = Bytes(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::soap::state_full"),
                       std::size_t(std::max<std::int64_t>(full, 1)));
    if (distributed() && !m_q_gathered.data())
      m_q_gathered = Bytes(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::soap::state_gathered"),
                           std::max<std::size_t>(segment.back(), 1));
  };
  if (!distributed()) {
    prepare();
  } else {
    m_group.run_agreed("Soap::state_arrays", [&] {
      ::lather::Impl::fault_point("soap.state_gather");
      prepare();
    });
    using Flat = Kokkos::View<char*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    char* mine = m_q_gathered.data() + segment[std::size_t(rank)];
    for (const auto& kind : kinds) {
      const std::size_t n = std::size_t(kind.counts[std::size_t(rank)]) * kind.bytes;
      Kokkos::deep_copy(space, Flat(mine, n), Flat(kind.local, n));
      mine += n;
    }
    m_group.allgatherv(space,
                       Kokkos::View<const char*, memory_space>(m_q_gathered.data() + segment[std::size_t(rank)],
                                                               counts[std::size_t(rank)]),
                       m_q_gathered, counts);
  }
  copy_quantized_state(space, true);
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
    const auto [first, end] = m_parameter_blocks[p];
    const bool codes = first < end && m_blocks[first].avg_columns > 0;
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      if ((i == 0 || i == 2) && !codes) continue;
      if (i == 1 && codes) continue;
      const auto range = i <= 1 || i == 3 ? m_parameter_packed[p]
                         : i == 2         ? m_parameter_columns[p]
                         : i == 4 || i == 7 ? m_parameter_factors[p]
                                            : m_parameter_diagonal[p];
      if (range.second == range.first) continue;
      const auto size = std::int64_t(kinds[i].bytes);
      StateArray<memory_space> a;
      a.name = "soap/" + this->m_parameters[p].name + "/" + kinds[i].name;
      a.dtype = kinds[i].dtype;
      a.shape = {range.second - range.first};
      a.writer = rank == 0;
      const std::pair<std::int64_t, std::int64_t> bytes(bases[i] + range.first * size, bases[i] + range.second * size);
      a.device_bytes = as_bytes<memory_space>(Kokkos::subview(m_q_full, bytes), std::size_t(bytes.second - bytes.first));
      arrays.push_back(a);
    }
  }
  return arrays;
}

}  // namespace lather::optim
