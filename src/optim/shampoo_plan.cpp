#include "shampoo_plan.hpp"

#include <algorithm>

namespace lather::optim::Impl {

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options) {
  ShampooPlan plan;
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    ParameterPlan pp;
    pp.spec = parameters[p];
    pp.elements = element_count(pp.spec.shape);
    plan.max_elements = std::max(plan.max_elements, pp.elements);
    const auto& shape = pp.spec.shape;
    // The reference's _skip_preconditioning looks at the original shape.
    const bool too_large = std::any_of(shape.begin(), shape.end(), [&](std::int64_t d) {
      return d > options.skip_preconditioning_dim_size_gt;
    });
    pp.preconditioned = int(shape.size()) >= options.skip_preconditioning_rank_lt && !too_large;
    const TensorShape interpreted = options.best_effort_shape_interpretation
                                        ? merge_small_dims(shape, options.merge_small_dims_block_size)
                                        : shape;
    pp.partition = BlockPartition(interpreted, options.block_size);
    pp.quantized_momentum = options.best_effort_memory_usage_reduction && shape.size() > 1;
    if (pp.preconditioned && pp.partition.rank() == 0) pp.preconditioned = false;
    if (pp.preconditioned) {
      pp.exponent = options.exponent_override > 0 ? options.exponent_override : 2 * pp.partition.rank();
      pp.first_statistic = plan.num_statistics();
      for (int size : pp.partition.statistic_sizes()) {
        plan.statistic_size.push_back(size);
        plan.statistic_exponent.push_back(pp.exponent);
        plan.statistic_owner.push_back(int(p));
        plan.max_size = std::max(plan.max_size, size);
      }
      pp.statistics = plan.num_statistics() - pp.first_statistic;
    }
    plan.parameters.push_back(std::move(pp));
  }
  plan.max_size = std::max(plan.max_size, 1);
  return plan;
}

}  // namespace lather::optim::Impl
