#pragma once
// 16-bit formats for gradients on the wire -- bfloat16 (8 exponent bits, 8 significant bits) and
// IEEE 754 binary16 "fp16" (5 exponent bits, 11 significant bits) -- and their conversions from
// and to float, usable in kernels. Conversions to 16 bits round to nearest, ties to even; they
// overflow to +-inf exactly where IEEE rounding does, keep +-inf, keep the sign of zero, produce
// fp16 subnormals, and map NaN to a quiet NaN of the same sign (the top payload bits kept).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <string>

namespace lather::comm {

/// What travels over MPI in the sum-type reductions: the gradient's own type, or 16 bits per
/// element with the accumulation done in float (see docs/reference/collectives.md).
enum class WirePrecision { native, bfloat16, float16 };

std::string to_string(WirePrecision precision);
/// "native", "bfloat16"/"bf16", "float16"/"fp16"; throws lather::Error for anything else.
WirePrecision parse_wire_precision(const std::string& name);

namespace Impl {
KOKKOS_INLINE_FUNCTION std::uint32_t bits_of(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
KOKKOS_INLINE_FUNCTION float float_of(std::uint32_t u) {
  float x = 0;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
}  // namespace Impl

/// float -> bfloat16 bits, round to nearest even.
KOKKOS_INLINE_FUNCTION std::uint16_t float_to_bfloat16(float x) {
  const std::uint32_t u = Impl::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: truncate the payload, force the quiet bit
    return std::uint16_t((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry out of the significand
  // bumps the exponent, up to +-inf for values at or above the midpoint past the largest finite.
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t((u + rounding) >> 16);
}

KOKKOS_INLINE_FUNCTION float bfloat16_to_float(std::uint16_t h) { return Impl::float_of(std::uint32_t(h) << 16); }

/// float -> IEEE binary16 bits, round to nearest even, with subnormals.
KOKKOS_INLINE_FUNCTION std::uint16_t float_to_float16(float x) {
  const std::uint32_t u = Impl::bits_of(x);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)  // NaN: quiet, top payload bits kept
    return std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  // 65520 = 0x477ff000 is the midpoint between 65504 (largest finite, odd significand) and 2^16:
  // ties go to the even neighbour, infinity.
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // normal fp16 (>= 2^-14): rebias the exponent by 127 - 15 = 112
    std::uint32_t m = a - 0x38000000u;
    m += 0x0fffu + ((m >> 13) & 1u);
    return std::uint16_t(sign | (m >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25, half the smallest subnormal: ties to even 0
  // Subnormal: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t exponent = a >> 23;  // 102 .. 112
  const std::uint32_t significand = (a & 0x007fffffu) | 0x00800000u;
  const std::uint32_t shift = 126u - exponent;  // 14 .. 24
  std::uint32_t r = significand >> shift;
  const std::uint32_t rest = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (r & 1u))) ++r;  // may reach 0x400, the smallest normal
  return std::uint16_t(sign | r);
}

KOKKOS_INLINE_FUNCTION float float16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, significand = h & 0x03ffu;
  if (exponent == 0x1fu) return Impl::float_of(sign | 0x7f800000u | (significand << 13));
  if (exponent == 0) {
    const float magnitude = float(significand) * 5.9604644775390625e-8f;  // exact: 2^-24 units
    return sign ? -magnitude : magnitude;
  }
  return Impl::float_of(sign | ((exponent + 112u) << 23) | (significand << 13));
}

/// Encode / decode for a runtime-chosen 16-bit format (bfloat16 when `bfloat16`, else fp16).
KOKKOS_INLINE_FUNCTION std::uint16_t encode_wire16(float x, bool bfloat16) {
  return bfloat16 ? float_to_bfloat16(x) : float_to_float16(x);
}
KOKKOS_INLINE_FUNCTION float decode_wire16(std::uint16_t h, bool bfloat16) {
  return bfloat16 ? bfloat16_to_float(h) : float16_to_float(h);
}

}  // namespace lather::comm
