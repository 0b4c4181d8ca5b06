#include <lather/optim/impl/first_order_impl.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include "option_checks.hpp"

#include <cmath>
#include <sstream>

namespace lather::optim {

using Impl::require_non_negative;
using Impl::require_unit_interval;

void SgdOptions::validate() const {
  learning_rate.validate();
  require_unit_interval(momentum, "SgdOptions::momentum");
  require_non_negative(weight_decay, "SgdOptions::weight_decay");
}
void AdagradOptions::validate() const {
  learning_rate.validate();
  require_non_negative(initial_accumulator_value, "AdagradOptions::initial_accumulator_value");
  require_non_negative(epsilon, "AdagradOptions::epsilon");
  require_non_negative(weight_decay, "AdagradOptions::weight_decay");
}
void AdamOptions::validate() const {
  learning_rate.validate();
  require_unit_interval(beta1, "AdamOptions::beta1");
  require_unit_interval(beta2, "AdamOptions::beta2");
  require_non_negative(epsilon, "AdamOptions::epsilon");
  require_non_negative(weight_decay, "AdamOptions::weight_decay");
}

template class FirstOrder<DefaultExecutionSpace, float>;
template class FirstOrder<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class FirstOrder<DefaultHostExecutionSpace, float>;
template class FirstOrder<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::optim
