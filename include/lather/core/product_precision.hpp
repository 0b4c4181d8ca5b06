#pragma once
// The precision of a matrix product's inputs where the hardware has tensor cores: TF32 (8
// exponent bits, 11 significant bits) or bfloat16 (8 exponent bits, 8 significant bits), the
// products accumulated in float32. Both formats keep float32's exponent range, so rounding a
// float to one of them is rounding its significand alone: the helpers below do it in a float
// (the value the format holds), usable in kernels. They round to nearest, ties to even; a value
// at or past the midpoint between the format's largest finite value and 2^128 becomes +-inf, as
// IEEE rounding does; +-inf and the sign of zero are kept; subnormals round on the same grid
// (the formats have float32's subnormals, fewer of their bits); a NaN stays a quiet NaN of the
// same sign.
//
// The product of two TF32 or two bfloat16 values is exact in float32 (22 and 16 significant
// bits), so a float32 GEMM of rounded copies computes what a tensor core computes, up to the
// order of the float32 additions.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <string>

namespace lather {

/// What the inputs of a float matrix product are rounded to before the product (accumulation in
/// float32 either way): float32 leaves them as they are.
enum class ProductPrecision { float32, tf32, bfloat16 };

/// "float32", "tf32" or "bfloat16".
std::string to_string(ProductPrecision precision);
/// "float32" (or "fp32"), "tf32", "bfloat16" (or "bf16"); anything else throws lather::Error
/// naming `what` (the option being read) and the value.
ProductPrecision parse_product_precision(const std::string& name, const std::string& what = "product precision");

/// The significand bits the format keeps, the implicit bit included: 24, 11 or 8.
KOKKOS_INLINE_FUNCTION constexpr int significand_bits(ProductPrecision precision) {
  return precision == ProductPrecision::tf32 ? 11 : precision == ProductPrecision::bfloat16 ? 8 : 24;
}

/// `x` rounded to a float with `kept` explicit significand bits (0 < kept <= 23; 10 for TF32, 7
/// for bfloat16), as described at the top.
KOKKOS_INLINE_FUNCTION float round_significand(float x, int kept) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  const int dropped = 23 - kept;
  if (dropped <= 0) return x;
  const std::uint32_t low = (std::uint32_t(1) << dropped) - 1u;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: the kept payload bits and the quiet bit, so that the result is a NaN of the format
    // (a payload in the dropped bits alone would otherwise round to infinity).
    u = (u & ~low) | 0x00400000u;
  } else {
    // Half a unit in the last kept place, less one, plus the last kept bit: ties go to the even
    // neighbour. A carry out of the significand bumps the exponent (to +-inf at the top); +-inf
    // has no dropped bits set and stays.
    u += (low >> 1) + ((u >> dropped) & 1u);
    u &= ~low;
  }
  float y = 0;
  std::memcpy(&y, &u, sizeof(y));
  return y;
}

/// `x` rounded to TF32 (10 explicit significand bits).
KOKKOS_INLINE_FUNCTION float round_to_tf32(float x) { return round_significand(x, 10); }
/// `x` rounded to bfloat16 (7 explicit significand bits), returned as the float it equals.
KOKKOS_INLINE_FUNCTION float round_to_bfloat16(float x) { return round_significand(x, 7); }

/// `x` rounded to `precision` (float32: unchanged).
KOKKOS_INLINE_FUNCTION float round_to(float x, ProductPrecision precision) {
  return precision == ProductPrecision::float32 ? x : round_significand(x, significand_bits(precision) - 1);
}

}  // namespace lather
