// The 16-bit wire conversions against references built independently: every fp16 value decoded
// with std::ldexp from its fields, and round-to-nearest-even by searching the sorted table of all
// finite fp16 values (bfloat16: by comparing the two neighbouring bfloat16 values in double).
#include <lather/comm/wire_precision.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace lather::comm;

float float_from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

double fp16_reference_value(std::uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  const double magnitude =
      exponent == 0 ? std::ldexp(double(mantissa), -24) : std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  return sign ? -magnitude : magnitude;
}

/// Nearest fp16 by table search, ties to the even significand; overflow past 65520 to infinity.
std::uint16_t fp16_reference_encode(float x, const std::vector<double>& positive) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(double(x));
  if (a >= 65520.0) return sign | 0x7c00;
  const auto upper = std::lower_bound(positive.begin(), positive.end(), a);  // first >= a
  const std::uint16_t hi = std::uint16_t(upper - positive.begin());
  if (positive[hi] == a || hi == 0) return sign | hi;
  const std::uint16_t lo = hi - 1;
  const double below = a - positive[lo], above = positive[hi] - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

std::uint16_t bf16_reference_encode(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const std::uint16_t lo = std::uint16_t(u >> 16), hi = std::uint16_t(lo + 1);
  const double a = std::fabs(double(x));
  const double lo_value = std::fabs(double(float_from_bits(std::uint32_t(lo) << 16)));
  const double hi_value = (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128)  // the next step is +-inf
                                                  : std::fabs(double(float_from_bits(std::uint32_t(hi) << 16)));
  if (a - lo_value < hi_value - a) return lo;
  if (hi_value - a < a - lo_value) return hi;
  return (lo & 1) ? hi : lo;
}

std::vector<float> test_floats() {
  std::vector<float> values;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) values.push_back(float_from_bits(std::uint32_t(u)));
  // Edges: halfway points, the largest finite values, subnormal boundaries, signed zeros.
  for (float x :
       {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 6.103515625e-05f, 5.96046448e-08f, 2.98023224e-08f,
        2.98023253e-08f, 1.0f + 0x1.0p-11f, 1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-11f, std::numeric_limits<float>::max(),
        std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), 3.3961776e38f, 3.3961778e38f})
    values.push_back(x), values.push_back(-x);
  return values;
}

TEST(WirePrecision, Float16DecodesEveryValueExactly) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float got = float16_to_float(std::uint16_t(h));
    const int exponent = (h >> 10) & 31;
    if (exponent == 31) {
      EXPECT_EQ(std::isnan(got), (h & 1023) != 0) << h;
      if ((h & 1023) == 0) EXPECT_EQ(got, (h & 0x8000) ? -INFINITY : INFINITY);
      continue;
    }
    ASSERT_EQ(double(got), fp16_reference_value(std::uint16_t(h))) << h;
    ASSERT_EQ(float_to_float16(got), h) << "round trip of " << h;
  }
}

TEST(WirePrecision, Float16RoundsToNearestEven) {
  std::vector<double> positive;
  for (std::uint16_t h = 0; h < 0x7c00; ++h) positive.push_back(fp16_reference_value(h));
  positive.push_back(65536.0);  // where infinity sits for rounding: 2^16
  for (float x : test_floats()) {
    if (std::isnan(x)) {
      const std::uint16_t h = float_to_float16(x);
      EXPECT_TRUE(std::isnan(float16_to_float(h)));
      EXPECT_EQ(h >> 15, std::signbit(x) ? 1 : 0);
      continue;
    }
    ASSERT_EQ(float_to_float16(x), fp16_reference_encode(x, positive)) << x;
  }
}

TEST(WirePrecision, Bfloat16RoundsToNearestEven) {
  for (float x : test_floats()) {
    const std::uint16_t h = float_to_bfloat16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bfloat16_to_float(h)));
      EXPECT_EQ(h >> 15, std::signbit(x) ? 1 : 0);
      continue;
    }
    ASSERT_EQ(h, bf16_reference_encode(x)) << x;
  }
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float value = bfloat16_to_float(std::uint16_t(h));
    if (!std::isnan(value)) ASSERT_EQ(float_to_bfloat16(value), h) << "round trip of " << h;
  }
  EXPECT_EQ(float_to_bfloat16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bfloat16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest
}

/// out(i) = decode(encode(in(i))) in a kernel, bfloat16 for even i, fp16 for odd i. A free function:
/// device lambdas may not live in GoogleTest's private TestBody.
Kokkos::View<float*>::HostMirror round_trip_in_kernel() {
  Kokkos::View<float*> in("in", 4), out("out", 4);
  Kokkos::parallel_for(
      "fill", 4, KOKKOS_LAMBDA(int i) { in(i) = 1.0f + 0x1.0p-9f * float(i); });
  Kokkos::parallel_for(
      "convert", 4, KOKKOS_LAMBDA(int i) { out(i) = decode_wire16(encode_wire16(in(i), i % 2 == 0), i % 2 == 0); });
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
}

TEST(WirePrecision, ConversionsRunInKernels) {
  const auto host = round_trip_in_kernel();
  EXPECT_EQ(host(0), 1.0f);
  EXPECT_EQ(host(1), 1.0f + 0x1.0p-9f);  // fp16 keeps it
  EXPECT_EQ(host(2), 1.0f);              // bf16: 1 + 2^-8 is a tie, to even
  EXPECT_EQ(host(3), 1.0f + 3 * 0x1.0p-9f);
}

}  // namespace
