// The first-order baselines against their closed forms (optax's definitions), two steps each.
#include <lather/optim/first_order.hpp>

#include <gtest/gtest.h>

#include <cmath>

namespace {
using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

template <class Options>
std::vector<double> run(const Options& options, double x0, const std::vector<double>& grads) {
  FirstOrder<Space, double> opt(Space(), {{"x", {}}}, options);
  Kokkos::View<double*, Mem> x("x", 1), g("g", 1);
  Kokkos::deep_copy(x, x0);
  std::vector<double> out;
  for (double gv : grads) {
    Kokkos::deep_copy(g, gv);
    opt.step(Space(), {x}, {g});
    auto host = Kokkos::create_mirror_view(x);
    Kokkos::deep_copy(host, x);
    out.push_back(host(0));
  }
  return out;
}
}  // namespace

TEST(FirstOrder, SgdMomentumAndNesterov) {
  SgdOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.1);
  o.momentum = 0.9;
  auto x = run(o, 1.0, {0.5, -0.2});
  EXPECT_DOUBLE_EQ(x[0], 1.0 - 0.1 * 0.5);
  EXPECT_DOUBLE_EQ(x[1], x[0] - 0.1 * (-0.2 + 0.9 * 0.5));
  o.nesterov = true;
  x = run(o, 1.0, {0.5, -0.2});
  EXPECT_DOUBLE_EQ(x[0], 1.0 - 0.1 * (0.5 + 0.9 * 0.5));
  const double m2 = -0.2 + 0.9 * 0.5;
  EXPECT_DOUBLE_EQ(x[1], x[0] - 0.1 * (-0.2 + 0.9 * m2));
}

TEST(FirstOrder, Adagrad) {
  AdagradOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.1);
  const auto x = run(o, 1.0, {0.5, -0.2});
  const double a1 = 0.1 + 0.25, a2 = a1 + 0.04;
  EXPECT_DOUBLE_EQ(x[0], 1.0 - 0.1 * 0.5 / std::sqrt(a1 + 1e-7));
  EXPECT_DOUBLE_EQ(x[1], x[0] + 0.1 * 0.2 / std::sqrt(a2 + 1e-7));
}

TEST(FirstOrder, AdamAndAdamW) {
  AdamOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.01);
  auto x = run(o, 1.0, {0.5, -0.2});
  // Step 1: bias-corrected m = g, v = g^2.
  EXPECT_NEAR(x[0], 1.0 - 0.01 * 0.5 / (0.5 + 1e-8), 1e-15);
  const double m = 0.9 * 0.05 + 0.1 * -0.2, v = 0.999 * 0.00025 + 0.001 * 0.04;
  const double u = (m / (1 - 0.81)) / (std::sqrt(v / (1 - 0.999 * 0.999)) + 1e-8);
  EXPECT_NEAR(x[1], x[0] - 0.01 * u, 1e-15);
  o.weight_decay = 0.1;
  o.decoupled_weight_decay = true;
  x = run(o, 1.0, {0.5});
  EXPECT_NEAR(x[0], 1.0 - 0.01 * (0.5 / (0.5 + 1e-8) + 0.1 * 1.0), 1e-15);
  FirstOrder<Space, float> adamw(Space(), {{"x", {3}}}, o);
  EXPECT_EQ(adamw.name(), "adamw");
  EXPECT_EQ(adamw.memory_report().local_bytes, 2 * 3 * 4);
}

TEST(FirstOrder, BadOptionsAreNamed) {
  AdamOptions o;
  o.beta2 = 1.5;
  try {
    FirstOrder<Space, float> opt(Space(), {{"x", {3}}}, o);
    FAIL();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("beta2"), std::string::npos);
  }
}
