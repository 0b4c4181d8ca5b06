// Learning-rate schedules against their closed forms (optax's definitions).
#include <lather/optim/schedule.hpp>

#include <lather/core/error.hpp>

#include <gtest/gtest.h>

#include <cmath>

using lather::optim::LearningRateSchedule;

TEST(Schedule, ClosedForms) {
  const auto constant = LearningRateSchedule::constant(0.3);
  EXPECT_DOUBLE_EQ(constant(0), 0.3);
  EXPECT_DOUBLE_EQ(constant(1000), 0.3);

  const auto warmup = LearningRateSchedule::warmup(0.5, 10);
  EXPECT_DOUBLE_EQ(warmup(0), 0.0);
  EXPECT_DOUBLE_EQ(warmup(5), 0.25);
  EXPECT_DOUBLE_EQ(warmup(10), 0.5);
  EXPECT_DOUBLE_EQ(warmup(99), 0.5);

  const auto cosine = LearningRateSchedule::cosine(1.0, 4, 100, 0.1);
  EXPECT_DOUBLE_EQ(cosine(2), 0.5);
  EXPECT_DOUBLE_EQ(cosine(4), 1.0);
  EXPECT_NEAR(cosine(54), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-15);
  EXPECT_DOUBLE_EQ(cosine(104), 0.1);
  EXPECT_DOUBLE_EQ(cosine(1000), 0.1);

  const auto linear = LearningRateSchedule::linear(2.0, 0, 10, 1.0);
  EXPECT_DOUBLE_EQ(linear(0), 2.0);
  EXPECT_DOUBLE_EQ(linear(5), 1.5);
  EXPECT_DOUBLE_EQ(linear(20), 1.0);

  const auto rsqrt = LearningRateSchedule::inverse_sqrt(1.0, 4);
  EXPECT_DOUBLE_EQ(rsqrt(2), 0.5);
  EXPECT_DOUBLE_EQ(rsqrt(4), 1.0);
  EXPECT_DOUBLE_EQ(rsqrt(16), 0.5);
}

TEST(Schedule, BadValuesAreNamed) {
  auto s = LearningRateSchedule::cosine(1.0, 0, 0);
  EXPECT_THROW(s.validate(), lather::Error);
  s = LearningRateSchedule::constant(-1);
  try {
    s.validate();
    FAIL();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos);
  }
  EXPECT_THROW(lather::optim::parse_schedule_kind("exp"), lather::Error);
  EXPECT_EQ(lather::optim::parse_schedule_kind("cosine"), LearningRateSchedule::Kind::cosine_decay);
}
