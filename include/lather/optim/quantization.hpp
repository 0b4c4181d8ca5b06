#pragma once
// The reference's QuantizedValue (from Lingvo), on Kokkos Views: symmetric linear quantization
// with one scale per column (the maximum |value| of the column / the largest code), codes rounded
// half to even. Symmetric matrices keep their diagonal apart in float, so the off-diagonal codes
// spend their range on the off-diagonal entries only.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace lather::optim {

namespace Impl {
namespace kmath = ::lather::Impl::kmath;
}

/// Largest code of a quantized type: 127 for int8, 32767 for int16 (-128 / -32768 unused).
template <class Code>
KOKKOS_INLINE_FUNCTION constexpr double max_code() {
  return double((1 << (8 * sizeof(Code) - 1)) - 1);
}

/// A tensor viewed as [rows, columns] (row-major): codes [rows * columns], scales [columns].
/// values -> codes, scales (scale = max_i |v(i, j)| / max_code; a zero column keeps scale 0).
template <class ExecutionSpace, class Value, class Code>
void quantize_columns(const ExecutionSpace& space,
                      const Kokkos::View<const Value*, typename ExecutionSpace::memory_space>& values,
                      std::int64_t rows, std::int64_t columns,
                      const Kokkos::View<Code*, typename ExecutionSpace::memory_space>& codes,
                      const Kokkos::View<Value*, typename ExecutionSpace::memory_space>& scales) {
  const Value buckets = Value(max_code<Code>());
  Kokkos::parallel_for(
      "Lather::quantize_columns", Kokkos::RangePolicy<ExecutionSpace>(space, 0, columns),
      KOKKOS_LAMBDA(std::int64_t j) {
        Value largest = 0;
        for (std::int64_t i = 0; i < rows; ++i) {
          const Value a = Impl::kmath::fabs(values(i * columns + j));
          if (a > largest) largest = a;
        }
        const Value scale = largest / buckets;
        scales(j) = scale;
        const Value divisor = scale > Value(0) ? scale : Value(1);
        for (std::int64_t i = 0; i < rows; ++i)
          codes(i * columns + j) = Code(Impl::kmath::nearbyint(values(i * columns + j) / divisor));
      });
}

/// codes, scales -> values = code * scale.
template <class ExecutionSpace, class Value, class Code>
void dequantize_columns(const ExecutionSpace& space,
                        const Kokkos::View<const Code*, typename ExecutionSpace::memory_space>& codes,
                        const Kokkos::View<const Value*, typename ExecutionSpace::memory_space>& scales,
                        std::int64_t rows, std::int64_t columns,
                        const Kokkos::View<Value*, typename ExecutionSpace::memory_space>& values) {
  Kokkos::parallel_for(
      "Lather::dequantize_columns", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * columns),
      KOKKOS_LAMBDA(std::int64_t k) { values(k) = Value(codes(k)) * scales(k % columns); });
}

namespace Impl {

/// Matrix k of a list as a reference to its element (i, j): slot index(k) of a stack [B, N, N].
template <class Value, class MemorySpace>
struct StackMatrices {
  Kokkos::View<Value***, Kokkos::LayoutRight, MemorySpace> stack;
  Kokkos::View<const int*, MemorySpace> index;
  KOKKOS_INLINE_FUNCTION Value& operator()(int k, int i, int j) const { return stack(index(k), i, j); }
};

/// Matrix k of a list in a flat buffer: element (i, j) at offset(k) + i * stride(k) + j.
template <class Value, class MemorySpace>
struct StridedMatrices {
  Kokkos::View<Value*, MemorySpace> data;
  Kokkos::View<const std::int64_t*, MemorySpace> offset;
  Kokkos::View<const int*, MemorySpace> stride;
  KOKKOS_INLINE_FUNCTION Value& operator()(int k, int i, int j) const {
    return data(offset(k) + std::int64_t(i) * stride(k) + j);
  }
};

/// For each k: the leading size(k) square of matrix k of `values` is split into its diagonal
/// (kept in Value) and the off-diagonal part, quantized per column into int16 codes, stored at
/// slot to(k) of codes / diagonal / scales.
template <class ExecutionSpace, class Matrices, class Value>
void quantize_symmetric_matrices(
    const ExecutionSpace& space, const Matrices& values,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& to,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& size,
    const Kokkos::View<std::int16_t***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& codes,
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& diagonal,
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  const Value buckets = Value(max_code<std::int16_t>());
  Kokkos::parallel_for(
      "Lather::quantize_symmetric", Kokkos::TeamPolicy<ExecutionSpace>(space, int(size.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int k = member.league_rank(), b = to(k), n = size(k);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int j) {
          diagonal(b, j) = values(k, j, j);
          Value largest = 0;
          for (int i = 0; i < n; ++i) {
            const Value v = i == j ? Value(0) : kmath::fabs(values(k, i, j));
            if (v > largest) largest = v;
          }
          const Value scale = largest / buckets;
          scales(b, j) = scale;
          const Value divisor = scale > Value(0) ? scale : Value(1);
          for (int i = 0; i < n; ++i)
            codes(b, i, j) = i == j ? std::int16_t(0) : std::int16_t(kmath::nearbyint(values(k, i, j) / divisor));
        });
      });
}

/// The inverse: matrix k of `values`, leading size(k) square := code * scale(column) + diagonal,
/// read from slot from(k).
template <class ExecutionSpace, class Matrices, class Value>
void dequantize_symmetric_matrices(
    const ExecutionSpace& space,
    const Kokkos::View<const std::int16_t***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& codes,
    const Kokkos::View<const Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& diagonal,
    const Kokkos::View<const Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& from,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& size, const Matrices& values) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::dequantize_symmetric", Kokkos::TeamPolicy<ExecutionSpace>(space, int(size.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int k = member.league_rank(), a = from(k), n = size(k);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), [&](int j) {
            values(k, i, j) = Value(codes(a, i, j)) * scales(a, j) + (i == j ? diagonal(a, j) : Value(0));
          });
        });
      });
}

}  // namespace Impl

/// Stacks of symmetric matrices [B, N, N]: for each listed matrix (index, size n), the leading
/// n x n block is split into its diagonal (kept in float) and the off-diagonal part, quantized
/// per column into int16 codes.
template <class ExecutionSpace, class Value>
void quantize_symmetric(
    const ExecutionSpace& space,
    const Kokkos::View<const Value***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& values,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& index,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& size,
    const Kokkos::View<std::int16_t***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& codes,
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& diagonal,
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales) {
  using memory_space = typename ExecutionSpace::memory_space;
  Impl::quantize_symmetric_matrices(space, Impl::StackMatrices<const Value, memory_space>{values, index}, index, size,
                                    codes, diagonal, scales);
}

/// The inverse: values(index) leading block = code * scale(column) + diagonal; outside the leading
/// block values are left as they are.
template <class ExecutionSpace, class Value>
void dequantize_symmetric(
    const ExecutionSpace& space,
    const Kokkos::View<const std::int16_t***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& codes,
    const Kokkos::View<const Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& diagonal,
    const Kokkos::View<const Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& index,
    const Kokkos::View<const int*, typename ExecutionSpace::memory_space>& size,
    const Kokkos::View<Value***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& values) {
  using memory_space = typename ExecutionSpace::memory_space;
  Impl::dequantize_symmetric_matrices(space, codes, diagonal, scales, index, size,
                                      Impl::StackMatrices<Value, memory_space>{values, index});
}

}  // namespace lather::optim
