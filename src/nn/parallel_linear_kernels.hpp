#pragma once
// Kernels of the tensor-parallel dense layers (free functions: their lambdas are device-safe);
// products go through Lather's one GEMM call.

#include <lather/core/kokkos_compat.hpp>

#include <lather/core/gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace lather::nn::Impl {

namespace kmath = ::lather::Impl::kmath;
using ::lather::Impl::ScopedRegion;

template <class T, class MemorySpace>
using Rows = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;

using ::lather::Impl::gemm;

/// sums(j) = sum_i m(i, j) (added to sums(j) when `accumulate`), accumulated in S: a bias gradient
/// sums one batch of rows, where float's rounding is far below the gradient's own noise. Each
/// column's sum walks the rows in order, so both bodies give the same sums to the bit. On the host
/// a column at a time strides through memory: a thread walks the rows in order over a strip of
/// columns instead, which vectorises.
template <class ExecutionSpace, class S, class MemorySpace>
void column_sums(::lather::Impl::HostBody, const ExecutionSpace& space, const Rows<const S, MemorySpace>& m,
                 const Kokkos::View<S*, MemorySpace>& sums, bool accumulate) {
  const int rows = int(m.extent(0)), columns = int(m.extent(1));
  Kokkos::parallel_for(
      "Lather::nn::column_sums", Kokkos::RangePolicy<ExecutionSpace>(space, 0, (columns + 255) / 256),
      KOKKOS_LAMBDA(int strip) {
        constexpr int width = 256;
        const int first = strip * width, count = columns - first < width ? columns - first : width;
        S total[width];
        for (int j = 0; j < count; ++j) total[j] = 0;
        for (int i = 0; i < rows; ++i) {
          const S* row = &m(i, first);
          for (int j = 0; j < count; ++j) total[j] += row[j];
        }
        for (int j = 0; j < count; ++j) sums(first + j) = accumulate ? S(sums(first + j) + total[j]) : total[j];
      });
}
template <class ExecutionSpace, class S, class MemorySpace>
void column_sums(::lather::Impl::DeviceBody, const ExecutionSpace& space, const Rows<const S, MemorySpace>& m,
                 const Kokkos::View<S*, MemorySpace>& sums, bool accumulate) {
  const int rows = int(m.extent(0));
  Kokkos::parallel_for(
      "Lather::nn::column_sums", Kokkos::RangePolicy<ExecutionSpace>(space, 0, m.extent(1)),
      KOKKOS_LAMBDA(std::size_t j) {
        S total = 0;
        for (int i = 0; i < rows; ++i) total += m(i, j);
        sums(j) = accumulate ? S(sums(j) + total) : total;
      });
}
template <class ExecutionSpace, class S, class MemorySpace>
void column_sums(const ExecutionSpace& space, const Rows<const S, MemorySpace>& m,
                 const Kokkos::View<S*, MemorySpace>& sums, bool accumulate) {
  column_sums(::lather::Impl::BodyFor<ExecutionSpace>{}, space, m, sums, accumulate);
}

/// y(i, j) += bias(j).
template <class ExecutionSpace, class S, class MemorySpace>
void add_bias(const ExecutionSpace& space, const Rows<S, MemorySpace>& y,
              const Kokkos::View<const S*, MemorySpace>& bias) {
  Kokkos::parallel_for(
      "Lather::nn::add_bias",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {std::int64_t(0), std::int64_t(0)},
                                                             {std::int64_t(y.extent(0)), std::int64_t(y.extent(1))}),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) { y(i, j) += bias(j); });
}

}  // namespace lather::nn::Impl
