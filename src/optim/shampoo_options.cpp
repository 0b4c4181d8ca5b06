#include <lather/optim/shampoo_options.hpp>

#include <lather/core/error.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace lather::optim {

namespace {
const std::pair<GraftType, const char*> graft_names[] = {
    {GraftType::sgd, "SGD"},         {GraftType::adagrad, "ADAGRAD"},
    {GraftType::rmsprop, "RMSPROP"}, {GraftType::rmsprop_normalized, "RMSPROP_NORMALIZED"},
    {GraftType::sqrt_n, "SQRT_N"},   {GraftType::adagrad_normalized, "ADAGRAD_NORMALIZED"},
    {GraftType::none, "NONE"},
};
}  // namespace

std::string to_string(GraftType graft) {
  for (const auto& [type, name] : graft_names)
    if (type == graft) return name;
  return "SGD";
}

std::string to_string(GraftGranularity granularity) {
  return granularity == GraftGranularity::block ? "block" : "tensor";
}

GraftGranularity parse_graft_granularity(const std::string& name) {
  if (name == "tensor" || name == "TENSOR") return GraftGranularity::tensor;
  if (name == "block" || name == "BLOCK") return GraftGranularity::block;
  LATHER_FAIL("unknown graft_granularity '", name, "' (expected tensor or block)");
}

GraftType parse_graft_type(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  std::replace(upper.begin(), upper.end(), '-', '_');
  for (const auto& [type, known] : graft_names)
    if (upper == known) return type;
  LATHER_FAIL("unknown graft type '", name,
              "' (expected SGD, ADAGRAD, ADAGRAD_NORMALIZED, RMSPROP, RMSPROP_NORMALIZED, SQRT_N or NONE)");
}

std::string to_string(PreconditionerType type) {
  switch (type) {
    case PreconditionerType::all:
      return "ALL";
    case PreconditionerType::input:
      return "INPUT";
    case PreconditionerType::output:
      return "OUTPUT";
  }
  return "ALL";
}

PreconditionerType parse_preconditioner_type(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (auto type : {PreconditionerType::all, PreconditionerType::input, PreconditionerType::output})
    if (upper == to_string(type)) return type;
  LATHER_FAIL("unknown preconditioner type '", name, "' (expected ALL, INPUT or OUTPUT)");
}

std::vector<int> preconditioned_dimensions(int rank, PreconditionerType type) {
  std::vector<int> dims;
  for (int d = 0; d < rank; ++d) {
    const bool last = d == rank - 1;
    if (rank <= 1 || type == PreconditionerType::all || (type == PreconditionerType::input && !last) ||
        (type == PreconditionerType::output && last))
      dims.push_back(d);
  }
  return dims;
}

std::string to_string(StepMode mode) {
  switch (mode) {
    case StepMode::automatic:
      return "auto";
    case StepMode::replicated:
      return "replicated";
    case StepMode::distributed:
      return "distributed";
  }
  return "auto";
}

StepMode parse_step_mode(const std::string& name) {
  for (auto mode : {StepMode::automatic, StepMode::replicated, StepMode::distributed})
    if (name == to_string(mode)) return mode;
  if (name == "automatic") return StepMode::automatic;
  LATHER_FAIL("unknown step mode '", name, "' (expected auto, replicated or distributed)");
}

bool graft_has_diagonal_statistics(GraftType graft) {
  return graft != GraftType::sgd && graft != GraftType::sqrt_n && graft != GraftType::none;
}

void ShampooOptions::validate() const {
  learning_rate.validate();
  const auto finite = [](double x) { return std::isfinite(x); };
  LATHER_REQUIRE(block_size >= 1, "ShampooOptions::block_size must be >= 1, got ", block_size);
  LATHER_REQUIRE(finite(beta1) && beta1 >= 0 && beta1 < 1, "ShampooOptions::beta1 must be in [0, 1), got ", beta1);
  LATHER_REQUIRE(finite(beta2) && beta2 > 0 && beta2 <= 1, "ShampooOptions::beta2 must be in (0, 1], got ", beta2);
  LATHER_REQUIRE(finite(diagonal_epsilon) && diagonal_epsilon >= 0,
                 "ShampooOptions::diagonal_epsilon must be >= 0, got ", diagonal_epsilon);
  LATHER_REQUIRE(finite(matrix_epsilon) && matrix_epsilon >= 0, "ShampooOptions::matrix_epsilon must be >= 0, got ",
                 matrix_epsilon);
  LATHER_REQUIRE(finite(weight_decay) && weight_decay >= 0, "ShampooOptions::weight_decay must be >= 0, got ",
                 weight_decay);
  LATHER_REQUIRE(start_preconditioning_step >= 0, "ShampooOptions::start_preconditioning_step must be >= 0, got ",
                 start_preconditioning_step);
  LATHER_REQUIRE(preconditioning_compute_steps >= 1, "ShampooOptions::preconditioning_compute_steps must be >= 1, got ",
                 preconditioning_compute_steps);
  LATHER_REQUIRE(statistics_compute_steps >= 1, "ShampooOptions::statistics_compute_steps must be >= 1, got ",
                 statistics_compute_steps);
  LATHER_REQUIRE(exponent_override >= 0, "ShampooOptions::exponent_override must be >= 0, got ", exponent_override);
  LATHER_REQUIRE(finite(inverse_failure_threshold) && inverse_failure_threshold > 0,
                 "ShampooOptions::inverse_failure_threshold must be > 0, got ", inverse_failure_threshold);
  LATHER_REQUIRE(skip_preconditioning_dim_size_gt >= 1,
                 "ShampooOptions::skip_preconditioning_dim_size_gt must be >= 1, got ",
                 skip_preconditioning_dim_size_gt);
  LATHER_REQUIRE(finite(clip_by_scaled_gradient_norm) && clip_by_scaled_gradient_norm >= 0,
                 "ShampooOptions::clip_by_scaled_gradient_norm must be >= 0 (0 disables), got ",
                 clip_by_scaled_gradient_norm);
  LATHER_REQUIRE(unpreconditioned_block_size >= 0,
                 "ShampooOptions::unpreconditioned_block_size must be >= 0 (0: block_size), got ",
                 unpreconditioned_block_size);
  LATHER_REQUIRE(merge_small_dims_block_size >= 1, "ShampooOptions::merge_small_dims_block_size must be >= 1, got ",
                 merge_small_dims_block_size);
  LATHER_REQUIRE(skip_preconditioning_rank_lt >= 0, "ShampooOptions::skip_preconditioning_rank_lt must be >= 0, got ",
                 skip_preconditioning_rank_lt);
  LATHER_REQUIRE(max_consecutive_root_failures >= 0, "ShampooOptions::max_consecutive_root_failures must be >= 0, got ",
                 max_consecutive_root_failures);
  LATHER_REQUIRE(graft_granularity == GraftGranularity::tensor ||
                     (graft_type != GraftType::adagrad_normalized && graft_type != GraftType::rmsprop_normalized),
                 "ShampooOptions: graft_granularity = block takes the SGD, ADAGRAD, RMSPROP or SQRT_N graft (the "
                 "normalized grafts divide by the whole tensor's gradient norm), got ",
                 to_string(graft_type));
  LATHER_REQUIRE(!(shard_optimizer_states && step_mode == StepMode::replicated),
                 "ShampooOptions: shard_optimizer_states = true asks for the distributed step, but step_mode is "
                 "replicated");
  LATHER_REQUIRE(!async_roots || root.method != linalg::RootMethod::newton,
                 "ShampooOptions::async_roots needs root_method eigh or eigh_host (host threads compute "
                 "eigendecompositions; Newton runs on the execution space), got root_method ",
                 linalg::to_string(root.method));
  root.validate();
  LATHER_REQUIRE(product_precision == ProductPrecision::float32 || statistics_precision == linalg::Precision::float32,
                 "ShampooOptions::product_precision ", to_string(product_precision),
                 " rounds float products; with statistics_precision float64 the products are double (use "
                 "product_precision float32 or statistics_precision float32)");
  LATHER_REQUIRE(product_host_threads >= 0 && product_host_threads <= 1024,
                 "ShampooOptions::product_host_threads must be in [0, 1024], got ", product_host_threads);
}

namespace {

double parse_double(const std::string& name, const std::string& value) {
  // strtod rather than std::stod: stod throws for a subnormal result (ERANGE), which would refuse
  // numbers option_value prints. Overflow (ERANGE with an infinite result) is still refused.
  char* end = nullptr;
  errno = 0;
  const double x = value.empty() ? 0.0 : std::strtod(value.c_str(), &end);
  LATHER_REQUIRE(!value.empty() && end == value.c_str() + value.size(), "Shampoo option ", name, ": '", value,
                 "' is not a number");
  LATHER_REQUIRE(!(errno == ERANGE && std::isinf(x)), "Shampoo option ", name, ": '", value,
                 "' is out of the range of a double");
  return x;
}

long parse_long(const std::string& name, const std::string& value) {
  try {
    std::size_t used = 0;
    const long x = std::stol(value, &used);
    if (used == value.size()) return x;
  } catch (const std::out_of_range&) {
    LATHER_FAIL("Shampoo option ", name, ": '", value, "' is out of the range of a 64-bit integer");
  } catch (const std::exception&) {
  }
  LATHER_FAIL("Shampoo option ", name, ": '", value, "' is not an integer");
}

/// The options held as int: a value past int's range is refused, not truncated.
int parse_int(const std::string& name, const std::string& value) {
  const long x = parse_long(name, value);
  LATHER_REQUIRE(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max(), "Shampoo option ", name,
                 ": ", x, " is out of the range of an int");
  return int(x);
}

/// The shortest text that reads back (strtod) as exactly `x`: what option_value prints is a value
/// set_option accepts and maps to the same number (six digits, the stream default, need not).
std::string format_double(double x) {
  char text[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, x);
    if (std::strtod(text, nullptr) == x) break;  // never for NaN: it keeps the 17-digit form, "nan"
  }
  return text;
}

bool parse_bool(const std::string& name, const std::string& value) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  LATHER_FAIL("Shampoo option ", name, ": '", value, "' is not a boolean (true/false)");
}

}  // namespace

const std::vector<std::string>& option_names() {
  static const std::vector<std::string> names = {"learning_rate",
                                                 "block_size",
                                                 "beta1",
                                                 "beta2",
                                                 "diagonal_epsilon",
                                                 "matrix_epsilon",
                                                 "weight_decay",
                                                 "start_preconditioning_step",
                                                 "preconditioning_compute_steps",
                                                 "statistics_compute_steps",
                                                 "best_effort_shape_interpretation",
                                                 "graft_type",
                                                 "graft_granularity",
                                                 "nesterov",
                                                 "exponent_override",
                                                 "kl_shampoo",
                                                 "precondtioner_type",
                                                 "shard_optimizer_states",
                                                 "best_effort_memory_usage_reduction",
                                                 "inverse_failure_threshold",
                                                 "moving_average_for_momentum",
                                                 "skip_preconditioning_dim_size_gt",
                                                 "clip_by_scaled_gradient_norm",
                                                 "relative_matrix_epsilon",
                                                 "merge_small_dims_block_size",
                                                 "skip_preconditioning_rank_lt",
                                                 "decoupled_learning_rate",
                                                 "decoupled_weight_decay",
                                                 "generate_training_metrics",
                                                 "unpreconditioned_block_size",
                                                 "root_method",
                                                 "root_compute_precision",
                                                 "root_max_iterations",
                                                 "root_tolerance",
                                                 "root_host_threads",
                                                 "product_host_threads",
                                                 "retry_failed_roots_in_double",
                                                 "max_consecutive_root_failures",
                                                 "statistics_precision",
                                                 "product_precision",
                                                 "balance_root_work",
                                                 "step_mode",
                                                 "async_roots",
                                                 "async_roots_in_background",
                                                 "shared_memory_gather"};
  return names;
}

std::string option_help(const std::string& name) {
  static const std::pair<const char*, const char*> help[] = {
      {"learning_rate", "step size (constant; drivers offer schedules)"},
      {"block_size", "largest block: dimensions above it are split into blocks of this size"},
      {"beta1", "momentum"},
      {"beta2", "moving average of the statistics (1: a plain sum); also RMSProp graft's"},
      {"diagonal_epsilon", "added to the root of the graft's diagonal statistics"},
      {"matrix_epsilon", "ridge: added to the statistics before the inverse root, times lambda_max if relative"},
      {"weight_decay", "L2 weight decay (added to the update; decoupled: see decoupled_weight_decay)"},
      {"start_preconditioning_step", "steps before Shampoo's direction replaces the graft's"},
      {"preconditioning_compute_steps", "inverse roots are recomputed every this many steps"},
      {"statistics_compute_steps", "statistics are updated every this many steps"},
      {"best_effort_shape_interpretation", "merge small dimensions (up to merge_small_dims_block_size)"},
      {"graft_type",
       "SGD, ADAGRAD, ADAGRAD_NORMALIZED, RMSPROP, RMSPROP_NORMALIZED, SQRT_N or NONE (the direction as it is)"},
      {"graft_granularity",
       "tensor (the reference: a tensor's direction takes its graft's norm) or block (Meta's: each block's)"},
      {"nesterov", "Nesterov momentum"},
      {"exponent_override", "p of the inverse p-th root (0: 2 x preconditioned dimensions of the block)"},
      {"kl_shampoo",
       "KL-Shampoo's statistics: each dimension's Gram matrix of the block preconditioned along the others"},
      {"precondtioner_type",
       "ALL, INPUT (all but the last dimension) or OUTPUT (the last only); "
       "alias preconditioner_type"},
      {"preconditioner_type", "alias of precondtioner_type (the reference's spelling)"},
      {"shard_optimizer_states", "each rank keeps only its share of the state (selects the distributed step)"},
      {"best_effort_memory_usage_reduction", "int8 momentum, int16 statistics and preconditioners"},
      {"inverse_failure_threshold", "roots with an error at or above this keep the previous preconditioner"},
      {"moving_average_for_momentum", "momentum as a moving average (weight 1 - beta1)"},
      {"skip_preconditioning_dim_size_gt", "tensors with a dimension above this use the graft update"},
      {"clip_by_scaled_gradient_norm", "clip the RMSProp graft by this scaled norm (0 or none: off)"},
      {"relative_matrix_epsilon", "scale matrix_epsilon by the largest eigenvalue"},
      {"merge_small_dims_block_size", "largest product of merged dimensions"},
      {"skip_preconditioning_rank_lt", "tensors of lower rank use the graft update (2: biases too)"},
      {"decoupled_learning_rate", "apply the learning rate after momentum (the reference's default)"},
      {"decoupled_weight_decay", "weight decay added after momentum, times the learning rate"},
      {"generate_training_metrics", "keep per-statistic inverse-root errors"},
      {"unpreconditioned_block_size",
       "one-sided Shampoo: block extent along the dimensions without a statistic "
       "(0: block_size, as the reference)"},
      {"root_method",
       "newton (coupled Newton iteration), eigh (eigendecomposition on the execution space: cuSOLVER on "
       "CUDA, LAPACK on a host backend) or eigh_host (LAPACK on host threads wherever the statistics are)"},
      {"root_compute_precision", "float32 or float64 for the inverse roots"},
      {"root_max_iterations", "Newton iteration limit"},
      {"root_tolerance", "Newton stops at max|M - I| <= this"},
      {"root_host_threads",
       "eigh on a host backend, eigh_host: host threads taking the roots at once (0: the CPUs this rank has to itself "
       "on its node; "
       "with async_roots, 0 is one thread on a host backend and those CPUs less one on a device)"},
      {"product_host_threads",
       "host backends: threads sharing out the blocks' statistics and preconditioning "
       "products, each on one BLAS thread (0: the CPUs this rank has to itself on its node, fewer for "
       "small products)"},
      {"retry_failed_roots_in_double", "recompute a failed float32 root in float64 before rejecting it"},
      {"max_consecutive_root_failures", "error after this many failed roots in a row of one statistic (0: never)"},
      {"statistics_precision", "float32 or float64 statistics and preconditioners"},
      {"product_precision",
       "float32, tf32 or bfloat16: inputs of the statistics and preconditioning products rounded to it, "
       "accumulated in float32 (tensor cores on CUDA; emulated elsewhere)"},
      {"balance_root_work", "replicated step: assign roots to ranks by n^3 cost (else even split by count)"},
      {"step_mode", "auto, replicated or distributed: how the ranks of a group share the step"},
      {"async_roots",
       "install the roots of a preconditioning step at the next one, computed meanwhile on "
       "host threads (needs root_method eigh or eigh_host; root_host_threads says how many)"},
      {"async_roots_in_background",
       "async_roots: compute on host threads (false: the same stale schedule "
       "in the foreground)"},
      {"shared_memory_gather",
       "distributed step on one node: gather the new values through node-shared memory "
       "(false: MPI_Allgatherv)"},
  };
  for (const auto& [key, text] : help)
    if (name == key) return text;
  LATHER_FAIL("unknown Shampoo option '", name, "'");
}

std::string option_value(const ShampooOptions& o, const std::string& name) {
  std::ostringstream out;
  out << std::boolalpha;
  if (name == "learning_rate")
    out << format_double(o.learning_rate.peak);
  else if (name == "block_size")
    out << o.block_size;
  else if (name == "beta1")
    out << format_double(o.beta1);
  else if (name == "beta2")
    out << format_double(o.beta2);
  else if (name == "diagonal_epsilon")
    out << format_double(o.diagonal_epsilon);
  else if (name == "matrix_epsilon")
    out << format_double(o.matrix_epsilon);
  else if (name == "weight_decay")
    out << format_double(o.weight_decay);
  else if (name == "start_preconditioning_step")
    out << o.start_preconditioning_step;
  else if (name == "preconditioning_compute_steps")
    out << o.preconditioning_compute_steps;
  else if (name == "statistics_compute_steps")
    out << o.statistics_compute_steps;
  else if (name == "best_effort_shape_interpretation")
    out << o.best_effort_shape_interpretation;
  else if (name == "graft_type")
    out << to_string(o.graft_type);
  else if (name == "graft_granularity")
    out << to_string(o.graft_granularity);
  else if (name == "nesterov")
    out << o.nesterov;
  else if (name == "exponent_override")
    out << o.exponent_override;
  else if (name == "kl_shampoo")
    out << o.kl_shampoo;
  else if (name == "precondtioner_type" || name == "preconditioner_type")
    out << to_string(o.preconditioner_type);
  else if (name == "shard_optimizer_states")
    out << o.shard_optimizer_states;
  else if (name == "best_effort_memory_usage_reduction")
    out << o.best_effort_memory_usage_reduction;
  else if (name == "inverse_failure_threshold")
    out << format_double(o.inverse_failure_threshold);
  else if (name == "moving_average_for_momentum")
    out << o.moving_average_for_momentum;
  else if (name == "skip_preconditioning_dim_size_gt")
    out << o.skip_preconditioning_dim_size_gt;
  else if (name == "clip_by_scaled_gradient_norm")
    out << format_double(o.clip_by_scaled_gradient_norm);
  else if (name == "relative_matrix_epsilon")
    out << o.relative_matrix_epsilon;
  else if (name == "merge_small_dims_block_size")
    out << o.merge_small_dims_block_size;
  else if (name == "skip_preconditioning_rank_lt")
    out << o.skip_preconditioning_rank_lt;
  else if (name == "decoupled_learning_rate")
    out << o.decoupled_learning_rate;
  else if (name == "decoupled_weight_decay")
    out << o.decoupled_weight_decay;
  else if (name == "generate_training_metrics")
    out << o.generate_training_metrics;
  else if (name == "unpreconditioned_block_size")
    out << o.unpreconditioned_block_size;
  else if (name == "root_method")
    out << linalg::to_string(o.root.method);
  else if (name == "root_compute_precision")
    out << linalg::to_string(o.root.compute_precision);
  else if (name == "root_max_iterations")
    out << o.root.max_iterations;
  else if (name == "root_tolerance")
    out << format_double(o.root.tolerance);
  else if (name == "root_host_threads")
    out << o.root.host_threads;
  else if (name == "product_host_threads")
    out << o.product_host_threads;
  else if (name == "retry_failed_roots_in_double")
    out << o.retry_failed_roots_in_double;
  else if (name == "max_consecutive_root_failures")
    out << o.max_consecutive_root_failures;
  else if (name == "statistics_precision")
    out << linalg::to_string(o.statistics_precision);
  else if (name == "product_precision")
    out << to_string(o.product_precision);
  else if (name == "balance_root_work")
    out << o.balance_root_work;
  else if (name == "step_mode")
    out << to_string(o.step_mode);
  else if (name == "async_roots")
    out << o.async_roots;
  else if (name == "async_roots_in_background")
    out << o.async_roots_in_background;
  else if (name == "shared_memory_gather")
    out << o.shared_memory_gather;
  else
    LATHER_FAIL("unknown Shampoo option '", name, "'");
  return out.str();
}

void set_option(ShampooOptions& o, const std::string& name, const std::string& value) {
  const auto d = [&] { return parse_double(name, value); };
  const auto l = [&] { return parse_long(name, value); };
  const auto i = [&] { return parse_int(name, value); };
  const auto b = [&] { return parse_bool(name, value); };
  if (name == "learning_rate")
    o.learning_rate = LearningRateSchedule::constant(d());
  else if (name == "block_size")
    o.block_size = i();
  else if (name == "beta1")
    o.beta1 = d();
  else if (name == "beta2")
    o.beta2 = d();
  else if (name == "diagonal_epsilon")
    o.diagonal_epsilon = d();
  else if (name == "matrix_epsilon")
    o.matrix_epsilon = d();
  else if (name == "weight_decay")
    o.weight_decay = d();
  else if (name == "start_preconditioning_step")
    o.start_preconditioning_step = l();
  else if (name == "preconditioning_compute_steps")
    o.preconditioning_compute_steps = l();
  else if (name == "statistics_compute_steps")
    o.statistics_compute_steps = l();
  else if (name == "best_effort_shape_interpretation")
    o.best_effort_shape_interpretation = b();
  else if (name == "graft_type")
    o.graft_type = parse_graft_type(value);
  else if (name == "graft_granularity")
    o.graft_granularity = parse_graft_granularity(value);
  else if (name == "nesterov")
    o.nesterov = b();
  else if (name == "exponent_override")
    o.exponent_override = i();
  else if (name == "kl_shampoo")
    o.kl_shampoo = b();
  else if (name == "precondtioner_type" || name == "preconditioner_type")
    o.preconditioner_type = parse_preconditioner_type(value);
  else if (name == "shard_optimizer_states")
    o.shard_optimizer_states = b();
  else if (name == "best_effort_memory_usage_reduction")
    o.best_effort_memory_usage_reduction = b();
  else if (name == "inverse_failure_threshold")
    o.inverse_failure_threshold = d();
  else if (name == "moving_average_for_momentum")
    o.moving_average_for_momentum = b();
  else if (name == "skip_preconditioning_dim_size_gt")
    o.skip_preconditioning_dim_size_gt = l();
  else if (name == "clip_by_scaled_gradient_norm")
    o.clip_by_scaled_gradient_norm = value == "none" ? 0.0 : d();
  else if (name == "relative_matrix_epsilon")
    o.relative_matrix_epsilon = b();
  else if (name == "merge_small_dims_block_size")
    o.merge_small_dims_block_size = l();
  else if (name == "skip_preconditioning_rank_lt")
    o.skip_preconditioning_rank_lt = i();
  else if (name == "decoupled_learning_rate")
    o.decoupled_learning_rate = b();
  else if (name == "decoupled_weight_decay")
    o.decoupled_weight_decay = b();
  else if (name == "generate_training_metrics")
    o.generate_training_metrics = b();
  else if (name == "unpreconditioned_block_size")
    o.unpreconditioned_block_size = l();
  else if (name == "root_method")
    o.root.method = linalg::parse_root_method(value);
  else if (name == "root_compute_precision")
    o.root.compute_precision = linalg::parse_precision(value);
  else if (name == "root_max_iterations")
    o.root.max_iterations = i();
  else if (name == "root_tolerance")
    o.root.tolerance = d();
  else if (name == "root_host_threads")
    o.root.host_threads = i();
  else if (name == "product_host_threads")
    o.product_host_threads = i();
  else if (name == "retry_failed_roots_in_double")
    o.retry_failed_roots_in_double = b();
  else if (name == "max_consecutive_root_failures")
    o.max_consecutive_root_failures = i();
  else if (name == "statistics_precision")
    o.statistics_precision = linalg::parse_precision(value);
  else if (name == "product_precision")
    o.product_precision = parse_product_precision(value, "Shampoo option product_precision");
  else if (name == "balance_root_work")
    o.balance_root_work = b();
  else if (name == "step_mode")
    o.step_mode = parse_step_mode(value);
  else if (name == "async_roots")
    o.async_roots = b();
  else if (name == "async_roots_in_background")
    o.async_roots_in_background = b();
  else if (name == "shared_memory_gather")
    o.shared_memory_gather = b();
  else
    LATHER_FAIL("unknown Shampoo option '", name, "'");
}

}  // namespace lather::optim
