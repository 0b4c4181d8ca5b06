#include <lather/core/product_precision.hpp>

#include <lather/core/error.hpp>

namespace lather {

std::string to_string(ProductPrecision precision) {
  switch (precision) {
    case ProductPrecision::float32:
      return "float32";
    case ProductPrecision::tf32:
      return "tf32";
    case ProductPrecision::bfloat16:
      return "bfloat16";
  }
  return "float32";
}

ProductPrecision parse_product_precision(const std::string& name, const std::string& what) {
  if (name == "float32" || name == "fp32") return ProductPrecision::float32;
  if (name == "tf32") return ProductPrecision::tf32;
  if (name == "bfloat16" || name == "bf16") return ProductPrecision::bfloat16;
  LATHER_FAIL("unknown ", what, " '", name, "' (expected float32, tf32 or bfloat16)");
}

}  // namespace lather
