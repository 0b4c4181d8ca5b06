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

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/impl/soap_impl.hpp>
#include <lather/optim/quantization.hpp>

namespace lather::optim {

namespace Impl {

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
  KOKKOS_INLINE_FUNCTION Value& operator()(int k, int i, int j) const {
    return data[(std::int64_t(k) * n + i) * n + j];
  }
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
  using Flat = Kokkos::View<Scalar*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    const auto count = std::int64_t(c.blocks.size());
    Scalar* work = m_avg_work.data() + c.local;
    if (c.columns > 0) {
      Impl::soap_dequantize_columns(space, m_avg_codes.data() + c.avg, m_avg_scales.data() + c.avg_scales, count,
                                    c.size[0], c.columns, work);
    } else {
      const auto n = std::size_t(count * c.elements);
      Kokkos::deep_copy(space, Flat(work, n), Flat(m_exp_avg.data() + c.avg, n));
    }
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::store_exp_avg(const ExecutionSpace& space) {
  using Flat = Kokkos::View<Scalar*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Source = Kokkos::View<const Scalar*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    const auto count = std::int64_t(c.blocks.size());
    const Scalar* work = m_avg_work.data() + c.local;
    if (c.columns > 0) {
      Impl::soap_quantize_columns(space, work, count, c.size[0], c.columns, m_avg_codes.data() + c.avg,
                                  m_avg_scales.data() + c.avg_scales);
    } else {
      const auto n = std::size_t(count * c.elements);
      Kokkos::deep_copy(space, Flat(m_exp_avg.data() + c.avg, n), Source(work, n));
    }
  }
}

template <class ExecutionSpace, class Scalar>
template <class F>
void Soap<ExecutionSpace, Scalar>::for_each_own_matrices(F&& f) const {
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    for (std::size_t d = 0; d < c.size.size(); ++d)
      if (c.factor[d] >= 0) f(c, std::int64_t(c.blocks.size()), d, c.size[d]);
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::load_matrices(const ExecutionSpace& space, bool bases) {
  using Codes = Kokkos::View<const std::int16_t***, Kokkos::LayoutRight, memory_space>;
  using Rows = Kokkos::View<const Scalar**, Kokkos::LayoutRight, memory_space>;
  using Index = Kokkos::View<const int*, memory_space>;
  for_each_own_matrices([&](const ShapeClass& c, std::int64_t count, std::size_t d, std::int64_t n) {
    Scalar* work = m_matrix_work.data() + c.factor[d];
    if (bases) {
      Impl::soap_dequantize_columns(space, m_basis_codes.data() + c.factor[d], m_basis_scales.data() + c.diagonal[d],
                                    count, n, n, work);
      return;
    }
    const Index slots(m_q_index.data(), std::size_t(count)), sizes(m_q_index.data() + c.sizes[d], std::size_t(count));
    Impl::dequantize_symmetric_matrices<ExecutionSpace, Impl::SoapMatrices<Scalar>, Scalar>(
        space, Codes(m_factor_codes.data() + c.factor[d], count, n, n),
        Rows(m_factor_diagonal.data() + c.diagonal[d], count, n),
        Rows(m_factor_scales.data() + c.diagonal[d], count, n), slots, sizes, Impl::SoapMatrices<Scalar>{work, n});
  });
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::store_matrices(const ExecutionSpace& space, bool bases) {
  using Codes = Kokkos::View<std::int16_t***, Kokkos::LayoutRight, memory_space>;
  using Rows = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
  using Index = Kokkos::View<const int*, memory_space>;
  for_each_own_matrices([&](const ShapeClass& c, std::int64_t count, std::size_t d, std::int64_t n) {
    const Scalar* work = m_matrix_work.data() + c.factor[d];
    if (bases) {
      Impl::soap_quantize_columns(space, work, count, n, n, m_basis_codes.data() + c.factor[d],
                                  m_basis_scales.data() + c.diagonal[d]);
      return;
    }
    const Index slots(m_q_index.data(), std::size_t(count)), sizes(m_q_index.data() + c.sizes[d], std::size_t(count));
    Impl::quantize_symmetric_matrices<ExecutionSpace, Impl::SoapMatrices<const Scalar>, Scalar>(
        space, Impl::SoapMatrices<const Scalar>{work, n}, slots, sizes,
        Codes(m_factor_codes.data() + c.factor[d], count, n, n),
        Rows(m_factor_diagonal.data() + c.diagonal[d], count, n),
        Rows(m_factor_scales.data() + c.diagonal[d], count, n));
  });
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
                      bytes(m_distributor->buffer()) + bytes(m_avg_work) + bytes(m_matrix_work) + bytes(m_q_index) +
                      bytes(m_state_full) + bytes(m_state_gathered) + bytes(m_rounded);
  return r;
}

}  // namespace lather::optim
