#pragma once
// Batched inverse p-th roots of symmetric PSD matrices: (A + ridge I)^(-1/p).
//
// Two methods behind one interface, returning the same result type and error measure:
//  * coupled Newton iteration (Higham, Functions of Matrices, eq. 7.18), exactly as the JAX
//    reference `matrix_inverse_pth_root` does it, with power iteration for the ridge scale;
//  * symmetric eigendecomposition: on the execution space (cuSOLVER's batched solver on CUDA,
//    LAPACK syevd on a host backend), or by LAPACK on host threads wherever the stack lives
//    (eigh_host); it costs far fewer flops than Newton.
// Matrices live in a padded stack [B, N, N]; each task names one matrix, its true size n <= N and
// its exponent p. Only the leading n x n block is read, so padding never changes a result, and
// the padding of the output is written as identity.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_LINALG)
#error "lather/linalg/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/error.hpp>
#include <lather/linalg/inverse_root_options.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lather::linalg {

/// One matrix of a stack to take the root of.
struct RootTask {
  int index = 0;     ///< position in the stack
  int size = 0;      ///< true size n (leading n x n block), 1 <= n <= N
  int exponent = 2;  ///< p >= 1
};

/// Per-task outcome, in the order of the tasks.
struct InverseRootResult {
  /// Newton: max |M - I| of the last iterate M (M tracks H^p (A + ridge I)); for a diverged
  /// matrix that is the iterate after the returned H, as in the reference. eigh: the explicit
  /// residual max |H^p (A + ridge I) - I|. +inf when status is non_finite.
  std::vector<double> error;
  std::vector<int> iterations;  ///< Newton steps taken (0 for eigh and 1x1)
  /// Power-iteration steps that found lambda_max (Newton with relative_ridge; 0 otherwise): each
  /// is a matrix-vector product, up to power_iteration_max_iterations, and on a GPU, where one
  /// team takes a matrix, they can cost more than the Newton steps (docs/portability.md).
  std::vector<int> power_iterations;
  std::vector<double> lambda_max;
  std::vector<double> ridge;
  std::vector<RootStatus> status;
  double gemm_flops = 0;  ///< 2 n^3 per GEMM actually executed
  long gemm_calls = 0;

  std::size_t size() const { return error.size(); }
  /// The Shampoo acceptance rule: finite and below the failure threshold.
  bool accepted(std::size_t task, double failure_threshold) const;
  void resize(std::size_t n);
};

template <class Scalar, class MemorySpace>
using MatrixStack = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;

/// One root taken on the host by eigendecomposition (LAPACK syevd and BLAS in precision C), with
/// no Kokkos kernel or fence: a host thread can run it while other work runs on the execution
/// spaces (Shampoo's asynchronous roots). `matrix`: n x n row-major, destroyed; `root` receives
/// the n x n root. The error and status are those of the eigh method of inverse_pth_root.
struct HostRootOutcome {
  double error = 0;
  double lambda_max = 0;
  double ridge = 0;
  RootStatus status = RootStatus::converged;
};
template <class C>
HostRootOutcome eigh_inverse_pth_root_on_host(std::vector<C>& matrix, int n, int p, const InverseRootOptions& options,
                                              std::vector<C>& root);
extern template HostRootOutcome eigh_inverse_pth_root_on_host<float>(std::vector<float>&, int, int,
                                                                     const InverseRootOptions&, std::vector<float>&);
extern template HostRootOutcome eigh_inverse_pth_root_on_host<double>(std::vector<double>&, int, int,
                                                                      const InverseRootOptions&, std::vector<double>&);

namespace Impl {
/// The compiled solver, instantiated for the default execution spaces and float/double.
template <class ExecutionSpace, class Scalar>
struct InverseRootSolver {
  using memory_space = typename ExecutionSpace::memory_space;
  static InverseRootResult solve(const ExecutionSpace& space, const MatrixStack<const Scalar, memory_space>& matrices,
                                 const MatrixStack<Scalar, memory_space>& roots, const std::vector<RootTask>& tasks,
                                 const InverseRootOptions& options);
  /// The eigh roots by the execution space's own batched eigensolver, which RootMethod::eigh takes
  /// on a device; on a host backend LAPACK one matrix at a time. Lets the host suite test the
  /// device's path. Throws where the space has no eigensolver (HIP without rocSOLVER).
  static InverseRootResult solve_eigh_on_space(const ExecutionSpace& space,
                                               const MatrixStack<const Scalar, memory_space>& matrices,
                                               const MatrixStack<Scalar, memory_space>& roots,
                                               const std::vector<RootTask>& tasks, const InverseRootOptions& options);
  /// Newton as a device takes it on any space: the matrices of one size in lockstep chunks of
  /// options.workspace_bytes, the power iteration one team per matrix. Lets the host suite test
  /// the device's bookkeeping (slots stopping at different steps) and kernels.
  static InverseRootResult solve_newton_lockstep(const ExecutionSpace& space,
                                                 const MatrixStack<const Scalar, memory_space>& matrices,
                                                 const MatrixStack<Scalar, memory_space>& roots,
                                                 const std::vector<RootTask>& tasks, const InverseRootOptions& options);
};

/// numpy.random.RandomState(1729).uniform(-1, 1, n): the reference's power-iteration start.
std::vector<double> power_iteration_start_vector(int n);
}  // namespace Impl

/// Computes roots(t.index) = (matrices(t.index) + ridge I)^(-1/t.exponent) for every task t.
/// `matrices` and `roots` are [B, N, N] Views (LayoutRight) in the execution space's memory space;
/// they may be the same View. Matrices not named by a task are left untouched, as are the outputs
/// of tasks whose status is non_finite.
template <class ExecutionSpace, class MatrixView, class RootView>
InverseRootResult inverse_pth_root(const ExecutionSpace& space, const MatrixView& matrices, const RootView& roots,
                                   const std::vector<RootTask>& tasks, const InverseRootOptions& options = {}) {
  static_assert(Kokkos::is_view<MatrixView>::value && Kokkos::is_view<RootView>::value,
                "inverse_pth_root takes Kokkos Views");
  using Scalar = typename RootView::non_const_value_type;
  using memory_space = typename ExecutionSpace::memory_space;
  static_assert(std::is_same<typename MatrixView::non_const_value_type, Scalar>::value,
                "matrices and roots must have the same value type");
  static_assert(unsigned(MatrixView::rank) == 3 && unsigned(RootView::rank) == 3,
                "matrices and roots are stacks [B, N, N]");
  const MatrixStack<const Scalar, memory_space> in = matrices;
  const MatrixStack<Scalar, memory_space> out = roots;
  return Impl::InverseRootSolver<ExecutionSpace, Scalar>::solve(space, in, out, tasks, options);
}

/// All matrices of the stack, full size N, one exponent.
template <class ExecutionSpace, class MatrixView, class RootView>
InverseRootResult inverse_pth_root(const ExecutionSpace& space, const MatrixView& matrices, const RootView& roots,
                                   int exponent, const InverseRootOptions& options = {}) {
  std::vector<RootTask> tasks(matrices.extent(0));
  for (std::size_t b = 0; b < tasks.size(); ++b) tasks[b] = RootTask{int(b), int(matrices.extent(1)), exponent};
  return inverse_pth_root(space, matrices, roots, tasks, options);
}

}  // namespace lather::linalg
