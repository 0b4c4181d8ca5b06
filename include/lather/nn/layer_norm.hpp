#pragma once
// Layer normalisation over the features of each row (Ba, Kiros & Hinton 2016), as GPT-2 places it
// before attention and the MLP: y = (x - mean) * rstd * gamma + beta, with the biased variance and
// rstd = 1 / sqrt(variance + epsilon). Local kernels on one process: the features are whole here.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

namespace lather::nn {

using comm::Matrix;

/// y = layer_norm(x) row by row over the D columns of x [N, D]; gamma, beta [D]. Keeps each row's
/// mean and rstd [N] for the backward pass. Statistics are accumulated in double.
template <class ExecutionSpace, class Scalar>
void layer_norm_forward(const ExecutionSpace& space,
                        const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                        const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                        const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& beta,
                        const Matrix<Scalar, typename ExecutionSpace::memory_space>& y,
                        const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& mean,
                        const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& rstd,
                        double epsilon = 1e-5);

/// Gradients of layer_norm_forward given dy [N, D] and the forward's mean and rstd: dx is
/// overwritten, or added to when `add_to_dx` (the residual stream's gradient); dgamma and dbeta
/// are overwritten, or added to when `accumulate`. dx may be the same View as dy. dgamma and
/// dbeta are column sums in a fixed order (deterministic, no atomics).
template <class ExecutionSpace, class Scalar>
void layer_norm_backward(const ExecutionSpace& space,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& mean,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& rstd,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dy,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& dx, bool add_to_dx,
                         const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& dgamma,
                         const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& dbeta, bool accumulate);

}  // namespace lather::nn
