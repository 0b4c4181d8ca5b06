#pragma once
// The reference's QuantizedValue (from Lingvo), on Kokkos Views: symmetric linear quantization
// with one scale per column (the maximum |value| of the column / the largest code), codes rounded
// half to even. Symmetric matrices keep their diagonal apart in float, so the off-diagonal codes
// spend their range on the off-diagonal entries only.

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace lather::optim {

/// Largest code of a quantized type: 127 for int8, 32767 for int16 (-128 / -32768 unused).
template <class Code>
constexpr double max_code() {
  return double((1 << (8 * sizeof(Code) - 1)) - 1);
}

/// A tensor viewed as [rows, columns] (row-major): codes [rows * columns], scales [columns].
/// values -> codes, scales (scale = max_i |v(i, j)| / max_code; a zero column keeps scale 0).
template <class ExecutionSpace, class Value, class Code>
void quantize_columns(const ExecutionSpace& space,
                      const Kokkos::View<const Value*, typename ExecutionSpace::memory_space>& values,
                      std::int64_t rows, std::int64_t columns,
                      const Kokkos::View<Code*, typename ExecutionSpace::memory_space>& codes,
                      const Kokkos::View<Value*, typename ExecutionSpace::memory_space>& scales);

/// codes, scales -> values = code * scale.
template <class ExecutionSpace, class Value, class Code>
void dequantize_columns(const ExecutionSpace& space,
                        const Kokkos::View<const Code*, typename ExecutionSpace::memory_space>& codes,
                        const Kokkos::View<const Value*, typename ExecutionSpace::memory_space>& scales,
                        std::int64_t rows, std::int64_t columns,
                        const Kokkos::View<Value*, typename ExecutionSpace::memory_space>& values);

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
    const Kokkos::View<Value**, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& scales);

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
    const Kokkos::View<Value***, Kokkos::LayoutRight, typename ExecutionSpace::memory_space>& values);

}  // namespace lather::optim
