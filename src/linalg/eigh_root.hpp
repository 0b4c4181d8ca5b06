#pragma once
// Inverse p-th root by symmetric eigendecomposition on the host (LAPACK syevd):
// A = V diag(lambda) V^T, (A + ridge I)^(-1/p) = V diag((lambda + ridge)^(-1/p)) V^T.
// Reports the same error measure as Newton, max |H^p (A + ridge I) - I|, from an explicit residual.

#include <lather/linalg/inverse_root_options.hpp>

#include "batched_gemm.hpp"

#include <vector>

namespace lather::linalg::Impl {

struct EighOutcome {
  double lambda_max = 0;
  double ridge = 0;
  double error = 0;
  RootStatus status = RootStatus::converged;
};

/// Scratch kept from one root to the next: a 128 x 128 matrix in double is above glibc's mmap
/// threshold, so fresh vectors per root would cost a mapping and its page faults each time.
template <class C>
struct EighWorkspace {
  std::vector<C> original, eigenvalues, scaled, power, damped, mu, work;
  std::vector<int> iwork;
  int queried_n = -1;  ///< the size syevd's workspace query was made for
};

/// LAPACK syevd of the n x n symmetric matrix at `a` (destroyed: row k receives the k-th
/// eigenvector), eigenvalues ascending into `w`, with the workspace of `workspace`. Returns LAPACK's
/// info (0: success).
template <class C>
int host_syevd(int n, C* a, C* w, EighWorkspace<C>& workspace);
extern template int host_syevd<float>(int, float*, float*, EighWorkspace<float>&);
extern template int host_syevd<double>(int, double*, double*, EighWorkspace<double>&);

/// `matrix` holds the n x n input (row-major) and is destroyed; `root` receives the n x n root.
template <class C>
EighOutcome eigh_inverse_root(std::vector<C>& matrix, int n, int p, const InverseRootOptions& options,
                              std::vector<C>& root, GemmCount& count, EighWorkspace<C>& workspace);

extern template EighOutcome eigh_inverse_root<float>(std::vector<float>&, int, int, const InverseRootOptions&,
                                                     std::vector<float>&, GemmCount&, EighWorkspace<float>&);
extern template EighOutcome eigh_inverse_root<double>(std::vector<double>&, int, int, const InverseRootOptions&,
                                                      std::vector<double>&, GemmCount&, EighWorkspace<double>&);

}  // namespace lather::linalg::Impl
