#pragma once
// How an inverse p-th root is taken (inverse_root.hpp): the method, the precision of its
// iteration, the ridge, the stopping rules, and how a root ended.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_LINALG)
#error "lather/linalg/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <cstddef>
#include <cstdint>
#include <string>

namespace lather::linalg {

/// newton: the coupled Newton iteration on the execution space. eigh: eigendecomposition on the
/// execution space -- a batched eigensolver on a device that has one (cuSOLVER), LAPACK on a host
/// backend. eigh_host: eigendecomposition by LAPACK on host threads wherever the stack lives (a
/// device's statistics are copied to the host and the roots back); the same as eigh on a host
/// backend.
enum class RootMethod { newton, eigh, eigh_host };
enum class Precision { float32, float64 };

std::string to_string(RootMethod method);
std::string to_string(Precision precision);
RootMethod parse_root_method(const std::string& name);  ///< "newton", "eigh" or "eigh_host"
Precision parse_precision(const std::string& name);     ///< "float32"/"float" or "float64"/"double"

struct InverseRootOptions {
  RootMethod method = RootMethod::newton;
  /// Precision of the iteration, independent of the storage precision of the stack.
  Precision compute_precision = Precision::float64;
  /// ridge = ridge_epsilon * max(lambda_max, 1e-6) when relative_ridge, else ridge_epsilon.
  double ridge_epsilon = 1e-6;
  bool relative_ridge = true;
  int power_iteration_max_iterations = 100;
  /// Power iteration stops when the Rayleigh quotient changes by at most this (absolute).
  double power_iteration_tolerance = 1e-6;
  int max_iterations = 100;
  /// Newton stops when max|M - I| <= tolerance.
  double tolerance = 1e-6;
  /// Newton stops when the error grows by this factor or more, returning the previous iterate.
  double max_error_ratio = 1.2;
  /// Bytes of scratch the solver may hold at once; matrices are processed in chunks that fit.
  std::size_t workspace_bytes = std::size_t(256) << 20;
  /// Matrices of at most this size use batched small GEMMs (one kernel for the whole batch)
  /// instead of one BLAS call per matrix; -1 picks per backend (see docs/reference/linalg.md).
  int batched_gemm_max_size = -1;
  /// eigh on a device: matrices of at most this size go to the batched eigensolver
  /// (cusolverDnXsyevBatched), larger ones to one syevd per matrix; -1 picks per backend
  /// (docs/reference/linalg.md). No effect on the host, whose LAPACK takes one matrix at a time.
  int batched_eigh_max_size = -1;
  /// eigh on a host backend, and eigh_host: the host threads that take a batch's matrices at once, each through its own
  /// LAPACK calls (the results do not depend on it); on a threaded host backend (OpenMP, Threads) the backend's own
  /// threads take them. 0 picks: 1 for a direct call; in Shampoo the CPUs its rank has to itself on the node, or the
  /// threaded host backend's threads (docs/reference/linalg.md). 0 to 1024.
  int host_threads = 0;

  void validate() const;  ///< Throws lather::Error naming the first bad field.
};

enum class RootStatus : std::uint8_t {
  converged,       ///< error <= tolerance
  max_iterations,  ///< stopped at max_iterations with error > tolerance
  diverged,        ///< error grew by >= max_error_ratio (or became NaN): previous H returned
  non_finite,      ///< input or result not finite: the output matrix was not written
};
std::string to_string(RootStatus status);

}  // namespace lather::linalg
