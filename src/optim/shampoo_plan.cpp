#include <lather/optim/impl/shampoo_plan.hpp>

#include <lather/core/error.hpp>

#include <algorithm>

namespace lather::optim::Impl {

namespace {

/// merge_small_dims of a part of a shape: a part of all ones merges to nothing.
TensorShape merge_part(const TensorShape& part, std::int64_t max_dim) {
  if (std::all_of(part.begin(), part.end(), [](std::int64_t d) { return d == 1; })) return {};
  return merge_small_dims(part, max_dim);
}

/// The reference's shape interpretation, except that a split parameter keeps its split axis as a
/// dimension of its own, merging the dimensions before and after it separately: the same rule for
/// the whole tensor and for a slice makes their blocks line up. Returns the interpreted shape and
/// where the split axis landed (-1: not split).
std::pair<TensorShape, int> interpret(const TensorShape& shape, int split_axis, const ShampooOptions& options) {
  if (!options.best_effort_shape_interpretation) return {shape, split_axis};
  const auto max_dim = options.merge_small_dims_block_size;
  if (split_axis < 0) return {merge_small_dims(shape, max_dim), -1};
  TensorShape out = merge_part(TensorShape(shape.begin(), shape.begin() + split_axis), max_dim);
  const int split = int(out.size());
  out.push_back(shape[split_axis]);
  const TensorShape after = merge_part(TensorShape(shape.begin() + split_axis + 1, shape.end()), max_dim);
  out.insert(out.end(), after.begin(), after.end());
  return {out, split};
}

}  // namespace

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options) {
  ShampooPlan plan;
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
    const auto [global, split] = interpret(shape, pp.spec.split_axis, options);
    pp.local_shape = interpret(pp.spec.shape, pp.spec.split_axis, options).first;
    pp.partition = BlockPartition(global, options.block_size);
    pp.quantized_momentum = options.best_effort_memory_usage_reduction && pp.spec.shape.size() > 1;
    if (pp.preconditioned && pp.partition.rank() == 0) pp.preconditioned = false;
    if (pp.preconditioned) {
      LATHER_REQUIRE(split < 0 || global.size() == pp.local_shape.size(), "Shampoo: parameter '", pp.spec.name,
                     "': its slice and the whole tensor are interpreted differently");
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
