#include <lather/core/state_array.hpp>

#include <lather/core/kokkos_compat.hpp>

namespace lather {

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::int8:
      return "int8";
    case DType::int16:
      return "int16";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
  }
  return "unknown";
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return 4;
    case DType::float64:
      return 8;
    case DType::int8:
      return 1;
    case DType::int16:
      return 2;
    case DType::int32:
      return 4;
    case DType::int64:
      return 8;
  }
  return 0;
}

template <class MemorySpace>
std::int64_t StateArray<MemorySpace>::row_elements() const {
  std::int64_t n = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

template <class MemorySpace>
std::int64_t StateArray<MemorySpace>::local_elements() const {
  if (rows.empty()) return element_count(shape);
  return std::int64_t(rows.size()) * row_elements();
}

template struct StateArray<DefaultExecutionSpace::memory_space>;
#if LATHER_HOST_SPACE_DIFFERS
template struct StateArray<DefaultHostExecutionSpace::memory_space>;
#endif

}  // namespace lather
