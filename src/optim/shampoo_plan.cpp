#include "shampoo_plan.hpp"

#include <lather/core/error.hpp>

#include <algorithm>

namespace lather::optim::Impl {

namespace {

/// Where the split axis of `spec` lands in the interpreted shapes; -1 if the parameter is whole.
/// Throws when interpretation merges the split axis with others (the slice would not be a box).
int interpreted_split_dimension(const ParameterSpec& spec, const TensorShape& global, const TensorShape& local) {
  if (!spec.split() || global == local) return -1;
  LATHER_REQUIRE(global.size() == local.size(), "Shampoo: parameter '", spec.name, "' is split along axis ",
                 spec.split_axis, ", which best_effort_shape_interpretation merges with others (global ",
                 lather::to_string(global), ", local ", lather::to_string(local),
                 "); turn it off or change merge_small_dims_block_size");
  int found = -1;
  for (std::size_t d = 0; d < global.size(); ++d)
    if (global[d] != local[d]) {
      LATHER_REQUIRE(found < 0 && global[d] == spec.global()[spec.split_axis] && local[d] == spec.shape[spec.split_axis],
                     "Shampoo: parameter '", spec.name, "' is split along axis ", spec.split_axis,
                     ", which best_effort_shape_interpretation merges with others; turn it off or change "
                     "merge_small_dims_block_size");
      found = int(d);
    }
  return found;
}

}  // namespace

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options) {
  ShampooPlan plan;
  const auto interpret = [&](const TensorShape& shape) {
    return options.best_effort_shape_interpretation ? merge_small_dims(shape, options.merge_small_dims_block_size)
                                                    : shape;
  };
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    ParameterPlan pp;
    pp.spec = parameters[p];
    pp.elements = element_count(pp.spec.shape);
    plan.max_elements = std::max(plan.max_elements, pp.elements);
    const auto& shape = pp.spec.global();
    // The reference's _skip_preconditioning looks at the original (global) shape.
    const bool too_large = std::any_of(shape.begin(), shape.end(), [&](std::int64_t d) {
      return d > options.skip_preconditioning_dim_size_gt;
    });
    pp.preconditioned = int(shape.size()) >= options.skip_preconditioning_rank_lt && !too_large;
    const TensorShape global = interpret(shape);
    pp.local_shape = interpret(pp.spec.shape);
    pp.partition = BlockPartition(global, options.block_size);
    pp.quantized_momentum = options.best_effort_memory_usage_reduction && pp.spec.shape.size() > 1;
    if (pp.preconditioned && pp.partition.rank() == 0) pp.preconditioned = false;
    if (pp.preconditioned) {
      const int split = interpreted_split_dimension(pp.spec, global, pp.local_shape);
      const std::int64_t begin = split >= 0 ? pp.spec.split_offset : 0;
      const std::int64_t end = split >= 0 ? begin + pp.local_shape[split] : 0;
      pp.exponent = options.exponent_override > 0 ? options.exponent_override : 2 * pp.partition.rank();
      pp.first_statistic = plan.num_statistics();
      std::int64_t packed = 0;
      for (const auto& block : pp.partition.blocks()) {
        const int first = plan.num_statistics();
        for (auto size : block.size) {
          plan.statistic_size.push_back(int(size));
          plan.statistic_exponent.push_back(pp.exponent);
          plan.statistic_owner.push_back(int(p));
          plan.max_size = std::max(plan.max_size, int(size));
        }
        Block local = block;
        if (split >= 0) {
          const std::int64_t b0 = block.offset[split], b1 = b0 + block.size[split];
          if (b1 <= begin || b0 >= end) continue;  // another shard's block
          LATHER_REQUIRE(b0 >= begin && b1 <= end, "Shampoo: the slice [", begin, ", ", end, ") of parameter '",
                         pp.spec.name, "' cuts its block [", b0, ", ", b1, ") (block_size ", options.block_size,
                         "); choose weight shards whose slices are multiples of block_size");
          local.offset[split] -= begin;
        }
        local.packed_offset = packed;
        packed += local.elements();
        pp.local_blocks.push_back(local);
        pp.local_block_statistic.push_back(first);
        for (std::size_t j = 0; j < block.size.size(); ++j) plan.local_statistics.push_back(first + int(j));
      }
      pp.statistics = plan.num_statistics() - pp.first_statistic;
    }
    plan.parameters.push_back(std::move(pp));
  }
  plan.max_size = std::max(plan.max_size, 1);
  return plan;
}

}  // namespace lather::optim::Impl
