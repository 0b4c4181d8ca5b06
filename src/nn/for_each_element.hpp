#pragma once
// Element-wise kernels over a row-major matrix, shaped per backend.

#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

// Not in an unnamed namespace: CUDA cannot launch extended lambdas from functions in one.
namespace lather::nn::Impl {

/// body(i, j) for every element of a [rows, columns] matrix: on the host a row per iteration with
/// the columns in an inner loop the compiler vectorises (a 2-D range policy on Serial walks the
/// elements one by one, in tiles, and the loop stays scalar), on a device a thread per element.
template <class ExecutionSpace, class Body>
void for_each_element(::lather::Impl::HostBody, const char* label, const ExecutionSpace& space, std::size_t rows,
                      std::size_t columns, const Body& body) {
  const std::int64_t width = std::int64_t(columns);
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, std::int64_t(rows)),
      KOKKOS_LAMBDA(std::int64_t i) {
        for (std::int64_t j = 0; j < width; ++j) body(i, j);
      });
}
template <class ExecutionSpace, class Body>
void for_each_element(::lather::Impl::DeviceBody, const char* label, const ExecutionSpace& space, std::size_t rows,
                      std::size_t columns, const Body& body) {
  Kokkos::parallel_for(label,
                       Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(
                           space, {std::int64_t(0), std::int64_t(0)}, {std::int64_t(rows), std::int64_t(columns)}),
                       body);
}
template <class ExecutionSpace, class Body>
void for_each_element(const char* label, const ExecutionSpace& space, std::size_t rows, std::size_t columns,
                      const Body& body) {
  if (rows == 0 || columns == 0) return;
  for_each_element(::lather::Impl::BodyFor<ExecutionSpace>{}, label, space, rows, columns, body);
}

}  // namespace lather::nn::Impl
