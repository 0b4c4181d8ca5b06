#pragma once
// The check of the whole gradient that Shampoo, SOAP and Muon make before a step changes any
// state. A distributed step reads only the blocks of a rank's own part, so without it a NaN or
// Inf in a rank's copy of a block that another rank updates would pass unseen (the ranks' copies
// should agree after the gradient reduction, but nothing makes them). Every rank scans all of its
// gradient, and the optimizer agrees on the verdicts over its group with its step's failure
// agreement, so that every rank throws the same error, naming the parameter.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

namespace lather::optim::Impl {

/// The index of the first parameter whose gradient holds a NaN or an Inf, -1 when none does. One
/// pass over each run of gradients that lie one after another in memory (a ParameterList's
/// buffer: the whole gradient in one pass); only where a run holds one, a pass per gradient of the
/// run to find it. Waits for its result on `space`.
template <class ExecutionSpace, class Scalar, class MemorySpace>
int first_non_finite(const ExecutionSpace& space, const TensorList<Scalar, MemorySpace>& gradients) {
  const auto follows = [&](std::size_t p) {
    return gradients[p].data() == gradients[p - 1].data() + gradients[p - 1].extent(0);
  };
  for (std::size_t first = 0, end = 0; first < gradients.size(); first = end) {
    std::int64_t elements = std::int64_t(gradients[first].extent(0));
    for (end = first + 1; end < gradients.size() && follows(end); ++end)
      elements += std::int64_t(gradients[end].extent(0));
    if (::lather::Impl::count_non_finite(space, gradients[first].data(), elements) == 0) continue;
    for (std::size_t p = first; p < end; ++p)
      if (::lather::Impl::count_non_finite(space, gradients[p].data(), std::int64_t(gradients[p].extent(0))) > 0)
        return int(p);
  }
  return -1;
}

/// What step() says of the gradient of parameter `name` when it holds a NaN or an Inf.
inline std::string non_finite_gradient_message(const std::string& name) {
  return ::lather::Impl::concat("the gradient of '", name,
                                "' contains NaN or Inf; the optimizer state was not changed");
}

}  // namespace lather::optim::Impl
