#pragma once
// The few places where Kokkos 3.4 (Debian) and Kokkos >= 4 differ, behind one spelling each.

#include <Kokkos_Core.hpp>

#include <string>

namespace lather {

/// The spaces Lather's compiled library is instantiated for.
using DefaultExecutionSpace = Kokkos::DefaultExecutionSpace;
using DefaultHostExecutionSpace = Kokkos::DefaultHostExecutionSpace;

namespace Impl {

// Math functions usable in kernels: Kokkos::Experimental in 3.4, Kokkos from 3.7 on.
#if KOKKOS_VERSION >= 30700
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

/// Finite test that needs no math library in device code: x - x is NaN for NaN and +-Inf.
template <class T>
KOKKOS_INLINE_FUNCTION bool is_finite(T x) {
  return x - x == T(0);
}

/// Fences `space`; the label shows up in Kokkos tools where the Kokkos version supports it.
template <class ExecutionSpace>
void fence(const ExecutionSpace& space, [[maybe_unused]] const std::string& why) {
#if KOKKOS_VERSION >= 30600
  space.fence(why);
#else
  space.fence();
#endif
}

/// A profiler region for the lifetime of the object (Kokkos::Profiling::ScopedRegion from Kokkos 4.1).
class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

/// True when host code may dereference Views of `MemorySpace` directly.
template <class MemorySpace>
inline constexpr bool host_accessible =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

}  // namespace Impl
}  // namespace lather
