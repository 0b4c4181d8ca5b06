// Asynchronous inverse roots (ShampooOptions::async_roots): the roots of preconditioning step k
// are installed at step k + 1 interval, computed meanwhile on host threads.
#include <lather/core/error.hpp>
#include <lather/optim/impl/async_roots.hpp>
#include <lather/optim/shampoo.hpp>

#include "common/host_copies.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using lather::optim::ParameterSpec;
using lather::optim::Shampoo;
using lather::optim::ShampooOptions;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Host = std::vector<std::vector<double>>;

const std::vector<ParameterSpec> specs = {{"bias", {5}}, {"dense", {12, 7}}, {"conv", {3, 4, 2}}, {"wide", {9, 20}}};

lather::TensorList<double, Mem> to_device(const Host& host) {
  lather::TensorList<double, Mem> out;
  for (const auto& x : host) {
    Kokkos::View<double*, Mem> v("tensor", x.size());
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t k = 0; k < x.size(); ++k) h(k) = x[k];
    Kokkos::deep_copy(v, h);
    out.push_back(v);
  }
  return out;
}

Host initial() {
  Host x(specs.size());
  for (std::size_t p = 0; p < specs.size(); ++p)
    for (std::int64_t k = 0; k < lather::element_count(specs[p].shape); ++k)
      x[p].push_back(std::cos(0.23 * (k + 1) + 0.7 * double(p)));
  return x;
}

/// Gradients of step t; with `coupling` they depend on the parameters, so errors compound.
Host gradients(const Host& params, int t, double coupling) {
  Host g(params.size());
  for (std::size_t p = 0; p < params.size(); ++p)
    for (std::size_t k = 0; k < params[p].size(); ++k)
      g[p].push_back(coupling * params[p][k] + std::sin(0.37 * (k + 1) + 1.3 * (t + 1) + 0.61 * double(p)) +
                     0.3 * std::cos(0.11 * double(k * k) + 0.7 * t));
  return g;
}

ShampooOptions options(bool async, bool background, int root_threads = 0) {
  ShampooOptions o;
  o.learning_rate = lather::optim::LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 3;
  o.beta2 = 0.95;
  o.matrix_epsilon = 1e-3;
  o.graft_type = lather::optim::GraftType::rmsprop_normalized;
  o.root.method = lather::linalg::RootMethod::eigh;
  o.statistics_precision = lather::linalg::Precision::float64;
  o.async_roots = async;
  o.async_roots_in_background = background;
  o.root.host_threads = root_threads;
  return o;
}

/// The parameters after 14 steps of `shampoo` from initial(), with gradients that depend on the
/// parameters (so that any difference between two runs compounds).
Host trained(Shampoo<Space, double>& shampoo) {
  auto x = to_device(initial());
  for (int t = 0; t < 14; ++t)
    shampoo.step(Space(), x, to_device(gradients(lather::test::host_vectors<double>(x), t, 0.1)));
  return lather::test::host_vectors<double>(x);
}

// The root thread computes exactly what the foreground computes at the step it starts the
// roots (the same host code on the same copies), so a background run and a foreground run of the
// same stale schedule must agree bit for bit; a race or a wrong swap would show at once.
TEST(AsyncRoots, BackgroundEqualsTheSameScheduleInTheForeground) {
  Shampoo<Space, double> background(Space(), specs, options(true, true));
  Shampoo<Space, double> foreground(Space(), specs, options(true, false));
  const auto x = trained(background), y = trained(foreground);
  for (std::size_t p = 0; p < x.size(); ++p) EXPECT_EQ(x[p], y[p]) << specs[p].name;
  // And the schedule is not the synchronous one: the parameters differ from a synchronous run.
  Shampoo<Space, double> synchronous(Space(), specs, options(false, false));
  EXPECT_NE(trained(synchronous), x);
}

// With gradients that do not depend on the parameters, both runs see the same statistics; the
// asynchronous run's preconditioners are then the synchronous run's of one interval earlier
// (identity until the first install), up to the rounding of two eigendecompositions of the same
// matrix through different copies (none: the same LAPACK call on the same doubles; 1e-12 allows
// for a BLAS that reorders).
// With several root threads too (each statistic's root is taken by whichever thread comes
// first): a root written to another statistic's place, or one left out, shows here.
class AsyncRootsStale : public ::testing::TestWithParam<int> {};

TEST_P(AsyncRootsStale, PreconditionersAreOneIntervalStale) {
  Shampoo<Space, double> synchronous(Space(), specs, options(false, false));
  Shampoo<Space, double> stale(Space(), specs, options(true, true, GetParam()));
  auto a = to_device(initial()), b = to_device(initial());
  const int interval = 3, statistics = synchronous.num_statistics();
  ASSERT_EQ(stale.num_statistics(), statistics);
  std::vector<std::vector<std::vector<double>>> history;  // synchronous preconditioners after each step
  for (int t = 0; t < 10; ++t) {
    const auto g = gradients(initial(), t, 0.0);
    synchronous.step(Space(), a, to_device(g));
    stale.step(Space(), b, to_device(g));
    history.emplace_back();
    for (int s = 0; s < statistics; ++s) history.back().push_back(synchronous.preconditioner(Space(), s));
    for (int s = 0; s < statistics; ++s) {
      const auto got = stale.preconditioner(Space(), s);
      const int n = int(std::lround(std::sqrt(double(got.size()))));
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          const double want = t < interval ? double(i == j) : history[std::size_t(t - interval)][s][i * n + j];
          ASSERT_NEAR(got[i * n + j], want, 1e-12 * (1 + std::fabs(want)))
              << "statistic " << s << " element (" << i << ", " << j << ") after step " << t;
        }
    }
  }
  // The synchronous preconditioners did move between intervals, so the comparison meant something.
  EXPECT_NE(history[2][1], history[5][1]);
}

INSTANTIATE_TEST_SUITE_P(RootThreads, AsyncRootsStale, ::testing::Values(1, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_threads"; });

// The threads only share out the statistics: 4 threads (each LAPACK call on one BLAS thread, as
// ctest runs one) give the trajectory of 1 bit for bit.
TEST(AsyncRoots, SeveralRootThreadsComputeWhatOneDoes) {
  Shampoo<Space, double> one(Space(), specs, options(true, true, 1));
  Shampoo<Space, double> four(Space(), specs, options(true, true, 4));
  ASSERT_GT(one.num_statistics(), 4);
  const auto x = trained(one), y = trained(four);
  for (std::size_t p = 0; p < x.size(); ++p) EXPECT_EQ(x[p], y[p]) << specs[p].name;
  EXPECT_NE(x, initial());
}

// How many threads take the roots by default: one where the step runs on the host's cores, the
// rank's CPUs less one where it runs on a device; a number given is taken as it is.
TEST(AsyncRoots, RootThreadsByBackend) {
  using lather::optim::Impl::async_root_threads;
  EXPECT_EQ(async_root_threads<Kokkos::HostSpace>(options(true, true, 0), 16), 1);
  EXPECT_EQ(async_root_threads<Kokkos::HostSpace>(options(true, true, 5), 16), 5);
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible) {
    EXPECT_EQ(async_root_threads<Mem>(options(true, true, 0), 16), 15);
    EXPECT_EQ(async_root_threads<Mem>(options(true, true, 0), 1), 1);
    EXPECT_EQ(async_root_threads<Mem>(options(true, true, 5), 16), 5);
  }
}

// A restore (the checkpoint filled the state back in) drops the roots in flight: the roots
// started at step 3 would have been installed at step 6; after the restore the preconditioners
// of step 3 stay until the roots started at step 6 are installed at step 9.
TEST(AsyncRoots, RestoreDropsRootsInFlight) {
  Shampoo<Space, double> shampoo(Space(), specs, options(true, true));
  auto a = to_device(initial());
  const auto all = [&] {
    std::vector<std::vector<double>> out;
    for (int s = 0; s < shampoo.num_statistics(); ++s) out.push_back(shampoo.preconditioner(Space(), s));
    return out;
  };
  for (int t = 0; t < 4; ++t) shampoo.step(Space(), a, to_device(gradients(initial(), t, 0.0)));
  const auto before = all();
  shampoo.state_restored(Space(), shampoo.step_count());
  for (int t = 4; t < 9; ++t) {
    shampoo.step(Space(), a, to_device(gradients(initial(), t, 0.0)));
    EXPECT_EQ(all(), before) << "after step " << t;
  }
  shampoo.step(Space(), a, to_device(gradients(initial(), 9, 0.0)));
  EXPECT_NE(all(), before);
}

TEST(AsyncRoots, NeedTheEigendecomposition) {
  auto o = options(true, true);
  o.root.method = lather::linalg::RootMethod::newton;
  try {
    Shampoo<Space, double> shampoo(Space(), specs, o);
    FAIL() << "async_roots with Newton was accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("async_roots needs root_method eigh or eigh_host"), std::string::npos)
        << e.what();
  }
}

}  // namespace
