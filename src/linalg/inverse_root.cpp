#include <lather/linalg/inverse_root.hpp>

#include <lather/core/host_blas_threads.hpp>
#include <lather/core/host_threads.hpp>

#include "coupled_newton.hpp"
#include "eigh_on_space.hpp"
#include "eigh_root.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <utility>

namespace lather::linalg {

bool InverseRootResult::accepted(std::size_t task, double failure_threshold) const {
  return status[task] != RootStatus::non_finite && std::isfinite(error[task]) && error[task] < failure_threshold;
}

void InverseRootResult::resize(std::size_t n) {
  error.assign(n, 0.0);
  iterations.assign(n, 0);
  power_iterations.assign(n, 0);
  lambda_max.assign(n, 0.0);
  ridge.assign(n, 0.0);
  status.assign(n, RootStatus::converged);
}

namespace Impl {

std::vector<double> power_iteration_start_vector(int n) {
  // numpy's legacy RandomState(seed) seeds MT19937 with init_genrand(seed) -- the same as
  // std::mt19937(seed) -- and random_sample() is genrand_res53.
  std::mt19937 generator(1729);
  std::vector<double> v(std::max(n, 0));
  for (auto& x : v) {
    const std::uint32_t a = generator() >> 5, b = generator() >> 6;
    const double sample = (a * 67108864.0 + b) / 9007199254740992.0;
    x = -1.0 + 2.0 * sample;
  }
  return v;
}

namespace {

template <class ExecutionSpace, class S, class C>
void solve_newton(const ExecutionSpace& space,
                  const MatrixStack<const S, typename ExecutionSpace::memory_space>& matrices,
                  const MatrixStack<S, typename ExecutionSpace::memory_space>& roots,
                  const std::vector<RootTask>& tasks, const InverseRootOptions& options, InverseRootResult& result,
                  GemmCount& count, bool lockstep) {
  using memory_space = typename ExecutionSpace::memory_space;
  std::vector<int> scalars;
  std::map<std::pair<int, int>, std::vector<int>> groups;  // (n, p) -> task positions
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    if (tasks[t].size == 1)
      scalars.push_back(int(t));
    else
      groups[{tasks[t].size, tasks[t].exponent}].push_back(int(t));
  }

  if (!scalars.empty()) {
    const int count_scalars = int(scalars.size());
    Array1<int, memory_space> matrix_of("Lather::inverse_pth_root::scalar_matrix", count_scalars);
    Array1<int, memory_space> exponent("Lather::inverse_pth_root::scalar_exponent", count_scalars);
    auto matrix_host = Kokkos::create_mirror_view(matrix_of);
    auto exponent_host = Kokkos::create_mirror_view(exponent);
    for (int k = 0; k < count_scalars; ++k) {
      matrix_host(k) = tasks[scalars[k]].index;
      exponent_host(k) = tasks[scalars[k]].exponent;
    }
    Kokkos::deep_copy(space, matrix_of, matrix_host);
    Kokkos::deep_copy(space, exponent, exponent_host);
    Array1<C, memory_space> lambda("Lather::inverse_pth_root::scalar_lambda", count_scalars);
    Array1<C, memory_space> ridge("Lather::inverse_pth_root::scalar_ridge", count_scalars);
    Array1<int, memory_space> ok("Lather::inverse_pth_root::scalar_ok", count_scalars);
    scalar_roots<ExecutionSpace, S, C, memory_space>(space, matrices, roots, matrix_of, exponent, count_scalars,
                                                     C(options.ridge_epsilon), options.relative_ridge, lambda, ridge,
                                                     ok);
    auto lambda_host = Kokkos::create_mirror_view(lambda);
    auto ridge_host = Kokkos::create_mirror_view(ridge);
    auto ok_host = Kokkos::create_mirror_view(ok);
    Kokkos::deep_copy(space, lambda_host, lambda);
    Kokkos::deep_copy(space, ridge_host, ridge);
    Kokkos::deep_copy(space, ok_host, ok);
    fence(space, "Lather::inverse_pth_root: scalar roots on the host");
    for (int k = 0; k < count_scalars; ++k) {
      const int t = scalars[k];
      result.lambda_max[t] = double(lambda_host(k));
      result.ridge[t] = double(ridge_host(k));
      result.iterations[t] = 0;
      result.status[t] = ok_host(k) ? RootStatus::converged : RootStatus::non_finite;
      result.error[t] = ok_host(k) ? 0.0 : std::numeric_limits<double>::infinity();
    }
  }

  for (const auto& [key, positions] : groups) {
    const auto [n, p] = key;
    // On the host one matrix at a time keeps its working set in cache; lockstep chunks only pay
    // off where one kernel launch serves many matrices (a device, or `lockstep`: the device's way
    // taken on the host, for the tests).
    const std::size_t fit = host_accessible<memory_space> && !lockstep
                                ? 1
                                : options.workspace_bytes / CoupledNewton<ExecutionSpace, C>::bytes_per_matrix(n);
    const int capacity = int(std::max<std::size_t>(1, std::min<std::size_t>(fit, positions.size())));
    CoupledNewton<ExecutionSpace, C> newton(space, capacity, n, options, !host_accessible<memory_space> || lockstep);
    for (std::size_t begin = 0; begin < positions.size(); begin += capacity) {
      const std::size_t end = std::min(positions.size(), begin + capacity);
      const std::vector<int> chunk(positions.begin() + begin, positions.begin() + end);
      newton.solve(matrices, roots, tasks, chunk, p, result, count);
    }
  }
}

/// eigh_inverse_root, with the 1 x 1 case in closed form.
template <class C>
EighOutcome eigh_root_any_size(std::vector<C>& matrix, int n, int exponent, const InverseRootOptions& options,
                               std::vector<C>& root, GemmCount& count, EighWorkspace<C>& workspace) {
  if (n > 1) return eigh_inverse_root<C>(matrix, n, exponent, options, root, count, workspace);
  EighOutcome outcome;
  const double a = double(matrix[0]);
  outcome.lambda_max = a;
  outcome.ridge = double(C(options.relative_ridge ? options.ridge_epsilon * std::max(a, 1e-6) : options.ridge_epsilon));
  root.assign(1, C(std::pow(double(C(a + outcome.ridge)), -1.0 / exponent)));
  const bool ok = std::isfinite(a) && std::isfinite(double(root[0])) && a + outcome.ridge > 0;
  outcome.status = ok ? RootStatus::converged : RootStatus::non_finite;
  outcome.error = ok ? 0.0 : std::numeric_limits<double>::infinity();
  return outcome;
}

/// The eigh roots of `tasks`, read from `in` and written to `out` (host-accessible stacks of the
/// same padded size) by options.host_threads threads, each taking the next task until none is left
/// (those of `space` where it is a threaded host backend); no Kokkos call is made in a thread. The
/// results land at the task's own index, so they do not depend on the number of threads. A root
/// that is not finite is not written, as on every path.
template <class C, class ExecutionSpace, class In, class Out>
void eigh_on_host_threads(const ExecutionSpace& space, const In& in, const Out& out, const std::vector<RootTask>& tasks,
                          const InverseRootOptions& options, InverseRootResult& result, GemmCount& count) {
  using S = typename Out::non_const_value_type;
  const int padded = int(in.extent(1));
  const int threads = std::max(1, std::min(options.host_threads, int(tasks.size())));
  struct Scratch {
    std::vector<C> matrix, root;
    EighWorkspace<C> workspace;
    GemmCount count;
  };
  std::vector<Scratch> scratch(static_cast<std::size_t>(threads));
  // Every LAPACK call on one BLAS thread, however many threads take the roots: a threaded BLAS
  // under each would start more threads than the CPUs the pool is sized to (OpenBLAS's threads
  // under each root thread make Shampoo train measurably slower than one; benchmarks.md), and
  // OpenBLAS on 2 threads rounds some of dsyevd's products differently from 1, so the roots' bits
  // would depend on the pool's size (test_shampoo's RootHostThreadsDoNotChangeTheTrajectory).
  const ScopedHostBlasThreads one_blas_thread(1);
  ::lather::Impl::for_each_on_host_threads(space, threads, tasks.size(), [&](int thread, std::size_t t) {
    Scratch& own = scratch[std::size_t(thread)];
    const auto& task = tasks[t];
    const int n = task.size;
    own.matrix.resize(std::size_t(n) * n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) own.matrix[std::size_t(i) * n + j] = C(in(task.index, i, j));
    const EighOutcome outcome =
        eigh_root_any_size<C>(own.matrix, n, task.exponent, options, own.root, own.count, own.workspace);
    result.error[t] = outcome.error;
    result.iterations[t] = 0;
    result.lambda_max[t] = outcome.lambda_max;
    result.ridge[t] = outcome.ridge;
    result.status[t] = outcome.status;
    if (outcome.status == RootStatus::non_finite) return;
    for (int i = 0; i < padded; ++i)
      for (int j = 0; j < padded; ++j)
        out(task.index, i, j) = (i < n && j < n) ? S(own.root[std::size_t(i) * n + j]) : S(i == j);
  });
  for (const auto& own : scratch) count.flops += own.count.flops, count.calls += own.count.calls;
}

template <class ExecutionSpace, class S, class C>
void solve_eigh(const ExecutionSpace& space,
                const MatrixStack<const S, typename ExecutionSpace::memory_space>& matrices,
                const MatrixStack<S, typename ExecutionSpace::memory_space>& roots, const std::vector<RootTask>& tasks,
                const InverseRootOptions& options, InverseRootResult& result, GemmCount& count) {
  using memory_space = typename ExecutionSpace::memory_space;
  if constexpr (::lather::Impl::host_accessible<memory_space>) {
    // The host reads the stack and writes the roots where they are: no staging copies (on the
    // transformer set, two 32 MB stacks allocated, filled and copied back at every root step).
    fence(space, "Lather::inverse_pth_root: matrices ready for the host");
    eigh_on_host_threads<C>(space, matrices, roots, tasks, options, result, count);
  } else {
    const int padded = int(matrices.extent(1));
    using HostStack = Kokkos::View<S***, Kokkos::LayoutRight, Kokkos::HostSpace>;
    // The stack on the host in one copy, up to the last matrix a task names (Shampoo's last chunk
    // fills only a prefix of its stack, and its float64 retries name a few matrices); the roots
    // computed there, then copied back one by one (a root that is not finite is not written, as
    // on every path).
    std::size_t used = 0;
    for (const auto& task : tasks) used = std::max(used, std::size_t(task.index) + 1);
    HostStack host_in(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::inverse_pth_root::eigh_in"), used,
                      padded, padded);
    HostStack host_out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::inverse_pth_root::eigh_out"), used,
                       padded, padded);
    Kokkos::deep_copy(space, host_in,
                      Kokkos::subview(matrices, std::make_pair(std::size_t(0), used), Kokkos::ALL, Kokkos::ALL));
    fence(space, "Lather::inverse_pth_root: matrices on the host");
    eigh_on_host_threads<C>(space, host_in, host_out, tasks, options, result, count);
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      if (result.status[t] == RootStatus::non_finite) continue;
      const auto at = std::size_t(tasks[t].index);
      Kokkos::deep_copy(space, Kokkos::subview(roots, at, Kokkos::ALL, Kokkos::ALL),
                        Kokkos::subview(host_out, at, Kokkos::ALL, Kokkos::ALL));
    }
    // Before host_out goes: the copies on `space` may still read it. (In place, the threads have
    // written the roots when they are joined, and solve() fences `space` after either way.)
    fence(space, "Lather::inverse_pth_root: roots on the device");
  }
}

/// Where the roots are taken: as the method says, or the device's way on any space (the eigh
/// roots by the space's own eigensolver; Newton in lockstep chunks with the team power iteration).
enum class RootPath { as_method, eigh_on_space, newton_lockstep };

template <class ExecutionSpace, class Scalar>
InverseRootResult solve_roots(const ExecutionSpace& space,
                              const MatrixStack<const Scalar, typename ExecutionSpace::memory_space>& matrices,
                              const MatrixStack<Scalar, typename ExecutionSpace::memory_space>& roots,
                              const std::vector<RootTask>& tasks, const InverseRootOptions& options, RootPath path) {
  using memory_space = typename ExecutionSpace::memory_space;
  ScopedRegion region("Lather::linalg::inverse_pth_root");
  options.validate();
  const long count = long(matrices.extent(0)), padded = long(matrices.extent(1));
  LATHER_REQUIRE(long(matrices.extent(2)) == padded, "inverse_pth_root: matrices must be square, got a stack of ",
                 count, " matrices ", padded, " x ", matrices.extent(2));
  LATHER_REQUIRE(roots.extent(0) == matrices.extent(0) && roots.extent(1) == matrices.extent(1) &&
                     roots.extent(2) == matrices.extent(2),
                 "inverse_pth_root: roots [", roots.extent(0), ", ", roots.extent(1), ", ", roots.extent(2),
                 "] must have the shape of matrices [", count, ", ", padded, ", ", padded, "]");
  std::set<int> seen;
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    const auto& task = tasks[t];
    LATHER_REQUIRE(task.index >= 0 && task.index < count, "inverse_pth_root: task ", t, " names matrix ", task.index,
                   " of a stack of ", count);
    LATHER_REQUIRE(task.size >= 1 && task.size <= padded, "inverse_pth_root: task ", t, " has size ", task.size,
                   ", expected 1..", padded);
    LATHER_REQUIRE(task.exponent >= 1, "inverse_pth_root: task ", t, " has exponent ", task.exponent,
                   ", expected >= 1");
    LATHER_REQUIRE(seen.insert(task.index).second, "inverse_pth_root: matrix ", task.index,
                   " is named by more than one task");
  }

  InverseRootResult result;
  result.resize(tasks.size());
  GemmCount gemms;
  const bool use_double = options.compute_precision == Precision::float64;
  // eigh on a device with an eigensolver stays on the device; eigh_host, and eigh on a host backend
  // (where the host path reads the stack in place), go to LAPACK on host threads.
  const bool eigh_on_space =
      path == RootPath::eigh_on_space || (options.method == RootMethod::eigh && !host_accessible<memory_space> &&
                                          has_batched_eigensolver<ExecutionSpace>());
  if (options.method == RootMethod::newton) {
    const bool lockstep = path == RootPath::newton_lockstep;
    if (use_double)
      solve_newton<ExecutionSpace, Scalar, double>(space, matrices, roots, tasks, options, result, gemms, lockstep);
    else
      solve_newton<ExecutionSpace, Scalar, float>(space, matrices, roots, tasks, options, result, gemms, lockstep);
  } else if (eigh_on_space) {
    if (use_double)
      solve_eigh_on_space<ExecutionSpace, Scalar, double>(space, matrices, roots, tasks, options, result, gemms);
    else
      solve_eigh_on_space<ExecutionSpace, Scalar, float>(space, matrices, roots, tasks, options, result, gemms);
  } else {
    if (use_double)
      solve_eigh<ExecutionSpace, Scalar, double>(space, matrices, roots, tasks, options, result, gemms);
    else
      solve_eigh<ExecutionSpace, Scalar, float>(space, matrices, roots, tasks, options, result, gemms);
  }
  fence(space, "Lather::linalg::inverse_pth_root: roots ready");
  result.gemm_flops = gemms.flops;
  result.gemm_calls = gemms.calls;
  return result;
}

}  // namespace

template <class ExecutionSpace, class Scalar>
InverseRootResult InverseRootSolver<ExecutionSpace, Scalar>::solve(
    const ExecutionSpace& space, const MatrixStack<const Scalar, memory_space>& matrices,
    const MatrixStack<Scalar, memory_space>& roots, const std::vector<RootTask>& tasks,
    const InverseRootOptions& options) {
  return solve_roots<ExecutionSpace, Scalar>(space, matrices, roots, tasks, options, RootPath::as_method);
}

template <class ExecutionSpace, class Scalar>
InverseRootResult InverseRootSolver<ExecutionSpace, Scalar>::solve_eigh_on_space(
    const ExecutionSpace& space, const MatrixStack<const Scalar, memory_space>& matrices,
    const MatrixStack<Scalar, memory_space>& roots, const std::vector<RootTask>& tasks,
    const InverseRootOptions& options) {
  LATHER_REQUIRE(has_batched_eigensolver<ExecutionSpace>(), "inverse_pth_root: ", ExecutionSpace::name(),
                 " has no eigensolver of its own");
  InverseRootOptions eigh = options;
  eigh.method = RootMethod::eigh;
  return solve_roots<ExecutionSpace, Scalar>(space, matrices, roots, tasks, eigh, RootPath::eigh_on_space);
}

template <class ExecutionSpace, class Scalar>
InverseRootResult InverseRootSolver<ExecutionSpace, Scalar>::solve_newton_lockstep(
    const ExecutionSpace& space, const MatrixStack<const Scalar, memory_space>& matrices,
    const MatrixStack<Scalar, memory_space>& roots, const std::vector<RootTask>& tasks,
    const InverseRootOptions& options) {
  InverseRootOptions newton = options;
  newton.method = RootMethod::newton;
  return solve_roots<ExecutionSpace, Scalar>(space, matrices, roots, tasks, newton, RootPath::newton_lockstep);
}

template struct InverseRootSolver<DefaultExecutionSpace, float>;
template struct InverseRootSolver<DefaultExecutionSpace, double>;
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
template struct InverseRootSolver<DefaultHostExecutionSpace, float>;
template struct InverseRootSolver<DefaultHostExecutionSpace, double>;
#endif

}  // namespace Impl

template <class C>
HostRootOutcome eigh_inverse_pth_root_on_host(std::vector<C>& matrix, int n, int p, const InverseRootOptions& options,
                                              std::vector<C>& root) {
  options.validate();
  LATHER_REQUIRE(n >= 1 && matrix.size() >= std::size_t(n) * n, "eigh_inverse_pth_root_on_host: a ", n, " x ", n,
                 " matrix needs ", std::size_t(n) * n, " values, got ", matrix.size());
  LATHER_REQUIRE(p >= 1, "eigh_inverse_pth_root_on_host: exponent ", p, ", expected >= 1");
  thread_local Impl::EighWorkspace<C> workspace;  // one per root thread, kept between roots
  Impl::GemmCount count;
  const auto outcome = Impl::eigh_root_any_size<C>(matrix, n, p, options, root, count, workspace);
  return {outcome.error, outcome.lambda_max, outcome.ridge, outcome.status};
}
template HostRootOutcome eigh_inverse_pth_root_on_host<float>(std::vector<float>&, int, int, const InverseRootOptions&,
                                                              std::vector<float>&);
template HostRootOutcome eigh_inverse_pth_root_on_host<double>(std::vector<double>&, int, int,
                                                               const InverseRootOptions&, std::vector<double>&);

}  // namespace lather::linalg
