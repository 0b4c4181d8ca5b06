#pragma once
// Host-side plan of a Shampoo state: how each parameter is interpreted, partitioned and mapped to
// statistics of the global stack. Depends on the parameter shapes and options only, so every rank
// of a group derives the same plan without communication.

#include <lather/optim/optimizer.hpp>
#include <lather/optim/partition.hpp>
#include <lather/optim/shampoo_options.hpp>

#include <vector>

namespace lather::optim::Impl {

struct ParameterPlan {
  ParameterSpec spec;
  std::int64_t elements = 0;
  bool preconditioned = false;  ///< false: the graft update is used (skip rules of the reference)
  BlockPartition partition;     ///< of the interpreted (merged) shape
  int exponent = 0;
  int first_statistic = 0;  ///< index of this parameter's first statistic in the global stack
  int statistics = 0;       ///< blocks * rank
  bool quantized_momentum = false;
};

struct ShampooPlan {
  std::vector<ParameterPlan> parameters;
  std::vector<int> statistic_size;      ///< per statistic (global order)
  std::vector<int> statistic_exponent;  ///< per statistic
  std::vector<int> statistic_owner;     ///< parameter index of each statistic
  int max_size = 0;                     ///< the stack's padded matrix size (>= 1)
  std::int64_t max_elements = 0;        ///< largest parameter

  int num_statistics() const { return int(statistic_size.size()); }
};

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options);

}  // namespace lather::optim::Impl
