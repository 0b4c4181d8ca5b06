#pragma once
// Host copies of rank-1 Views (a model's tensors) for comparisons in tests, whatever the memory
// space: through a host mirror, never by reading device memory.

#include <Kokkos_Core.hpp>

#include <type_traits>
#include <vector>

namespace lather::test {

/// The elements of `v` as std::vector<Out> (Out defaults to the View's own element type).
template <class Out = void, class T, class... Properties>
auto host_vector(const Kokkos::View<T*, Properties...>& v) {
  using Element = std::conditional_t<std::is_void<Out>::value, std::remove_const_t<T>, Out>;
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<Element>(h.data(), h.data() + h.size());
}

/// host_vector of every tensor of a list.
template <class Out = void, class T, class... Properties>
auto host_vectors(const std::vector<Kokkos::View<T*, Properties...>>& tensors) {
  std::vector<decltype(host_vector<Out>(tensors.front()))> out;
  for (const auto& t : tensors) out.push_back(host_vector<Out>(t));
  return out;
}

}  // namespace lather::test
