#include <lather/optim/shampoo_options.hpp>

#include <lather/core/error.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace lather::optim {

namespace {
const std::pair<GraftType, const char*> graft_names[] = {
    {GraftType::sgd, "SGD"},
    {GraftType::adagrad, "ADAGRAD"},
    {GraftType::rmsprop, "RMSPROP"},
    {GraftType::rmsprop_normalized, "RMSPROP_NORMALIZED"},
    {GraftType::sqrt_n, "SQRT_N"},
    {GraftType::adagrad_normalized, "ADAGRAD_NORMALIZED"},
};
}  // namespace

std::string to_string(GraftType graft) {
  for (const auto& [type, name] : graft_names)
    if (type == graft) return name;
  return "SGD";
}

GraftType parse_graft_type(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  std::replace(upper.begin(), upper.end(), '-', '_');
  for (const auto& [type, known] : graft_names)
    if (upper == known) return type;
  LATHER_FAIL("unknown graft type '", name,
              "' (expected SGD, ADAGRAD, ADAGRAD_NORMALIZED, RMSPROP, RMSPROP_NORMALIZED or SQRT_N)");
}

bool graft_has_diagonal_statistics(GraftType graft) {
  return graft != GraftType::sgd && graft != GraftType::sqrt_n;
}

void ShampooOptions::validate() const {
  learning_rate.validate();
  const auto finite = [](double x) { return std::isfinite(x); };
  LATHER_REQUIRE(block_size >= 1, "ShampooOptions::block_size must be >= 1, got ", block_size);
  LATHER_REQUIRE(finite(beta1) && beta1 >= 0 && beta1 < 1, "ShampooOptions::beta1 must be in [0, 1), got ", beta1);
  LATHER_REQUIRE(finite(beta2) && beta2 > 0 && beta2 <= 1, "ShampooOptions::beta2 must be in (0, 1], got ", beta2);
  LATHER_REQUIRE(finite(diagonal_epsilon) && diagonal_epsilon >= 0,
                 "ShampooOptions::diagonal_epsilon must be >= 0, got ", diagonal_epsilon);
  LATHER_REQUIRE(finite(matrix_epsilon) && matrix_epsilon >= 0,
                 "ShampooOptions::matrix_epsilon must be >= 0, got ", matrix_epsilon);
  LATHER_REQUIRE(finite(weight_decay) && weight_decay >= 0,
                 "ShampooOptions::weight_decay must be >= 0, got ", weight_decay);
  LATHER_REQUIRE(start_preconditioning_step >= 0,
                 "ShampooOptions::start_preconditioning_step must be >= 0, got ", start_preconditioning_step);
  LATHER_REQUIRE(preconditioning_compute_steps >= 1,
                 "ShampooOptions::preconditioning_compute_steps must be >= 1, got ", preconditioning_compute_steps);
  LATHER_REQUIRE(statistics_compute_steps >= 1,
                 "ShampooOptions::statistics_compute_steps must be >= 1, got ", statistics_compute_steps);
  LATHER_REQUIRE(exponent_override >= 0, "ShampooOptions::exponent_override must be >= 0, got ", exponent_override);
  LATHER_REQUIRE(finite(inverse_failure_threshold) && inverse_failure_threshold > 0,
                 "ShampooOptions::inverse_failure_threshold must be > 0, got ", inverse_failure_threshold);
  LATHER_REQUIRE(skip_preconditioning_dim_size_gt >= 1,
                 "ShampooOptions::skip_preconditioning_dim_size_gt must be >= 1, got ",
                 skip_preconditioning_dim_size_gt);
  LATHER_REQUIRE(finite(clip_by_scaled_gradient_norm) && clip_by_scaled_gradient_norm >= 0,
                 "ShampooOptions::clip_by_scaled_gradient_norm must be >= 0 (0 disables), got ",
                 clip_by_scaled_gradient_norm);
  LATHER_REQUIRE(merge_small_dims_block_size >= 1,
                 "ShampooOptions::merge_small_dims_block_size must be >= 1, got ", merge_small_dims_block_size);
  LATHER_REQUIRE(skip_preconditioning_rank_lt >= 0,
                 "ShampooOptions::skip_preconditioning_rank_lt must be >= 0, got ", skip_preconditioning_rank_lt);
  LATHER_REQUIRE(max_consecutive_root_failures >= 0,
                 "ShampooOptions::max_consecutive_root_failures must be >= 0, got ", max_consecutive_root_failures);
  root.validate();
}

}  // namespace lather::optim
