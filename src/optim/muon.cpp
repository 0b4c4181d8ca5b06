#include <lather/optim/impl/muon_impl.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include "option_checks.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>

namespace lather::optim {

using Impl::require_non_negative;
using Impl::require_unit_interval;

void MuonOptions::validate() const {
  learning_rate.validate();
  require_unit_interval(beta, "MuonOptions::beta");
  LATHER_REQUIRE(ns_steps >= 0 && ns_steps <= 100, "MuonOptions::ns_steps must be in [0, 100], got ", ns_steps);
  for (std::size_t i = 0; i < ns_coefficients.size(); ++i)
    LATHER_REQUIRE(std::isfinite(ns_coefficients[i]), "MuonOptions::ns_coefficients[", i, "] must be finite, got ",
                   ns_coefficients[i]);
  // eps keeps X / (||X|| + eps) finite for a zero momentum; 0 would divide 0 by 0.
  LATHER_REQUIRE(std::isfinite(epsilon) && epsilon > 0, "MuonOptions::epsilon must be > 0, got ", epsilon);
  require_non_negative(weight_decay, "MuonOptions::weight_decay");
  require_unit_interval(adam_beta1, "MuonOptions::adam_beta1");
  require_unit_interval(adam_beta2, "MuonOptions::adam_beta2");
  require_non_negative(adam_epsilon, "MuonOptions::adam_epsilon");
  require_non_negative(adam_epsilon_root, "MuonOptions::adam_epsilon_root");
  require_non_negative(adam_weight_decay, "MuonOptions::adam_weight_decay");
  std::set<std::string> seen;
  for (const auto& name : adamw_parameters)
    LATHER_REQUIRE(seen.insert(name).second, "MuonOptions::adamw_parameters names '", name, "' twice");
}

std::vector<std::pair<std::string, std::string>> describe_muon(const MuonOptions& o) {
  const auto text = [](double x) {
    std::ostringstream out;
    out.precision(17);
    out << x;
    return out.str();
  };
  std::string coefficients, adamw;
  for (double c : o.ns_coefficients) coefficients += (coefficients.empty() ? "" : ",") + text(c);
  for (const auto& name : o.adamw_parameters) adamw += (adamw.empty() ? "" : ",") + name;
  return {{"optimizer", "muon"},
          {"learning_rate", o.learning_rate.describe()},
          {"beta", text(o.beta)},
          {"nesterov", o.nesterov ? "true" : "false"},
          {"ns_steps", std::to_string(o.ns_steps)},
          {"ns_coefficients", coefficients},
          {"epsilon", text(o.epsilon)},
          {"weight_decay", text(o.weight_decay)},
          {"adam_beta1", text(o.adam_beta1)},
          {"adam_beta2", text(o.adam_beta2)},
          {"adam_epsilon", text(o.adam_epsilon)},
          {"adam_epsilon_root", text(o.adam_epsilon_root)},
          {"adam_weight_decay", text(o.adam_weight_decay)},
          {"adamw_parameters", adamw},
          {"newton_schulz_precision", to_string(o.newton_schulz_precision)}};
}

double MuonParameterPlan::cost() const {
  return matrix ? double(rows) * double(columns) * double(std::min(rows, columns)) : 0.0;
}

std::vector<MuonParameterPlan> plan_muon(const std::vector<ParameterSpec>& parameters, const MuonOptions& options,
                                         const PartAssignment& assign) {
  std::set<std::string> forced(options.adamw_parameters.begin(), options.adamw_parameters.end());
  std::vector<MuonParameterPlan> plan(parameters.size());
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const auto& shape = parameters[p].shape;
    auto& entry = plan[p];
    // A split parameter (tensor parallelism) needs its shards' pieces joined first, which
    // ShardedMuon does. A splittable one held whole (one weight shard) is an ordinary parameter.
    LATHER_REQUIRE(!parameters[p].split() || parameters[p].shape == parameters[p].global(), "Muon: parameter '",
                   parameters[p].name, "' is split across weight shards; ShardedMuon takes the pieces of split ",
                   "parameters");
    const bool adamw = forced.erase(parameters[p].name) > 0;
    if (shape.size() < 2 || adamw) continue;
    entry.matrix = true;
    entry.rows = shape[0];
    entry.columns = element_count(shape) / std::max<std::int64_t>(shape[0], 1);
    if (shape[0] == 0) entry.columns = 0;
  }
  LATHER_REQUIRE(forced.empty(), "MuonOptions::adamw_parameters names '", forced.empty() ? "" : *forced.begin(),
                 "', which is not a parameter");
  std::vector<std::size_t> matrices;
  std::vector<double> costs;
  for (std::size_t p = 0; p < plan.size(); ++p)
    if (plan[p].matrix) matrices.push_back(p), costs.push_back(plan[p].cost());
  const std::vector<int> owners = assign(costs);
  for (std::size_t k = 0; k < matrices.size(); ++k) plan[matrices[k]].owner = owners[k];
  return plan;
}

std::vector<MuonParameterPlan> plan_muon(const std::vector<ParameterSpec>& parameters, const MuonOptions& options,
                                         int ranks) {
  LATHER_REQUIRE(ranks >= 1, "plan_muon: ranks must be >= 1, got ", ranks);
  return plan_muon(parameters, options,
                   [ranks](const std::vector<double>& costs) { return longest_processing_time(costs, ranks); });
}

template class Muon<DefaultExecutionSpace, float>;
template class Muon<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class Muon<DefaultHostExecutionSpace, float>;
template class Muon<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::optim
