#include <lather/nn/gelu.hpp>

#include "fast_math.hpp"
#include "for_each_element.hpp"

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <cstdint>

namespace lather::nn {

namespace {
// sqrt(2 / pi) and the cubic coefficient of the approximation.
constexpr double gelu_scale = 0.7978845608028654;
constexpr double gelu_cubic = 0.044715;

}  // namespace

template <class ExecutionSpace, class Scalar>
void gelu_forward(const ExecutionSpace& space, const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                  const Matrix<Scalar, typename ExecutionSpace::memory_space>& y) {
  LATHER_REQUIRE(y.extent(0) == x.extent(0) && y.extent(1) == x.extent(1), "gelu_forward: x is [", x.extent(0), ", ",
                 x.extent(1), "], y [", y.extent(0), ", ", y.extent(1), "]");
  if (x.size() == 0) return;
  const Scalar half = Scalar(0.5), one = Scalar(1), scale = Scalar(gelu_scale), cubic = Scalar(gelu_cubic);
  Impl::for_each_element(
      "Lather::nn::gelu_forward", space, x.extent(0), x.extent(1), KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) {
        const Scalar v = x(i, j);
        y(i, j) = half * v * (one + Impl::tanh_fast(scale * (v + cubic * v * v * v)));
      });
}

template <class ExecutionSpace, class Scalar>
void gelu_backward(const ExecutionSpace& space, const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                   const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dy,
                   const Matrix<Scalar, typename ExecutionSpace::memory_space>& dx) {
  LATHER_REQUIRE(dy.extent(0) == x.extent(0) && dy.extent(1) == x.extent(1) && dx.extent(0) == x.extent(0) &&
                     dx.extent(1) == x.extent(1),
                 "gelu_backward: x is [", x.extent(0), ", ", x.extent(1), "], dy [", dy.extent(0), ", ", dy.extent(1),
                 "], dx [", dx.extent(0), ", ", dx.extent(1), "]");
  if (x.size() == 0) return;
  const Scalar half = Scalar(0.5), one = Scalar(1), scale = Scalar(gelu_scale), cubic = Scalar(gelu_cubic),
               cubic3 = Scalar(3 * gelu_cubic);
  Impl::for_each_element(
      "Lather::nn::gelu_backward", space, x.extent(0), x.extent(1), KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) {
        const Scalar v = x(i, j);
        const Scalar t = Impl::tanh_fast(scale * (v + cubic * v * v * v));
        // d/dv of 0.5 v (1 + t): 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 c v^2).
        const Scalar derivative = half * (one + t) + half * v * (one - t * t) * scale * (one + cubic3 * v * v);
        dx(i, j) = dy(i, j) * derivative;
      });
}

#define LATHER_NN_GELU_INSTANTIATE(SPACE, SCALAR)                                                            \
  template void gelu_forward<SPACE, SCALAR>(const SPACE&, const Matrix<const SCALAR, SPACE::memory_space>&,  \
                                            const Matrix<SCALAR, SPACE::memory_space>&);                     \
  template void gelu_backward<SPACE, SCALAR>(const SPACE&, const Matrix<const SCALAR, SPACE::memory_space>&, \
                                             const Matrix<const SCALAR, SPACE::memory_space>&,               \
                                             const Matrix<SCALAR, SPACE::memory_space>&);

LATHER_NN_GELU_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_NN_GELU_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_NN_GELU_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_NN_GELU_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::nn
