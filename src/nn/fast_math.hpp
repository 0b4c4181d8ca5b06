#pragma once
// Element-wise functions the host compiler vectorises, for the nn kernels (glibc's expf and tanhf
// are one call per element: the softmax's exponentials were half of the host attention's time,
// GELU's tanh 40% of a transformer step).

#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

// Not in an unnamed namespace: CUDA cannot launch extended lambdas from functions in one.
namespace lather::nn::Impl {

namespace kmath = ::lather::Impl::kmath;

/// e^x for x <= 0 in a form the host compiler vectorises (glibc's expf is one call per element,
/// and was half of the host softmax's time): x = n ln2 + r with |r| <= ln2 / 2, e^r by Cephes'
/// expf polynomial, 2^n from the exponent bits. Relative error <= 8.4e-8 over [-87, 0] (checked
/// against exp in double for every float there). Arguments below -87 give e^-87 ~ 1.6e-38, as
/// good as 0 beside the row's largest term, 1; NaN stays NaN. The clamp is done on the bits,
/// without a floating-point comparison, which the vectoriser would not turn into a select.
KOKKOS_INLINE_FUNCTION float exp_nonpositive(float x) {
  constexpr std::uint32_t lowest = 0xC2AE0000u;  // -87.0f
  std::uint32_t pattern;
  std::memcpy(&pattern, &x, sizeof pattern);
  // Negative, below -87 (a larger pattern), and not NaN (magnitude at most infinity's pattern).
  const std::uint32_t not_nan = ((0x7f800000u - (pattern & 0x7fffffffu)) >> 31) ^ 1u;
  const std::uint32_t below = (pattern >> 31) & ((lowest - pattern) >> 31) & not_nan;
  const std::uint32_t mask = 0u - below;
  pattern = (pattern & ~mask) | (lowest & mask);
  std::memcpy(&x, &pattern, sizeof x);
  const int n = int(x * 1.44269504088896341f - 0.5f);  // nearest integer (x <= 0: truncation rounds up)
  const float r = (x - float(n) * 0.693359375f) + float(n) * 2.12194440e-4f;  // ln2 in two parts
  float polynomial = 1.9875691500e-4f;
  polynomial = polynomial * r + 1.3981999507e-3f;
  polynomial = polynomial * r + 8.3334519073e-3f;
  polynomial = polynomial * r + 4.1665795894e-2f;
  polynomial = polynomial * r + 1.6666665459e-1f;
  polynomial = polynomial * r + 5.0000001201e-1f;
  polynomial = polynomial * r * r + r + 1.0f;
  const std::int32_t exponent = std::int32_t(n + 127) << 23;
  float power;
  std::memcpy(&power, &exponent, sizeof power);
  return polynomial * power;
}
KOKKOS_INLINE_FUNCTION double exp_nonpositive(double x) { return kmath::exp(x); }

/// tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2 |u|) <= 1: in float, an absolute error of
/// about 1e-7 (exp_nonpositive's relative 8.4e-8 on e), so 1 + tanh, what GELU uses, is as
/// accurate as float allows; in double, exp itself.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar tanh_fast(Scalar u) {
  const Scalar magnitude = u < Scalar(0) ? -u : u;
  const Scalar e = exp_nonpositive(Scalar(-2) * magnitude);
  const Scalar t = (Scalar(1) - e) / (Scalar(1) + e);
  return u < Scalar(0) ? -t : t;
}

}  // namespace lather::nn::Impl
