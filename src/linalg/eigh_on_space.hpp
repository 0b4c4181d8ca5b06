#pragma once
// Inverse p-th roots by eigendecomposition on the execution space itself (RootMethod::eigh on a
// device): the matrices of one size are gathered into a chunk, decomposed by the space's batched
// eigensolver (batched_eigensolver.hpp), and the roots formed there with strided-batched GEMMs,
// with no copy through the host but the per-matrix outcomes. Same formulas, error measure and
// statuses as the host path (eigh_root.cpp):
//   ridge = ridge_epsilon * max(lambda_max, 1e-6) (relative) or ridge_epsilon,
//   mu_k = (max(lambda_k, 0) + ridge)^(-1/p), H = V diag(mu) V^T = W^T W with W = diag(sqrt mu) V,
//   error = max |H^p (A + ridge I) - I| with H^p = V diag(mu^p) V^T.
// A matrix that is not finite, that the solver rejects, or whose root is not finite is reported
// non_finite and its output left untouched.

#include <lather/linalg/inverse_root.hpp>

#include "batched_eigensolver.hpp"
#include "batched_gemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

namespace lather::linalg::Impl {

/// One chunk's working copies, in the compute precision C.
template <class C, class MemorySpace>
struct EighChunk {
  Stack3<C, MemorySpace> original;  ///< A, then A + ridge I
  Stack3<C, MemorySpace> vectors;   ///< A, then its eigenvectors (rows), then the residual
  Stack3<C, MemorySpace> scaled;    ///< W, then H^p
  Stack3<C, MemorySpace> root;      ///< H
  Array2<C, MemorySpace> eigenvalues, root_factor, power_factor;
  Array1<int, MemorySpace> info, nonfinite;
  /// Per slot: lambda_max, ridge, error, and whether the root is written (eigh_errors).
  Array2<double, MemorySpace> outcome;

  static std::size_t bytes_per_matrix(int n) {
    return (4 * std::size_t(n) * n + 3 * std::size_t(n)) * sizeof(C) + 2 * sizeof(int) + 4 * sizeof(double);
  }

  EighChunk(int capacity, int n)
      : original(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::eigh_on_space::original"), capacity, n, n),
        vectors(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::eigh_on_space::vectors"), capacity, n, n),
        scaled(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::eigh_on_space::scaled"), capacity, n, n),
        root(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::eigh_on_space::root"), capacity, n, n),
        eigenvalues("Lather::eigh_on_space::eigenvalues", capacity, n),
        root_factor("Lather::eigh_on_space::root_factor", capacity, n),
        power_factor("Lather::eigh_on_space::power_factor", capacity, n),
        info("Lather::eigh_on_space::info", capacity),
        nonfinite("Lather::eigh_on_space::nonfinite", capacity),
        outcome("Lather::eigh_on_space::outcome", capacity, 4) {}
};

/// Copies the leading n x n block of input(matrix_of(s)) into vectors(s) and original(s) in
/// precision C (the Newton solver's load_matrices, which also counts the values that are not
/// finite); a matrix with any is replaced by the identity for the solver (its root is not written).
template <class ExecutionSpace, class S, class C, class MemorySpace>
void gather_for_eigh(const ExecutionSpace& space, const Stack3<const S, MemorySpace>& input,
                     const Array1<const int, MemorySpace>& matrix_of, int slots, int n,
                     const EighChunk<C, MemorySpace>& chunk) {
  load_matrices<ExecutionSpace, S, C, MemorySpace>(space, input, matrix_of, slots, n, chunk.vectors, chunk.nonfinite);
  using Policy = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>;
  const std::int64_t nn = std::int64_t(n) * n;
  const auto vectors = chunk.vectors, original = chunk.original;
  const auto nonfinite = chunk.nonfinite;
  Kokkos::parallel_for(
      "Lather::eigh_on_space::keep_original", Policy(space, 0, slots * nn), KOKKOS_LAMBDA(std::int64_t at) {
        const int s = int(at / nn), i = int(at % nn / n), j = int(at % n);
        original(s, i, j) = vectors(s, i, j);
        if (nonfinite(s) > 0) vectors(s, i, j) = C(i == j);
      });
}

/// From the eigenvalues: lambda_max, the ridge, sqrt(mu_k) and mu_k^(p/2) per row, and A + ridge I.
template <class ExecutionSpace, class C, class MemorySpace>
void eigh_factors(const ExecutionSpace& space, int slots, int n, int p, const InverseRootOptions& options,
                  const EighChunk<C, MemorySpace>& chunk) {
  const auto w = chunk.eigenvalues, root_factor = chunk.root_factor, power_factor = chunk.power_factor;
  const auto original = chunk.original;
  const auto outcome = chunk.outcome;
  const double epsilon = options.ridge_epsilon;
  const bool relative = options.relative_ridge;
  Kokkos::parallel_for(
      "Lather::eigh_on_space::factors", Kokkos::RangePolicy<ExecutionSpace>(space, 0, slots * n),
      KOKKOS_LAMBDA(int at) {
        const int s = at / n, k = at % n;
        const double lambda_max = double(w(s, n - 1));
        const double ridge = relative ? epsilon * (lambda_max > 1e-6 ? lambda_max : 1e-6) : epsilon;
        const C ridge_c = C(ridge);
        // A is PSD: negative rounding noise is dropped, a truly indefinite input shows in the residual.
        const double lambda = double(w(s, k));
        const double shifted = (lambda > 0 ? lambda : 0.0) + double(ridge_c);
        const C mu = C(kmath::pow(shifted, -1.0 / p));
        root_factor(s, k) = C(kmath::sqrt(double(mu)));
        power_factor(s, k) = C(kmath::pow(double(mu), 0.5 * p));
        original(s, k, k) += ridge_c;
        if (k == 0) {
          outcome(s, 0) = lambda_max;
          outcome(s, 1) = double(ridge_c);
        }
      });
}

/// scaled(s) = diag(root_factor) V, vectors(s) = diag(power_factor) V, V's rows the eigenvectors.
template <class ExecutionSpace, class C, class MemorySpace>
void scale_eigenvectors(const ExecutionSpace& space, int slots, int n, const EighChunk<C, MemorySpace>& chunk) {
  using Policy = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>;
  const std::int64_t nn = std::int64_t(n) * n;
  const auto vectors = chunk.vectors, scaled = chunk.scaled;
  const auto root_factor = chunk.root_factor, power_factor = chunk.power_factor;
  Kokkos::parallel_for(
      "Lather::eigh_on_space::scale", Policy(space, 0, slots * nn), KOKKOS_LAMBDA(std::int64_t at) {
        const int s = int(at / nn), k = int(at % nn / n), i = int(at % n);
        const C v = vectors(s, k, i);
        scaled(s, k, i) = root_factor(s, k) * v;
        vectors(s, k, i) = power_factor(s, k) * v;
      });
}

/// outcome(s, 2) = max |residual - I| (+inf if not finite); outcome(s, 3) = 1 where the input was
/// finite, the solver succeeded and the root is finite, 0 where only the root is not finite, -1
/// where the input was not finite or the solver failed.
template <class ExecutionSpace, class C, class MemorySpace>
void eigh_errors(const ExecutionSpace& space, int slots, int n, const EighChunk<C, MemorySpace>& chunk) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  const auto residual = chunk.vectors, root = chunk.root;
  const auto info = chunk.info, nonfinite = chunk.nonfinite;
  const auto outcome = chunk.outcome;
  const int nn = n * n;
  Kokkos::parallel_for(
      "Lather::eigh_on_space::errors", per_slot_policy(space, slots), KOKKOS_LAMBDA(const member_type& member) {
        const int s = member.league_rank();
        double worst = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, nn),
            [&](int at, double& local) {
              const int i = at / n, j = at % n;
              const double d = kmath::fabs(double(residual(s, i, j)) - (i == j ? 1.0 : 0.0));
              local = is_finite(d) ? (d > local ? d : local) : Kokkos::Experimental::infinity<double>::value;
            },
            Kokkos::Max<double>(worst));
        int bad_root = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, nn),
            [&](int at, int& count) {
              if (!is_finite(root(s, at / n, at % n))) ++count;
            },
            bad_root);
        Kokkos::single(Kokkos::PerTeam(member), [&]() {
          const bool solved = nonfinite(s) == 0 && info(s) == 0;
          outcome(s, 2) = worst;
          outcome(s, 3) = !solved ? -1.0 : bad_root == 0 ? 1.0 : 0.0;
        });
      });
}

/// out(matrix_of(s)) = H, its upper triangle mirrored (exactly symmetric, as the host path's syrk
/// gives), padded with the identity, where outcome(s, 3) says the root is written.
template <class ExecutionSpace, class S, class C, class MemorySpace>
void scatter_roots(const ExecutionSpace& space, const Stack3<S, MemorySpace>& out,
                   const Array1<const int, MemorySpace>& matrix_of, int slots, int n,
                   const EighChunk<C, MemorySpace>& chunk) {
  using Policy = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>;
  const int padded = int(out.extent(1));
  const std::int64_t pp = std::int64_t(padded) * padded;
  const auto root = chunk.root;
  const auto outcome = chunk.outcome;
  Kokkos::parallel_for(
      "Lather::eigh_on_space::scatter", Policy(space, 0, slots * pp), KOKKOS_LAMBDA(std::int64_t at) {
        const int s = int(at / pp), i = int(at % pp / padded), j = int(at % padded);
        if (outcome(s, 3) <= 0) return;
        out(matrix_of(s), i, j) = (i < n && j < n) ? S(i <= j ? root(s, i, j) : root(s, j, i)) : S(i == j);
      });
}

/// The eigh roots of `tasks` on `space`, grouped by (size, exponent) and taken in chunks that fit
/// options.workspace_bytes.
template <class ExecutionSpace, class S, class C>
void solve_eigh_on_space(const ExecutionSpace& space,
                         const MatrixStack<const S, typename ExecutionSpace::memory_space>& matrices,
                         const MatrixStack<S, typename ExecutionSpace::memory_space>& roots,
                         const std::vector<RootTask>& tasks, const InverseRootOptions& options,
                         InverseRootResult& result, GemmCount& count) {
  using memory_space = typename ExecutionSpace::memory_space;
  std::map<std::pair<int, int>, std::vector<int>> groups;  // (n, p) -> task positions
  for (std::size_t t = 0; t < tasks.size(); ++t) groups[{tasks[t].size, tasks[t].exponent}].push_back(int(t));
  const int batched_max = options.batched_eigh_max_size >= 0 ? options.batched_eigh_max_size
                          : device_has_batched_syev()        ? std::numeric_limits<int>::max()
                                                             : 0;
  for (const auto& [key, positions] : groups) {
    const auto [n, p] = key;
    const std::size_t fit =
        std::max<std::size_t>(1, options.workspace_bytes / EighChunk<C, memory_space>::bytes_per_matrix(n));
    const int capacity = int(std::min<std::size_t>(fit, positions.size()));
    const EighChunk<C, memory_space> chunk(capacity, n);
    Array1<int, memory_space> matrix_of("Lather::eigh_on_space::matrix_of", capacity);
    auto matrix_of_host = Kokkos::create_mirror_view(matrix_of);
    auto outcome_host = Kokkos::create_mirror_view(chunk.outcome);
    const std::int64_t stride = std::int64_t(n) * n;
    for (std::size_t begin = 0; begin < positions.size(); begin += std::size_t(capacity)) {
      const int slots = int(std::min(positions.size() - begin, std::size_t(capacity)));
      // The previous chunk's copy of its outcomes has finished (fenced below), so the mirrors are free.
      for (int s = 0; s < slots; ++s) matrix_of_host(s) = tasks[positions[begin + s]].index;
      Kokkos::deep_copy(space, matrix_of, matrix_of_host);
      const Array1<const int, memory_space> slots_matrix = matrix_of;
      gather_for_eigh<ExecutionSpace, S, C, memory_space>(space, matrices, slots_matrix, slots, n, chunk);
      batched_syevd(space, n, slots, chunk.vectors.data(), chunk.eigenvalues.data(), chunk.info.data(),
                    n <= batched_max);
      eigh_factors<ExecutionSpace, C, memory_space>(space, slots, n, p, options, chunk);
      scale_eigenvectors<ExecutionSpace, C, memory_space>(space, slots, n, chunk);
      // H = W^T W; H^p = (diag(mu^(p/2)) V)^T (diag(mu^(p/2)) V); residual = H^p (A + ridge I).
      ::lather::Impl::gemm_strided_batched(space, 'T', 'N', n, n, n, C(1), chunk.scaled.data(), stride,
                                           chunk.scaled.data(), stride, C(0), chunk.root.data(), stride, slots);
      ::lather::Impl::gemm_strided_batched(space, 'T', 'N', n, n, n, C(1), chunk.vectors.data(), stride,
                                           chunk.vectors.data(), stride, C(0), chunk.scaled.data(), stride, slots);
      ::lather::Impl::gemm_strided_batched(space, 'N', 'N', n, n, n, C(1), chunk.scaled.data(), stride,
                                           chunk.original.data(), stride, C(0), chunk.vectors.data(), stride, slots);
      count.add(n, 3L * slots);
      eigh_errors<ExecutionSpace, C, memory_space>(space, slots, n, chunk);
      scatter_roots<ExecutionSpace, S, C, memory_space>(space, roots, slots_matrix, slots, n, chunk);
      Kokkos::deep_copy(space, outcome_host, chunk.outcome);
      fence(space, "Lather::eigh_on_space: outcomes on the host");
      for (int s = 0; s < slots; ++s) {
        const int t = positions[begin + s];
        const bool written = outcome_host(s, 3) > 0, solved = outcome_host(s, 3) >= 0;
        result.lambda_max[t] = solved ? outcome_host(s, 0) : std::nan("");
        result.ridge[t] = solved ? outcome_host(s, 1) : std::nan("");
        result.iterations[t] = 0;
        result.status[t] = written ? RootStatus::converged : RootStatus::non_finite;
        result.error[t] = written ? outcome_host(s, 2) : std::numeric_limits<double>::infinity();
      }
    }
  }
}

}  // namespace lather::linalg::Impl
