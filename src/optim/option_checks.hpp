#pragma once
// Range checks the optimizers' options share (validate() of SGD, AdaGrad, Adam, SOAP and Muon):
// each throws lather::Error naming the field and the value it got.

#include <lather/core/error.hpp>

#include <cmath>

namespace lather::optim::Impl {

inline void require_unit_interval(double value, const char* name) {
  LATHER_REQUIRE(std::isfinite(value) && value >= 0 && value < 1, name, " must be in [0, 1), got ", value);
}
inline void require_non_negative(double value, const char* name) {
  LATHER_REQUIRE(std::isfinite(value) && value >= 0, name, " must be >= 0, got ", value);
}

}  // namespace lather::optim::Impl
