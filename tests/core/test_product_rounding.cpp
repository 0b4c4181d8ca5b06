// Reduced-precision products (lather/core/product_precision.hpp, lather/core/gemm.hpp): the
// rounding of a float to TF32 and bfloat16, against hand-computed bit patterns and against an
// independent reference (the value scaled to an integer significand and rounded by nearbyint in
// double, ties to even); then the GEMM with rounded inputs against the exact product in double,
// within the bound its precision gives, and against the float32 GEMM, which it must differ from.
#include <lather/core/error.hpp>
#include <lather/core/gemm.hpp>
#include <lather/core/product_precision.hpp>

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using lather::ProductPrecision;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

std::uint32_t bits(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float from_bits(std::uint32_t u) {
  float x = 0;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
std::uint32_t rounded_bits(std::uint32_t u, ProductPrecision precision) {
  return bits(lather::round_to(from_bits(u), precision));
}

// Each row: input bits, TF32 result, bfloat16 result. TF32 drops the low 13 bits (half a unit:
// 0x1000), bfloat16 the low 16 (half: 0x8000).
struct Case {
  const char* what;
  std::uint32_t in, tf32, bfloat16;
};
const Case hand_computed[] = {
    {"1 stays", 0x3f800000u, 0x3f800000u, 0x3f800000u},
    {"1 + 2^-11 (TF32 tie, even below) / bf16 below half", 0x3f801000u, 0x3f800000u, 0x3f800000u},
    {"1 + 3 2^-11 (TF32 tie, odd below: up)", 0x3f803000u, 0x3f804000u, 0x3f800000u},
    {"TF32 just past the tie: up", 0x3f801001u, 0x3f802000u, 0x3f800000u},
    {"1 + 2^-8 (bf16 tie, even below)", 0x3f808000u, 0x3f808000u, 0x3f800000u},
    {"1 + 3 2^-8 (bf16 tie, odd below: up)", 0x3f818000u, 0x3f818000u, 0x3f820000u},
    {"bf16 just past the tie: up", 0x3f808001u, 0x3f808000u, 0x3f810000u},
    {"carry into the exponent: 2 - 2^-23 -> 2", 0x3fffffffu, 0x40000000u, 0x40000000u},
    {"negative values round by magnitude", 0xbf818000u, 0xbf818000u, 0xbf820000u},
    {"-0 keeps its sign", 0x80000000u, 0x80000000u, 0x80000000u},
    {"+inf", 0x7f800000u, 0x7f800000u, 0x7f800000u},
    {"-inf", 0xff800000u, 0xff800000u, 0xff800000u},
    // Largest float: past the midpoint between each format's largest finite value and 2^128.
    {"FLT_MAX overflows", 0x7f7fffffu, 0x7f800000u, 0x7f800000u},
    {"TF32's midpoint to 2^128: ties to even, inf", 0x7f7ff000u, 0x7f800000u, 0x7f800000u},
    {"below TF32's midpoint: its largest finite", 0x7f7fefffu, 0x7f7fe000u, 0x7f800000u},
    {"bf16's midpoint to 2^128: inf", 0x7f7f8000u, 0x7f7f8000u, 0x7f800000u},
    {"below bf16's midpoint: its largest finite", 0x7f7f7fffu, 0x7f7f8000u, 0x7f7f0000u},
    // Subnormals round on the same grid (their bits past the kept ones dropped).
    {"smallest subnormal: to 0", 0x00000001u, 0x00000000u, 0x00000000u},
    {"subnormal bf16 tie, even below: 0", 0x00008000u, 0x00008000u, 0x00000000u},
    {"subnormal bf16 tie, odd below: up", 0x00018000u, 0x00018000u, 0x00020000u},
    {"up to bf16's smallest subnormal", 0x0000ffffu, 0x00010000u, 0x00010000u},
    {"largest subnormal: to the smallest normal", 0x007fffffu, 0x00800000u, 0x00800000u},
    {"negative subnormal", 0x8000ffffu, 0x80010000u, 0x80010000u},
};

TEST(ProductRounding, HandComputedBitPatterns) {
  for (const auto& c : hand_computed) {
    EXPECT_EQ(rounded_bits(c.in, ProductPrecision::tf32), c.tf32) << c.what << std::hex << " (0x" << c.in << ")";
    EXPECT_EQ(rounded_bits(c.in, ProductPrecision::bfloat16), c.bfloat16)
        << c.what << std::hex << " (0x" << c.in << ")";
    EXPECT_EQ(rounded_bits(c.in, ProductPrecision::float32), c.in) << c.what;
  }
}

TEST(ProductRounding, NaNStaysAQuietNaNOfTheFormat) {
  // 0x7f800001: a signalling NaN whose payload lies in the dropped bits only; truncated, it would
  // be infinity.
  for (std::uint32_t in : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0xffa5a5a5u}) {
    for (const auto precision : {ProductPrecision::tf32, ProductPrecision::bfloat16}) {
      const std::uint32_t out = rounded_bits(in, precision);
      const int dropped = 24 - lather::significand_bits(precision);
      EXPECT_TRUE(std::isnan(from_bits(out))) << std::hex << in;
      EXPECT_EQ(out & 0x80000000u, in & 0x80000000u) << std::hex << in;  // the sign
      EXPECT_NE(out & 0x00400000u, 0u) << std::hex << in;                // quiet
      EXPECT_EQ(out & ((1u << dropped) - 1u), 0u) << std::hex << in;     // a value of the format
    }
  }
}

/// The independent reference: the float's value in units of its format's last place (the
/// exponent of subnormals held at -126, as the formats keep float32's subnormal grid), rounded
/// to an integer by nearbyint in the default rounding mode (to nearest, ties to even), both exact
/// in double; a result of 2^128 or more is infinity.
float reference_round(float x, int significand) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int exponent = std::max(std::ilogb(x), -126);
  const double unit = std::ldexp(1.0, exponent - (significand - 1));
  const double r = std::nearbyint(double(x) / unit) * unit;
  if (std::fabs(r) >= std::ldexp(1.0, 128)) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return float(r);  // exact: at most `significand` bits, inside float's range
}

TEST(ProductRounding, AgreesWithNearbyintOnRandomBitPatterns) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  std::mt19937 random(57);
  std::uniform_int_distribution<std::uint32_t> any;
  std::vector<std::uint32_t> patterns;
  for (int i = 0; i < (1 << 20); ++i) patterns.push_back(any(random));
  // Ties, and values next to them, in every binade class: normal, subnormal, near the top.
  for (std::uint32_t high : {0x3f800000u, 0x00000000u, 0x00800000u, 0x7f7f0000u, 0x40490000u})
    for (std::uint32_t low : {0x0fffu, 0x1000u, 0x1001u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u})
      for (std::uint32_t sign : {0u, 0x80000000u}) patterns.push_back(sign | (high + low));
  long checked = 0;
  for (const std::uint32_t u : patterns) {
    const float x = from_bits(u);
    if (std::isnan(x)) continue;  // NaN: the test above
    for (const auto precision : {ProductPrecision::tf32, ProductPrecision::bfloat16}) {
      const float want = reference_round(x, lather::significand_bits(precision));
      ASSERT_EQ(bits(lather::round_to(x, precision)), bits(want))
          << std::hex << "0x" << u << " to " << lather::to_string(precision);
      ++checked;
    }
  }
  EXPECT_GT(checked, 2000000);
}

TEST(ProductPrecisionText, NamesAndErrors) {
  for (const auto precision : {ProductPrecision::float32, ProductPrecision::tf32, ProductPrecision::bfloat16})
    EXPECT_EQ(lather::parse_product_precision(lather::to_string(precision)), precision);
  EXPECT_EQ(lather::parse_product_precision("bf16"), ProductPrecision::bfloat16);
  EXPECT_EQ(lather::parse_product_precision("fp32"), ProductPrecision::float32);
  try {
    lather::parse_product_precision("fp16", "--muon-newton-schulz-precision");
    FAIL() << "fp16 was accepted";
  } catch (const lather::Error& e) {
    EXPECT_EQ(e.message(), "unknown --muon-newton-schulz-precision 'fp16' (expected float32, tf32 or bfloat16)");
  }
}

// ---------------------------------------------------------------------------------------------
// The GEMM with rounded inputs.

/// u: the format's unit roundoff (half its spacing at 1): a rounded input is x (1 + d), |d| <= u.
double unit_roundoff(ProductPrecision precision) { return std::ldexp(1.0, -lather::significand_bits(precision)); }
/// gamma_n of float32 summation (Higham, Accuracy and Stability, 3.1): a float32 sum of n terms
/// in any order, with or without FMA, is within gamma_n times the sum of the terms' magnitudes.
double gamma32(int n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

struct Product {
  char ta, tb;
  int m, n, k, count;
  bool shared_a;  // stride_a 0: every product takes A_0
  bool gram;      // B is A (the same pointer and strides): A A^T or A^T A
};

std::vector<float> random_values(std::size_t count, std::mt19937& random) {
  // Spread over four binades so that rounding hits every position of the significand.
  std::uniform_real_distribution<double> value(-1.0, 1.0);
  std::uniform_int_distribution<int> binade(-2, 1);
  std::vector<float> out(count);
  for (auto& x : out) x = float(std::ldexp(value(random), binade(random)));
  return out;
}

/// The element (i, j) of op(M) for M row-major with `columns` columns.
double at(const std::vector<float>& m, std::int64_t offset, bool transposed, int columns, int i, int j) {
  return double(transposed ? m[std::size_t(offset + std::int64_t(j) * columns + i)]
                           : m[std::size_t(offset + std::int64_t(i) * columns + j)]);
}

struct Outcome {
  double worst_ratio = 0;      // max over elements of |C - C_exact| / its bound
  double worst_error = 0;      // max |C - C_exact|
  double worst_error_f32 = 0;  // the same of the float32 product
  std::int64_t rounded_extent = 0;
};

/// Runs `p` at `precision` and at float32 on the same data; compares both with the exact product
/// in double (C_exact = alpha op(A) op(B) + beta C0 of the unrounded inputs).
Outcome run(const Product& p, ProductPrecision precision, std::mt19937& random, bool in_format = false) {
  const bool ta = p.ta == 'T', tb = p.tb == 'T';
  const std::int64_t size_a = std::int64_t(p.m) * p.k, size_b = std::int64_t(p.k) * p.n,
                     size_c = std::int64_t(p.m) * p.n;
  const std::int64_t stride_a = p.shared_a ? 0 : size_a, stride_b = p.gram ? stride_a : size_b;
  std::vector<float> a = random_values(std::size_t(p.shared_a ? size_a : p.count * size_a), random);
  std::vector<float> b = p.gram ? a : random_values(std::size_t(p.count * size_b), random);
  if (in_format) {  // inputs the format holds exactly: rounding must leave them as they are
    for (auto& x : a) x = lather::round_to(x, precision);
    for (auto& x : b) x = lather::round_to(x, precision);
  }
  const std::vector<float> c0 = random_values(std::size_t(p.count * size_c), random);
  const float alpha = 1.5f, beta = 0.5f;
  const auto device = [](const std::vector<float>& host) {
    Kokkos::View<float*, Mem> view("test::operand", host.size());
    Kokkos::deep_copy(view, Kokkos::View<const float*, Kokkos::HostSpace>(host.data(), host.size()));
    return view;
  };
  const auto da = device(a), db = device(b);
  auto dc = device(c0), dc32 = device(c0);
  Kokkos::View<float*, Mem> rounded, unused;
  const float* b_pointer = p.gram ? da.data() : db.data();
  lather::Impl::gemm_strided_batched(Space(), precision, rounded, p.ta, p.tb, p.m, p.n, p.k, alpha, da.data(), stride_a,
                                     b_pointer, stride_b, beta, dc.data(), size_c, p.count);
  lather::Impl::gemm_strided_batched(Space(), ProductPrecision::float32, unused, p.ta, p.tb, p.m, p.n, p.k, alpha,
                                     da.data(), stride_a, b_pointer, stride_b, beta, dc32.data(), size_c, p.count);
  EXPECT_EQ(unused.extent(0), 0u) << "float32 needs no scratch";
  std::vector<float> c(std::size_t(dc.extent(0))), c32(c.size());
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace>(c.data(), c.size()), dc);
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace>(c32.data(), c32.size()), dc32);

  // The bound on |C - C_exact|, with s = sum_l |a_il| |b_lj| of the unrounded inputs:
  //   rounded inputs: a~ b~ = a b (1 + d1)(1 + d2), so |a~ b~ - a b| <= (2u + u^2) |a b|, and the
  //   products are exact in float32 (22 or 16 significant bits);
  //   float32 arithmetic: the sum of k products, times alpha, plus beta c0 is k + 2 rounded
  //   operations: within gamma_(k+2) (|alpha| sum |a~ b~| + |beta c0|), sum |a~ b~| <= (1 + u)^2 s;
  //   the double reference: (k + 2) 2^-53 of the same magnitudes, counted once more as gamma.
  // u = 0 for inputs already in the format. Where cuBLAS converts the inputs itself (CUDA), its
  // documentation does not say how it rounds: truncation is allowed there (an error below 2u).
  const bool converted_by_cublas = lather::Impl::rounds_inputs_itself<Space, float>();
  const double u = in_format ? 0.0 : unit_roundoff(precision) * (converted_by_cublas ? 2 : 1);
  Outcome out;
  out.rounded_extent = std::int64_t(rounded.extent(0));
  for (int i = 0; i < p.count; ++i)
    for (int r = 0; r < p.m; ++r)
      for (int col = 0; col < p.n; ++col) {
        double exact = 0, s = 0;
        const std::int64_t offset_a = p.shared_a ? 0 : i * size_a, offset_b = p.gram ? offset_a : i * size_b;
        for (int l = 0; l < p.k; ++l) {
          const double x = at(a, offset_a, ta, ta ? p.m : p.k, r, l);
          const double y = at(p.gram ? a : b, offset_b, tb, tb ? p.k : p.n, l, col);
          exact += x * y;
          s += std::fabs(x * y);
        }
        const std::size_t e = std::size_t(i * size_c + std::int64_t(r) * p.n + col);
        const double c_in = double(c0[e]);
        exact = double(alpha) * exact + double(beta) * c_in;
        const double magnitude = double(alpha) * (1 + u) * (1 + u) * s + double(beta) * std::fabs(c_in);
        const double bound = double(alpha) * (2 * u + u * u) * s + 2 * gamma32(p.k + 2) * magnitude;
        const double error = std::fabs(double(c[e]) - exact);
        out.worst_ratio = std::max(out.worst_ratio, error / bound);
        out.worst_error = std::max(out.worst_error, error);
        out.worst_error_f32 = std::max(out.worst_error_f32, std::fabs(double(c32[e]) - exact));
      }
  return out;
}

const Product products[] = {
    {'N', 'N', 7, 5, 300, 3, false, false}, {'N', 'T', 7, 5, 300, 3, false, false},
    {'T', 'N', 7, 5, 300, 3, false, false}, {'T', 'T', 7, 5, 300, 3, false, false},
    {'N', 'N', 6, 9, 64, 4, true, false},   {'N', 'T', 8, 8, 200, 3, false, true},
    {'T', 'N', 8, 8, 200, 3, false, true},  {'N', 'T', 8, 8, 50, 2, true, true},
};

class ReducedPrecisionGemm : public ::testing::TestWithParam<ProductPrecision> {};

TEST_P(ReducedPrecisionGemm, WithinItsBoundOfTheExactProductAndApartFromFloat32) {
  std::mt19937 random(5703);
  for (const auto& p : products) {
    const Outcome o = run(p, GetParam(), random);
    const std::string what = std::string(1, p.ta) + p.tb + " " + std::to_string(p.m) + "x" + std::to_string(p.n) +
                             " k " + std::to_string(p.k) + (p.gram ? " gram" : "") + (p.shared_a ? " shared A" : "");
    EXPECT_LE(o.worst_ratio, 1.0) << what;
    // The rounding must show: the reduced product is further from the exact one than the float32
    // product is by more than float32 rounding explains (2^-11 or 2^-8 against 2^-24 relative per
    // input; a factor 8 leaves room for the two products' different cancellations).
    EXPECT_GT(o.worst_error, 8 * o.worst_error_f32) << what;
    // Scratch: one rounded copy of each distinct operand (A once where B is A).
    const std::int64_t copies_a = (p.shared_a ? 1 : p.count) * std::int64_t(p.m) * p.k;
    const std::int64_t copies_b = p.gram ? 0 : std::int64_t(p.count) * p.k * p.n;
    if (!lather::Impl::rounds_inputs_itself<Space, float>()) EXPECT_EQ(o.rounded_extent, copies_a + copies_b) << what;
    std::printf("%s %s: worst error / bound %.3g, error %.3g, float32's %.3g\n", lather::to_string(GetParam()).c_str(),
                what.c_str(), o.worst_ratio, o.worst_error, o.worst_error_f32);
  }
}

// Inputs the format holds exactly: the product is float32's (u = 0 in the bound). C0's values
// are not in the format and beta C0 must pass through in float32: with k = 1 or 2 the bound,
// 2 gamma_(k+2) (|alpha| s + |beta c0|) ~ 5e-7 (s + |c0|), is far below what rounding C0 to TF32
// or bfloat16 would add (2^-12 or 2^-9 of |beta c0|).
TEST_P(ReducedPrecisionGemm, InputsInTheFormatGiveTheFloat32Product) {
  std::mt19937 random(11);
  std::vector<Product> cases(std::begin(products), std::end(products));
  cases.push_back({'N', 'N', 5, 4, 1, 2, false, false});
  cases.push_back({'T', 'N', 5, 4, 2, 3, true, false});
  for (const auto& p : cases) {
    const Outcome o = run(p, GetParam(), random, true);
    EXPECT_LE(o.worst_ratio, 1.0) << p.ta << p.tb << " k " << p.k;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ReducedPrecisionGemm,
                         ::testing::Values(ProductPrecision::tf32, ProductPrecision::bfloat16),
                         [](const auto& info) { return lather::to_string(info.param); });

TEST(ReducedPrecisionGemmViews, MatchTheBatchedCallAndKeepFloat32BitForBit) {
  std::mt19937 random(3);
  const int m = 6, n = 7, k = 40;
  const auto a_host = random_values(std::size_t(m * k), random), b_host = random_values(std::size_t(n * k), random);
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
  Matrix a("test::a", m, k), b("test::b", n, k), c("test::c", m, n), d("test::d", m, n);
  Kokkos::deep_copy(a, Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace>(a_host.data(), m, k));
  Kokkos::deep_copy(b, Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace>(b_host.data(), n, k));
  for (const auto precision : {ProductPrecision::float32, ProductPrecision::bfloat16}) {
    Kokkos::View<float*, Mem> rounded, rounded_too;
    lather::Impl::gemm(Space(), precision, rounded, "N", "T", 1.0f, a, b, 0.0f, c);
    if (precision == ProductPrecision::float32)
      lather::Impl::gemm(Space(), "N", "T", 1.0f, a, b, 0.0f, d);  // the plain call
    else
      lather::Impl::gemm_strided_batched(Space(), precision, rounded_too, 'N', 'T', m, n, k, 1.0f, a.data(), 0,
                                         b.data(), 0, 0.0f, d.data(), 0, 1);
    const auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
    const auto hd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) ASSERT_EQ(bits(hc(i, j)), bits(hd(i, j))) << lather::to_string(precision);
  }
}

TEST(ReducedPrecisionGemmDouble, IsRefusedNamingThePrecision) {
  Kokkos::View<double*, Mem> a("test::a", 4), c("test::c", 4), rounded;
  try {
    lather::Impl::gemm_strided_batched(Space(), ProductPrecision::tf32, rounded, 'N', 'N', 2, 2, 2, 1.0, a.data(), 0,
                                       a.data(), 0, 0.0, c.data(), 0, 1);
    FAIL() << "tf32 of double data was accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find("tf32"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("double"), std::string::npos) << e.message();
  }
}

}  // namespace
