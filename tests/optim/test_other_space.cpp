// The implementation headers make Lather's templates usable on an execution space the library
// was not compiled for: Shampoo, Adam and the gradient reducer instantiated here on
// Kokkos::DefaultHostExecutionSpace (on a device build a space liblather does not hold; on a
// host-only build the same as the default, so the library's instances are used) give the same
// results as on the default space. Both run the same code on the same inputs; only the BLAS
// behind KokkosBlas::gemm may differ (cuBLAS against a host BLAS), so the comparison allows float
// rounding accumulated over a few steps: 1e-5 relative.
#include <lather/comm/impl/reduce_impl.hpp>
#include <lather/optim/impl/first_order_impl.hpp>
#include <lather/optim/impl/shampoo_impl.hpp>

#include "common/host_copies.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using Default = Kokkos::DefaultExecutionSpace;
using Host = Kokkos::DefaultHostExecutionSpace;

const std::vector<lather::ParameterSpec> specs = {{"dense", {12, 5}}, {"bias", {5}}, {"conv", {3, 3, 2, 4}}};

/// Parameters and gradients on `Space`, the same values on every space.
template <class Space>
lather::ParameterList<float, typename Space::memory_space> make_parameters(const Space& space, int step) {
  lather::ParameterList<float, typename Space::memory_space> p(space, specs);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<float> value(p.value(i).extent(0)), gradient(value.size());
    for (std::size_t k = 0; k < value.size(); ++k) {
      value[k] = float(std::sin(0.1 * double(k) + double(i)));
      gradient[k] = float(std::cos(0.37 * double(k) + 0.5 * step + double(i)));
    }
    p.set_value(space, i, value);
    Kokkos::deep_copy(space, p.gradient(i),
                      Kokkos::View<const float*, Kokkos::HostSpace>(gradient.data(), gradient.size()));
    space.fence();
  }
  return p;
}

template <class Space, class Optimizer>
std::vector<std::vector<float>> run(Optimizer&& optimizer, const Space& space) {
  auto p = make_parameters(space, 0);
  for (int step = 0; step < 4; ++step) {
    const auto g = make_parameters(space, step);
    for (std::size_t i = 0; i < specs.size(); ++i) Kokkos::deep_copy(space, p.gradient(i), g.gradient(i));
    optimizer.step(space, p);
  }
  space.fence();
  return lather::test::host_vectors(p.values());
}

void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < a[i].size(); ++k)
      ASSERT_NEAR(a[i][k], b[i][k], 1e-5f * (1 + std::fabs(b[i][k]))) << specs[i].name << " element " << k;
}

TEST(OtherSpace, ShampooAndAdam) {
  lather::optim::ShampooOptions o;
  o.learning_rate = 0.01;
  o.block_size = 4;
  o.start_preconditioning_step = 1;
  o.graft_type = lather::optim::GraftType::adagrad;
  expect_close(run(lather::optim::Shampoo<Host, float>(Host(), specs, o), Host()),
               run(lather::optim::Shampoo<Default, float>(Default(), specs, o), Default()));
  lather::optim::AdamOptions adam;
  expect_close(run(lather::optim::FirstOrder<Host, float>(Host(), specs, adam), Host()),
               run(lather::optim::FirstOrder<Default, float>(Default(), specs, adam), Default()));
}

TEST(OtherSpace, GradientReducer) {
  // A one-process group: the mean of one rank is the tensor itself, and the fusion path runs.
  const auto host = make_parameters(Host(), 3);
  lather::comm::ReduceOptions small;
  small.fusion_bytes = 64;  // several buckets
  lather::comm::GradientReducer<Host, float>(lather::comm::Group(), small).mean(Host(), host.gradients());
  const auto expected = make_parameters(Default(), 3);
  expect_close(lather::test::host_vectors(host.gradients()), lather::test::host_vectors(expected.gradients()));
}

}  // namespace
