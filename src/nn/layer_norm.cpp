#include <lather/nn/layer_norm.hpp>

#include "lane_reductions.hpp"

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

namespace lather::nn {

namespace {
namespace kmath = ::lather::Impl::kmath;

/// Columns whose parameter gradients one host thread sums together (layer_norm_backward).
constexpr int layer_norm_strip = 32;
}  // namespace

// The row kernels, a body per backend family (kokkos_compat.hpp's BodyFor). On a device one team
// per row: the row's sums are team reductions, so that a GPU reads each row with coalesced loads.
// On the host a thread per row with plain loops (Serial's team reductions cost more than the
// row's arithmetic). Not in the unnamed namespace: CUDA cannot launch extended lambdas from
// functions in one.
namespace Impl {

/// y = (x - mean) rstd gamma + beta per row, with the row's mean and rstd.
template <class ExecutionSpace, class Scalar>
void normalize_rows(::lather::Impl::HostBody, const ExecutionSpace& space,
                    const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                    const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                    const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& beta,
                    const Matrix<Scalar, typename ExecutionSpace::memory_space>& y,
                    const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& mean,
                    const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& rstd, double epsilon,
                    double inverse_features) {
  const int rows = int(x.extent(0)), features = int(x.extent(1));
  Kokkos::parallel_for(
      "Lather::nn::layer_norm_forward", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows), KOKKOS_LAMBDA(int i) {
        const Scalar* const row = &x(i, 0);
        const double row_mean = Impl::lanes_sum(features, [&](int j) { return double(row[j]); }) * inverse_features;
        const double squares = Impl::lanes_sum(features, [&](int j) {
          const double centred = double(row[j]) - row_mean;
          return centred * centred;
        });
        const Scalar m = Scalar(row_mean);
        const Scalar r = Scalar(1.0 / kmath::sqrt(squares * inverse_features + epsilon));
        Scalar* const out = &y(i, 0);
        for (int j = 0; j < features; ++j) out[j] = (row[j] - m) * r * gamma(j) + beta(j);
        mean(i) = m;
        rstd(i) = r;
      });
}
template <class ExecutionSpace, class Scalar>
void normalize_rows(::lather::Impl::DeviceBody, const ExecutionSpace& space,
                    const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                    const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                    const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& beta,
                    const Matrix<Scalar, typename ExecutionSpace::memory_space>& y,
                    const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& mean,
                    const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& rstd, double epsilon,
                    double inverse_features) {
  const int rows = int(x.extent(0)), features = int(x.extent(1));
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::nn::layer_norm_forward", Kokkos::TeamPolicy<ExecutionSpace>(space, rows, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int i = member.league_rank();
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, features), [&](int j, double& partial) { partial += double(x(i, j)); },
            sum);
        const double row_mean = sum * inverse_features;
        // Two passes: the variance as the mean of squared deviations does not cancel catastrophically.
        double squares = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, features),
            [&](int j, double& partial) {
              const double centred = double(x(i, j)) - row_mean;
              partial += centred * centred;
            },
            squares);
        const Scalar m = Scalar(row_mean);
        const Scalar r = Scalar(1.0 / kmath::sqrt(squares * inverse_features + epsilon));
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, features),
                             [&](int j) { y(i, j) = (x(i, j) - m) * r * gamma(j) + beta(j); });
        Kokkos::single(Kokkos::PerTeam(member), [&]() {
          mean(i) = m;
          rstd(i) = r;
        });
      });
}

/// dx = rstd (g - mean_j(g) - xhat mean_j(g xhat)) per row, g = dy gamma (added to dx when
/// `add_to_dx`; dx may be dy).
template <class ExecutionSpace, class Scalar>
void input_gradient_rows(::lather::Impl::HostBody, const ExecutionSpace& space,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& mean,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& rstd,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dy,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& dx, bool add_to_dx,
                         double inverse_features) {
  const int rows = int(x.extent(0)), features = int(x.extent(1));
  Kokkos::parallel_for(
      "Lather::nn::layer_norm_backward::input", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows),
      KOKKOS_LAMBDA(int i) {
        const Scalar m = mean(i), r = rstd(i);
        const Scalar* const input = &x(i, 0);
        const Scalar* const gradient = &dy(i, 0);
        const double g_sum = Impl::lanes_sum(features, [&](int j) { return double(gradient[j] * gamma(j)); });
        const double g_xhat_sum = Impl::lanes_sum(
            features, [&](int j) { return double(gradient[j] * gamma(j)) * double((input[j] - m) * r); });
        const Scalar g_mean = Scalar(g_sum * inverse_features), g_xhat_mean = Scalar(g_xhat_sum * inverse_features);
        // dx may be dy: each element is read before it is written.
        Scalar* const out = &dx(i, 0);
        for (int j = 0; j < features; ++j) {
          const Scalar xhat = (input[j] - m) * r;
          const Scalar value = r * (gradient[j] * gamma(j) - g_mean - xhat * g_xhat_mean);
          out[j] = add_to_dx ? out[j] + value : value;
        }
      });
}
template <class ExecutionSpace, class Scalar>
void input_gradient_rows(::lather::Impl::DeviceBody, const ExecutionSpace& space,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& mean,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& rstd,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dy,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& dx, bool add_to_dx,
                         double inverse_features) {
  const int rows = int(x.extent(0)), features = int(x.extent(1));
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::nn::layer_norm_backward::input", Kokkos::TeamPolicy<ExecutionSpace>(space, rows, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const int i = member.league_rank();
        const Scalar m = mean(i), r = rstd(i);
        double g_sum = 0, g_xhat_sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, features),
            [&](int j, double& partial) { partial += double(dy(i, j) * gamma(j)); }, g_sum);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, features),
            [&](int j, double& partial) { partial += double(dy(i, j) * gamma(j)) * double((x(i, j) - m) * r); },
            g_xhat_sum);
        const Scalar g_mean = Scalar(g_sum * inverse_features), g_xhat_mean = Scalar(g_xhat_sum * inverse_features);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, features), [&](int j) {
          const Scalar xhat = (x(i, j) - m) * r;
          const Scalar value = r * (dy(i, j) * gamma(j) - g_mean - xhat * g_xhat_mean);
          dx(i, j) = add_to_dx ? dx(i, j) + value : value;
        });
      });
}

}  // namespace Impl

template <class ExecutionSpace, class Scalar>
void layer_norm_forward(const ExecutionSpace& space,
                        const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                        const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                        const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& beta,
                        const Matrix<Scalar, typename ExecutionSpace::memory_space>& y,
                        const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& mean,
                        const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& rstd, double epsilon) {
  const int rows = int(x.extent(0)), features = int(x.extent(1));
  LATHER_REQUIRE(gamma.extent(0) == x.extent(1) && beta.extent(0) == x.extent(1), "layer_norm_forward: x has ",
                 features, " features, gamma ", gamma.extent(0), ", beta ", beta.extent(0));
  LATHER_REQUIRE(y.extent(0) == x.extent(0) && y.extent(1) == x.extent(1), "layer_norm_forward: x is [", rows, ", ",
                 features, "], y [", y.extent(0), ", ", y.extent(1), "]");
  LATHER_REQUIRE(mean.extent(0) == x.extent(0) && rstd.extent(0) == x.extent(0), "layer_norm_forward: x has ", rows,
                 " rows, mean ", mean.extent(0), ", rstd ", rstd.extent(0));
  LATHER_REQUIRE(epsilon >= 0, "layer_norm_forward: epsilon must be >= 0, got ", epsilon);
  if (rows == 0) return;
  LATHER_REQUIRE(features >= 1, "layer_norm_forward: rows of ", features, " features have no mean");
  const double inverse_features = 1.0 / double(features);
  Impl::normalize_rows(::lather::Impl::BodyFor<ExecutionSpace>{}, space, x, gamma, beta, y, mean, rstd, epsilon,
                       inverse_features);
}

template <class ExecutionSpace, class Scalar>
void layer_norm_backward(const ExecutionSpace& space,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& x,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& gamma,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& mean,
                         const Kokkos::View<const Scalar*, typename ExecutionSpace::memory_space>& rstd,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dy,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& dx, bool add_to_dx,
                         const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& dgamma,
                         const Kokkos::View<Scalar*, typename ExecutionSpace::memory_space>& dbeta, bool accumulate) {
  const int rows = int(x.extent(0)), features = int(x.extent(1));
  LATHER_REQUIRE(gamma.extent(0) == x.extent(1) && dgamma.extent(0) == x.extent(1) && dbeta.extent(0) == x.extent(1),
                 "layer_norm_backward: x has ", features, " features, gamma ", gamma.extent(0), ", dgamma ",
                 dgamma.extent(0), ", dbeta ", dbeta.extent(0));
  LATHER_REQUIRE(mean.extent(0) == x.extent(0) && rstd.extent(0) == x.extent(0), "layer_norm_backward: x has ", rows,
                 " rows, mean ", mean.extent(0), ", rstd ", rstd.extent(0));
  LATHER_REQUIRE(dy.extent(0) == x.extent(0) && dy.extent(1) == x.extent(1) && dx.extent(0) == x.extent(0) &&
                     dx.extent(1) == x.extent(1),
                 "layer_norm_backward: x is [", rows, ", ", features, "], dy [", dy.extent(0), ", ", dy.extent(1),
                 "], dx [", dx.extent(0), ", ", dx.extent(1), "]");
  // dgamma = sum_i dy * xhat, dbeta = sum_i dy: each column's sums walk the rows in order (the
  // same sum every run, whatever the backend). First, so that dx may overwrite dy afterwards. On a
  // device a thread per column; on the host a thread per strip of columns, whose sums advance
  // together along each row, so that the loads are contiguous and the loop vectorises (a column
  // at a time read one value per row, 0.4 ms for 2048 x 128 values), as column_sums does (parallel_linear_kernels.hpp).
  constexpr int strip = ::lather::Impl::runs_on_host<ExecutionSpace> ? layer_norm_strip : 1;
  Kokkos::parallel_for(
      "Lather::nn::layer_norm_backward::parameters",
      Kokkos::RangePolicy<ExecutionSpace>(space, 0, (features + strip - 1) / strip), KOKKOS_LAMBDA(int s) {
        const int first = s * strip, width = features - first < strip ? features - first : strip;
        double gamma_sum[strip], beta_sum[strip];
        for (int c = 0; c < width; ++c) gamma_sum[c] = beta_sum[c] = 0;
        for (int i = 0; i < rows; ++i) {
          const Scalar m = mean(i), r = rstd(i);
          for (int c = 0; c < width; ++c) {
            const double d = double(dy(i, first + c));
            gamma_sum[c] += d * double((x(i, first + c) - m) * r);
            beta_sum[c] += d;
          }
        }
        for (int c = 0; c < width; ++c) {
          const int j = first + c;
          dgamma(j) = accumulate ? Scalar(double(dgamma(j)) + gamma_sum[c]) : Scalar(gamma_sum[c]);
          dbeta(j) = accumulate ? Scalar(double(dbeta(j)) + beta_sum[c]) : Scalar(beta_sum[c]);
        }
      });
  if (rows == 0 || features == 0) return;
  // dx: y depends on x through xhat directly and through the row's mean and rstd.
  const double inverse_features = 1.0 / double(features);
  Impl::input_gradient_rows(::lather::Impl::BodyFor<ExecutionSpace>{}, space, x, gamma, mean, rstd, dy, dx, add_to_dx,
                            inverse_features);
}

#define LATHER_NN_LAYER_NORM_INSTANTIATE(SPACE, SCALAR)                                                              \
  template void layer_norm_forward<SPACE, SCALAR>(                                                                   \
      const SPACE&, const Matrix<const SCALAR, SPACE::memory_space>&,                                                \
      const Kokkos::View<const SCALAR*, SPACE::memory_space>&,                                                       \
      const Kokkos::View<const SCALAR*, SPACE::memory_space>&, const Matrix<SCALAR, SPACE::memory_space>&,           \
      const Kokkos::View<SCALAR*, SPACE::memory_space>&, const Kokkos::View<SCALAR*, SPACE::memory_space>&, double); \
  template void layer_norm_backward<SPACE, SCALAR>(                                                                  \
      const SPACE&, const Matrix<const SCALAR, SPACE::memory_space>&,                                                \
      const Kokkos::View<const SCALAR*, SPACE::memory_space>&,                                                       \
      const Kokkos::View<const SCALAR*, SPACE::memory_space>&,                                                       \
      const Kokkos::View<const SCALAR*, SPACE::memory_space>&, const Matrix<const SCALAR, SPACE::memory_space>&,     \
      const Matrix<SCALAR, SPACE::memory_space>&, bool, const Kokkos::View<SCALAR*, SPACE::memory_space>&,           \
      const Kokkos::View<SCALAR*, SPACE::memory_space>&, bool);

LATHER_NN_LAYER_NORM_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_NN_LAYER_NORM_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_NN_LAYER_NORM_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_NN_LAYER_NORM_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::nn
