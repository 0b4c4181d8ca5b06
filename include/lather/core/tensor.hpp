#pragma once
// How Lather receives a model's tensors: each tensor is a contiguous 1-D View (a parameter of any
// rank, flattened row-major) in the execution space's memory space; a model is a list of them.
// Shapes travel separately (TensorShape) where an algorithm needs them.

#include <lather/core/error.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather {

template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
using FlatTensor = Kokkos::View<Scalar*, MemorySpace>;

template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
using TensorList = std::vector<FlatTensor<Scalar, MemorySpace>>;

/// Row-major shape of one tensor; the empty shape is a scalar (one element).
using TensorShape = std::vector<std::int64_t>;

inline std::int64_t element_count(const TensorShape& shape) {
  std::int64_t count = 1;
  for (auto d : shape) {
    LATHER_REQUIRE(d >= 0, "tensor dimension must be >= 0, got ", d);
    count *= d;
  }
  return count;
}

std::string to_string(const TensorShape& shape);  ///< "[12, 9]"

}  // namespace lather
