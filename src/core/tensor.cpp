#include <lather/core/tensor.hpp>

namespace lather {

std::string to_string(const TensorShape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace lather
