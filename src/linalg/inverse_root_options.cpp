#include <lather/linalg/inverse_root_options.hpp>

#include <lather/core/error.hpp>

#include <cmath>

namespace lather::linalg {

std::string to_string(RootMethod method) {
  switch (method) {
    case RootMethod::newton:
      return "newton";
    case RootMethod::eigh:
      return "eigh";
    case RootMethod::eigh_host:
      return "eigh_host";
  }
  return "unknown";
}

std::string to_string(Precision precision) { return precision == Precision::float32 ? "float32" : "float64"; }

RootMethod parse_root_method(const std::string& name) {
  if (name == "newton") return RootMethod::newton;
  if (name == "eigh") return RootMethod::eigh;
  if (name == "eigh_host") return RootMethod::eigh_host;
  LATHER_FAIL("unknown inverse-root method '", name, "' (expected newton, eigh or eigh_host)");
}

Precision parse_precision(const std::string& name) {
  if (name == "float32" || name == "float") return Precision::float32;
  if (name == "float64" || name == "double") return Precision::float64;
  LATHER_FAIL("unknown precision '", name, "' (expected float32 or float64)");
}

std::string to_string(RootStatus status) {
  switch (status) {
    case RootStatus::converged:
      return "converged";
    case RootStatus::max_iterations:
      return "max_iterations";
    case RootStatus::diverged:
      return "diverged";
    case RootStatus::non_finite:
      return "non_finite";
  }
  return "unknown";
}

void InverseRootOptions::validate() const {
  LATHER_REQUIRE(std::isfinite(ridge_epsilon) && ridge_epsilon >= 0,
                 "InverseRootOptions::ridge_epsilon must be finite and >= 0, got ", ridge_epsilon);
  LATHER_REQUIRE(power_iteration_max_iterations >= 1,
                 "InverseRootOptions::power_iteration_max_iterations must be >= 1, got ",
                 power_iteration_max_iterations);
  LATHER_REQUIRE(power_iteration_tolerance >= 0, "InverseRootOptions::power_iteration_tolerance must be >= 0, got ",
                 power_iteration_tolerance);
  LATHER_REQUIRE(max_iterations >= 0, "InverseRootOptions::max_iterations must be >= 0, got ", max_iterations);
  LATHER_REQUIRE(tolerance >= 0, "InverseRootOptions::tolerance must be >= 0, got ", tolerance);
  LATHER_REQUIRE(max_error_ratio > 1, "InverseRootOptions::max_error_ratio must be > 1, got ", max_error_ratio);
  LATHER_REQUIRE(workspace_bytes > 0, "InverseRootOptions::workspace_bytes must be > 0");
  LATHER_REQUIRE(batched_gemm_max_size >= -1, "InverseRootOptions::batched_gemm_max_size must be >= -1, got ",
                 batched_gemm_max_size);
  LATHER_REQUIRE(batched_eigh_max_size >= -1, "InverseRootOptions::batched_eigh_max_size must be >= -1, got ",
                 batched_eigh_max_size);
  LATHER_REQUIRE(host_threads >= 0 && host_threads <= 1024,
                 "InverseRootOptions::host_threads must be in [0, 1024], got ", host_threads);
}

}  // namespace lather::linalg
