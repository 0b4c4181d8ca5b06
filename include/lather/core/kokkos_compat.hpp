#pragma once
// The few places where Kokkos 3.4 (Debian) and Kokkos >= 4 differ, behind one spelling each.

#include <lather/core/config.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace lather {

/// The spaces Lather's compiled library is instantiated for: the default execution space, and
/// on device builds (where it differs) the default host space too.
using DefaultExecutionSpace = Kokkos::DefaultExecutionSpace;
using DefaultHostExecutionSpace = Kokkos::DefaultHostExecutionSpace;

#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
#define LATHER_HOST_SPACE_DIFFERS 1
#else
#define LATHER_HOST_SPACE_DIFFERS 0
#endif

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
inline constexpr bool host_accessible = Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

/// True for execution spaces that run on the host's cores (Serial, OpenMP, Threads): element-wise
/// kernels give each call a run of elements, a loop the host compiler vectorises; device spaces
/// give each thread one element.
template <class ExecutionSpace>
inline constexpr bool runs_on_host = Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible;

/// Vector lanes per team thread for kernels that walk a matrix's rows with TeamThreadRange and its
/// columns with ThreadVectorRange: a warp on a device, so that consecutive lanes read a row's
/// consecutive columns in one coalesced run (with one lane, a warp's threads would each read their
/// own row, a row's length apart); one on the host, whose vector loops are the compiler's.
/// (32, or a backend's smaller limit, such as a 16-wide SYCL sub-group.)
template <class ExecutionSpace>
int row_vector_length() {
  if constexpr (runs_on_host<ExecutionSpace>) return 1;
  return std::min(32, int(Kokkos::TeamPolicy<ExecutionSpace>::vector_length_max()));
}

/// One team per league entry with row_vector_length lanes per thread. Every lane runs a
/// TeamThreadRange body: a write there outside a ThreadVectorRange must give the same value on
/// every lane or sit in single(PerThread).
template <class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> row_team_policy(const ExecutionSpace& space, int league) {
  return Kokkos::TeamPolicy<ExecutionSpace>(space, league, Kokkos::AUTO, row_vector_length<ExecutionSpace>());
}

/// The two families of kernel bodies. A kernel with a body per family keeps one entry point that
/// passes BodyFor<ExecutionSpace>{} to its overloads, as Kokkos Kernels keeps one public call per
/// kernel and picks the implementation behind it: host backends (Serial, OpenMP, Threads) run a
/// loop per row or run of elements, which the host compiler vectorises; device backends (CUDA,
/// HIP, SYCL) a thread per element or a team per row.
struct HostBody {};
struct DeviceBody {};
template <class ExecutionSpace>
using BodyFor = std::conditional_t<runs_on_host<ExecutionSpace>, HostBody, DeviceBody>;

/// Elements per call of an element-wise kernel on `ExecutionSpace` (see runs_on_host): a *run* is
/// such a range of consecutive elements, one call of the kernel's body.
template <class ExecutionSpace>
inline constexpr std::int64_t run_elements = runs_on_host<ExecutionSpace> ? 2048 : 1;

/// The bodies of parallel_for_runs. On the host a host lambda: on a device build the host-space
/// callers pass plain lambdas, and nvcc lets no device lambda capture one.
template <class ExecutionSpace, class F>
void for_runs(HostBody, const char* label, const ExecutionSpace& space, std::int64_t n, const F& f) {
  constexpr std::int64_t run = run_elements<ExecutionSpace>;
  const std::int64_t runs = (n + run - 1) / run;
  const Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>> policy(space, 0, runs);
  Kokkos::parallel_for(label, policy, [=](std::int64_t r) { f(r * run, r * run + run < n ? r * run + run : n); });
}
template <class ExecutionSpace, class F>
void for_runs(DeviceBody, const char* label, const ExecutionSpace& space, std::int64_t n, const F& f) {
  const Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>> policy(space, 0, n);
  Kokkos::parallel_for(
      label, policy, KOKKOS_LAMBDA(std::int64_t r) { f(r, r + 1); });
}

/// f(begin, end) over [0, n) in runs of run_elements<ExecutionSpace>: one loop per call that the
/// caller writes with local scalars and restrict pointers, so that the host compiler vectorises it.
template <class ExecutionSpace, class F>
void parallel_for_runs(const char* label, const ExecutionSpace& space, std::int64_t n, const F& f) {
  for_runs(BodyFor<ExecutionSpace>{}, label, space, n, f);
}

/// The number of NaN and +-Inf values in data[0, n) (is_finite). Counted over runs of elements in
/// an integer, a loop the host compiler vectorises (a per-element reduction through Kokkos is not
/// vectorised, and on a gradient of a few MB costs a large fraction of a gradient mean's time); a
/// device gives each thread one element. Waits for its result on `space`.
template <class ExecutionSpace, class Scalar>
std::int64_t count_non_finite(const ExecutionSpace& space, const Scalar* data, std::int64_t n) {
  constexpr std::int64_t run = run_elements<ExecutionSpace>;
  const std::int64_t runs = (n + run - 1) / run;
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "Lather::count_non_finite", Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, runs),
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t & count) {
        const std::int64_t begin = r * run, end = begin + run < n ? begin + run : n;
        const Scalar* KOKKOS_RESTRICT x = data + begin;
        int local = 0;
        for (std::int64_t i = 0; i < end - begin; ++i) local += is_finite(x[i]) ? 0 : 1;
        count += local;
      },
      bad);
  return bad;
}

}  // namespace Impl

/// Kokkos for the lifetime of a command-line program: initializes Kokkos from the arguments
/// (taking out its --kokkos-* ones) and leaves the rest in argc/argv for the program's own
/// parser. --help and -h are kept from Kokkos, which would otherwise print its own help first.
class KokkosSession {
 public:
  KokkosSession(int& argc, char**& argv) {
    std::vector<char*> kokkos_args, help;
    for (int i = 0; i < argc; ++i) {
      const bool is_help = i > 0 && (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0);
      (is_help ? help : kokkos_args).push_back(argv[i]);
    }
    int count = int(kokkos_args.size());
    kokkos_args.push_back(nullptr);
    m_guard = std::make_unique<Kokkos::ScopeGuard>(count, kokkos_args.data());
    m_args.assign(kokkos_args.begin(), kokkos_args.begin() + count);
    m_args.insert(m_args.end(), help.begin(), help.end());
    m_args.push_back(nullptr);
    argc = int(m_args.size()) - 1;
    argv = m_args.data();
  }

 private:
  std::unique_ptr<Kokkos::ScopeGuard> m_guard;
  std::vector<char*> m_args;
};

}  // namespace lather
