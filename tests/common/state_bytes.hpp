#pragma once
// An optimizer's state arrays (StateArray) as host bytes and back, as a checkpoint writes and
// loads them, whatever memory space the arrays live in.

#include <lather/optim/optimizer.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace lather::test {

/// The bytes of one array (its host or its device bytes, whichever it has).
template <class MemorySpace>
std::vector<char> state_bytes(const optim::StateArray<MemorySpace>& a) {
  std::vector<char> bytes(a.host_bytes.data() ? a.host_bytes.size() : a.device_bytes.size());
  if (a.host_bytes.data())
    std::copy_n(a.host_bytes.data(), bytes.size(), bytes.data());
  else
    Kokkos::deep_copy(Kokkos::View<char*, Kokkos::HostSpace>(bytes.data(), bytes.size()), a.device_bytes);
  return bytes;
}

/// The bytes of every array, in order.
template <class MemorySpace>
std::vector<std::vector<char>> state_bytes(const std::vector<optim::StateArray<MemorySpace>>& arrays) {
  std::vector<std::vector<char>> out;
  for (const auto& a : arrays) out.push_back(state_bytes(a));
  return out;
}

/// Writes saved[i] into array i, as a checkpoint load does; each size must match its array's.
template <class MemorySpace>
void fill_state(const std::vector<optim::StateArray<MemorySpace>>& arrays,
                const std::vector<std::vector<char>>& saved) {
  ASSERT_EQ(arrays.size(), saved.size());
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    ASSERT_EQ(saved[i].size(), a.host_bytes.data() ? a.host_bytes.size() : a.device_bytes.size()) << a.name;
    if (a.host_bytes.data())
      std::copy_n(saved[i].data(), saved[i].size(), a.host_bytes.data());
    else
      Kokkos::deep_copy(a.device_bytes, Kokkos::View<const char*, Kokkos::HostSpace>(saved[i].data(), saved[i].size()));
  }
}

}  // namespace lather::test
