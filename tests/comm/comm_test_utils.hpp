#pragma once
// Helpers of the comm tests: inputs that every rank can generate for every other rank (a hash of
// rank, tensor, index and a salt), Views made from host vectors and read back, and MPI basics.

#include <lather/core/error.hpp>
#include <lather/core/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/mpi_ranks.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lather::test {

using Exec = Kokkos::DefaultExecutionSpace;
using Memory = Exec::memory_space;

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A value in [-1, 1) determined by (rank, tensor, index, salt) alone.
inline double input_value(int rank, int tensor, std::int64_t index, int salt = 0) {
  std::uint64_t h = splitmix64(std::uint64_t(rank) + 0x1000u * std::uint64_t(salt));
  h = splitmix64(h ^ std::uint64_t(tensor));
  h = splitmix64(h ^ std::uint64_t(index));
  return double(h >> 11) * 0x1.0p-52 - 1.0;
}

template <class T>
Kokkos::View<T*, Memory> make_view(const std::vector<double>& values, const std::string& label = "test") {
  Kokkos::View<T*, Memory> view(label, values.size());
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = T(values[i]);
  Kokkos::deep_copy(view, host);
  return view;
}

template <class View>
std::vector<double> read_view(const View& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::vector<double> out(view.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = double(host.data()[i]);
  return out;
}

/// Tensors of the given sizes holding input_value(rank, t, i, salt), rounded to T.
template <class T>
TensorList<T, Memory> make_inputs(int rank, const std::vector<std::int64_t>& sizes, int salt = 0) {
  TensorList<T, Memory> tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    // static_cast, not std::size_t(sizes[t]): that spelling parses as a function declaration (the
    // most vexing parse), which clang and nvcc follow; only GCC reads it as a vector.
    std::vector<double> values(static_cast<std::size_t>(sizes[t]));
    for (std::int64_t i = 0; i < sizes[t]; ++i) values[i] = input_value(rank, int(t), i, salt);
    tensors.push_back(make_view<T>(values, "input_" + std::to_string(t)));
  }
  return tensors;
}

/// make_inputs, with the tensors one after the other in one buffer (a ParameterList's layout):
/// the reducer works on them in place.
template <class T>
TensorList<T, Memory> make_contiguous_inputs(int rank, const std::vector<std::int64_t>& sizes, int salt = 0) {
  std::vector<double> values;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::int64_t i = 0; i < sizes[t]; ++i) values.push_back(input_value(rank, int(t), i, salt));
  const auto buffer = make_view<T>(values, "inputs");
  TensorList<T, Memory> tensors;
  std::size_t offset = 0;
  for (auto n : sizes) {
    tensors.push_back(Kokkos::subview(buffer, std::make_pair(offset, offset + std::size_t(n))));
    offset += std::size_t(n);
  }
  return tensors;
}

/// The value of input_value as the tensor holds it (rounded to T).
template <class T>
double stored_input(int rank, int tensor, std::int64_t index, int salt = 0) {
  return double(T(input_value(rank, tensor, index, salt)));
}

/// Runs `body`, which must throw lather::Error with a message containing `needle`.
inline void expect_error(const std::function<void()>& body, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "expected a lather::Error containing '" << needle << "', nothing was thrown";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos)
        << "message '" << e.message() << "' does not contain '" << needle << "'";
  }
}

}  // namespace lather::test
