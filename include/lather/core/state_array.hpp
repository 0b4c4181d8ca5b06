#pragma once
// The description of one array of state that a checkpoint stores: its element type, global shape
// and which part of it this rank holds. Optimizers describe their state with it and checkpoints
// write and read it, so it sits below both.

#include <lather/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lather {

/// The element types a checkpoint stores.
enum class DType { float32, float64, int8, int16, int32, int64 };
std::string to_string(DType dtype);
std::size_t size_of(DType dtype);
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::float64;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::int8;
}
template <>
constexpr DType dtype_of<std::int16_t>() {
  return DType::int16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::int32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::int64;
}

/// Bytes of a StateArray, unmanaged: the array's owner keeps the memory alive while it is read.
template <class MemorySpace>
using StateBytes = Kokkos::View<char*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// One array of state, described for checkpoints. The array's global shape is `shape`; this rank
/// stores either all of it, or (when `rows` is not empty) the listed rows of its leading
/// dimension, in that order. `writer` says whether this rank writes these bytes: of an array held
/// whole by several ranks with the same bytes (the same on every rank of the group), each writer
/// writes a share of its rows; a checkpoint restricts the writers further by its roles.
/// The bytes live in `device_bytes` (the owner's memory space) or `host_bytes`.
template <class MemorySpace>
struct StateArray {
  std::string name;
  DType dtype = DType::float32;
  TensorShape shape;
  std::vector<std::int64_t> rows;
  bool writer = true;
  /// >= 0: the array mirrors parameter `parameter` element by element (same shape), so with
  /// weight sharding it is stored and re-sharded like that parameter.
  int parameter = -1;
  /// With `rows`: the parameter each row belongs to, so that rows of parameters that every weight
  /// shard holds are written by one shard only. Empty: rows are not tied to parameters.
  std::vector<int> row_parameter;
  /// The leading dimension counts items of the optimizer's own numbering, in the order of its
  /// parameter list (Shampoo's statistics). Optimizers over consecutive parts of one parameter
  /// list (pipeline stages) store theirs one after the other in stage order: a checkpoint of
  /// several stages stacks stage s's items after those of the stages before it. A rank that
  /// holds none of a stacked array's items (no rows, no bytes) selects no rows of it.
  bool stacked = false;
  StateBytes<MemorySpace> device_bytes;
  StateBytes<Kokkos::HostSpace> host_bytes;

  std::int64_t row_elements() const;  ///< elements per leading-dimension row
  std::int64_t local_elements() const;
};

/// The step count as a state array: the int64 `step_host` (which the caller sets to its step
/// count and keeps alive while the array is read), a scalar named "step", written by `writer`
/// (the same on every rank that holds it: a checkpoint writes one copy).
template <class MemorySpace>
StateArray<MemorySpace> step_array(std::int64_t& step_host, bool writer = true) {
  StateArray<MemorySpace> step;
  step.name = "step";
  step.dtype = DType::int64;
  step.writer = writer;
  step.host_bytes = StateBytes<Kokkos::HostSpace>(reinterpret_cast<char*>(&step_host), sizeof step_host);
  return step;
}

/// Wraps the memory of a View's first `elements` elements as the bytes of a StateArray.
template <class MemorySpace, class View>
StateBytes<MemorySpace> as_bytes(const View& view, std::size_t elements) {
  using T = typename View::value_type;
  return StateBytes<MemorySpace>(reinterpret_cast<char*>(view.data()), elements * sizeof(T));
}

}  // namespace lather
