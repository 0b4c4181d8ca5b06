#pragma once
// GELU with the tanh approximation of GPT-2 and GPT-J (Hendrycks & Gimpel 2016):
// gelu(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), element-wise.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

namespace lather::nn {

using comm::Matrix;

/// y = gelu(x); y [N, D] like x (y may be the same View as x).
template <class ExecutionSpace, class Scalar>
void gelu_forward(const ExecutionSpace& space, const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                  const Matrix<Scalar, typename ExecutionSpace::memory_space>& y);

/// dx = dy * gelu'(x); dx may be the same View as dy.
template <class ExecutionSpace, class Scalar>
void gelu_backward(const ExecutionSpace& space, const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                   const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dy,
                   const Matrix<Scalar, typename ExecutionSpace::memory_space>& dx);

}  // namespace lather::nn
