#include <lather/optim/impl/shampoo_plan.hpp>

#include <lather/core/error.hpp>

#include <algorithm>
#include <numeric>

namespace lather::optim::Impl {

namespace {

/// The reference's shape interpretation, except that a split parameter keeps its split axis as a
/// dimension of its own (merge_small_dims_around). Returns the interpreted shape and where the
/// split axis landed (-1: not split).
std::pair<TensorShape, int> interpret(const TensorShape& shape, int split_axis, const ShampooOptions& options) {
  if (!options.best_effort_shape_interpretation) return {shape, split_axis};
  const auto max_dim = options.merge_small_dims_block_size;
  if (split_axis < 0) return {merge_small_dims(shape, max_dim), -1};
  return merge_small_dims_around(shape, split_axis, max_dim);
}

}  // namespace

ShampooPlan make_plan(const std::vector<ParameterSpec>& parameters, const ShampooOptions& options) {
  ShampooPlan plan;
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    ParameterPlan pp;
    pp.spec = parameters[p];
    pp.elements = element_count(pp.spec.shape);
    const auto& shape = pp.spec.global();
    // The reference's _skip_preconditioning looks at the original (global) shape.
    const bool too_large = std::any_of(shape.begin(), shape.end(),
                                       [&](std::int64_t d) { return d > options.skip_preconditioning_dim_size_gt; });
    pp.preconditioned = int(shape.size()) >= options.skip_preconditioning_rank_lt && !too_large;
    const auto interpreted = interpret(shape, pp.spec.split_axis, options);
    TensorShape global = interpreted.first;
    int split = interpreted.second;
    pp.local_shape = interpret(pp.spec.shape, pp.spec.split_axis, options).first;
    // A band of rows of the whole tensor's blocks: the whole tensor's reading, the band a range of
    // its first interpreted dimension (which holds the rows, merged with the dimensions after them
    // when they are small: `inner` elements per row).
    std::int64_t inner = 1;
    if (pp.spec.split() && pp.spec.band_of_whole) {
      LATHER_REQUIRE(pp.spec.split_axis == 0, "Shampoo: parameter '", pp.spec.name,
                     "' is a band of rows split along axis ", pp.spec.split_axis);
      global = interpret(shape, -1, options).first;
      split = 0;
      inner = global.front() / shape.front();
      pp.local_shape = global;
      pp.local_shape.front() = pp.spec.shape.front() * inner;
    }
    // A band of rows of a column slice (a piece cut along two axes): the slice's reading, the band
    // a range of its first interpreted dimension, which holds the rows (merged with the dimensions
    // after them and before the split axis when they are small: `row_inner` elements per row).
    std::int64_t row_begin = 0, row_end = 0;
    const bool row_band = pp.spec.row_band();
    if (row_band) {
      LATHER_REQUIRE(split > 0 && global.front() % shape.front() == 0, "Shampoo: parameter '", pp.spec.name,
                     "' is a band of rows of a slice along axis ", pp.spec.split_axis,
                     ", but its reading merges its rows with the split axis");
      const std::int64_t row_inner = global.front() / shape.front();
      pp.local_shape = global;
      pp.local_shape[std::size_t(split)] = pp.spec.shape[std::size_t(pp.spec.split_axis)];
      pp.local_shape.front() = pp.spec.shape.front() * row_inner;
      row_begin = pp.spec.row_offset * row_inner;
      row_end = row_begin + pp.local_shape.front();
    }
    // Blocks are cut at block_size along the dimensions with a statistic, and one-sided, at
    // unpreconditioned_block_size along the others.
    const auto dims = preconditioned_dimensions(int(global.size()), options.preconditioner_type);
    const auto at_block_size = [&](std::size_t d) {
      return options.unpreconditioned_block_size <= 0 || std::find(dims.begin(), dims.end(), int(d)) != dims.end();
    };
    std::vector<std::int64_t> extents(global.size());
    for (std::size_t d = 0; d < global.size(); ++d)
      extents[d] = at_block_size(d) ? options.block_size : options.unpreconditioned_block_size;
    pp.partition = BlockPartition(global, extents);
    pp.quantized_momentum = options.best_effort_memory_usage_reduction && pp.spec.shape.size() > 1;
    // int8 momentum scales each column by its maximum over the rows: a band of a column slice has
    // neither all the rows nor the columns of the other bands of its rows.
    LATHER_REQUIRE(!(row_band && pp.quantized_momentum), "Shampoo: parameter '", pp.spec.name,
                   "' is a band of rows of a weight shard's column slice, whose int8 momentum is not supported: ",
                   "turn off best_effort_memory_usage_reduction");
    if (pp.preconditioned && pp.partition.rank() == 0) pp.preconditioned = false;
    if (pp.preconditioned) {
      LATHER_REQUIRE(split < 0 || global.size() == pp.local_shape.size(), "Shampoo: parameter '", pp.spec.name,
                     "': its slice and the whole tensor are interpreted differently");
      const std::int64_t begin = split >= 0 ? pp.spec.split_offset * inner : 0;
      const std::int64_t end = split >= 0 ? begin + pp.local_shape[split] : 0;
      pp.dims = dims;
      pp.exponent = options.exponent_override > 0 ? options.exponent_override : 2 * int(pp.dims.size());
      pp.first_statistic = plan.num_statistics();
      std::int64_t packed = 0;
      for (const auto& block : pp.partition.blocks()) {
        const int first = plan.num_statistics();
        for (int d : pp.dims) {
          const auto size = block.size[std::size_t(d)];
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
                         pp.spec.name, "' cuts its block [", b0, ", ", b1, ") (block extent ", extents[split],
                         at_block_size(std::size_t(split)) ? " = block_size" : " = unpreconditioned_block_size",
                         "); choose weight shards whose slices are multiples of it");
          local.offset[split] -= begin;
        }
        if (row_band) {
          const std::int64_t b0 = block.offset.front(), b1 = b0 + block.size.front();
          if (b1 <= row_begin || b0 >= row_end) continue;  // another band's block
          LATHER_REQUIRE(b0 >= row_begin && b1 <= row_end, "Shampoo: the band of rows [", row_begin, ", ", row_end,
                         ") of parameter '", pp.spec.name, "' cuts its block [", b0, ", ", b1, ")");
          local.offset.front() -= row_begin;
        }
        local.packed_offset = packed;
        packed += local.elements();
        pp.local_blocks.push_back(local);
        pp.local_block_statistic.push_back(first);
        for (std::size_t j = 0; j < pp.dims.size(); ++j) plan.local_statistics.push_back(first + int(j));
      }
      pp.statistics = plan.num_statistics() - pp.first_statistic;
    }
    plan.parameters.push_back(std::move(pp));
  }
  plan.max_size = std::max(plan.max_size, 1);
  return plan;
}

namespace {

/// Graft-path tensors are cut into ranges of at most this many elements, so that the ranks can
/// share a large one (an embedding) and the update kernels get enough teams.
constexpr std::int64_t graft_range = std::int64_t(1) << 16;

/// The relative time of a unit's share of a step: element-wise passes, the Gram and
/// preconditioning products (2 n E flops per dimension each), and the roots (n^3 per statistic,
/// a few times the flops of a product, every preconditioning_compute_steps steps).
double unit_cost(const ParameterPlan& pp, const WorkUnit& unit, const ShampooOptions& options) {
  double cost = 40.0 * double(unit.elements);
  if (unit.block < 0) return cost;
  const auto& block = pp.local_blocks[std::size_t(unit.block)];
  for (int d : pp.dims) {
    const double n = double(block.size[std::size_t(d)]);
    cost += 4.0 * n * double(unit.elements);
    cost += 30.0 * n * n * n / double(options.preconditioning_compute_steps);
  }
  return cost;
}

}  // namespace

StepPlan make_step_plan(const ShampooPlan& plan, const ShampooOptions& options, int ranks, int parts, int part,
                        const PartAssignment& assign) {
  StepPlan step;
  step.distributed = parts > 1;
  step.parts = parts;
  step.part = part;
  for (std::size_t p = 0; p < plan.parameters.size(); ++p) {
    const auto& pp = plan.parameters[p];
    if (pp.preconditioned) {
      for (std::size_t b = 0; b < pp.local_blocks.size(); ++b)
        step.units.push_back({int(p), int(b), 0, pp.local_blocks[b].elements(), 0.0});
    } else {
      for (std::int64_t begin = 0; begin < pp.elements; begin += graft_range)
        step.units.push_back({int(p), -1, begin, std::min(graft_range, pp.elements - begin), 0.0});
    }
  }
  for (auto& unit : step.units) unit.cost = unit_cost(plan.parameters[unit.parameter], unit, options);

  // Parts: the distribution strategy's assignment by cost (the same on every rank).
  std::vector<double> costs;
  for (const auto& unit : step.units) costs.push_back(unit.cost);
  step.owner = assign(costs);

  // Packed order of every part: its preconditioned units grouped by block shape (groups in order
  // of first appearance), then its graft-path units.
  const auto shape_of = [&](int u) -> const std::vector<std::int64_t>& {
    const auto& unit = step.units[u];
    return plan.parameters[unit.parameter].local_blocks[std::size_t(unit.block)].size;
  };
  step.order.assign(step.parts, {});
  step.packed_offset.assign(step.units.size(), 0);
  step.part_elements.assign(step.parts, 0);
  for (int part = 0; part < step.parts; ++part) {
    std::vector<ShapeGroup> groups;
    std::vector<int> graft_path;
    for (std::size_t u = 0; u < step.units.size(); ++u) {
      if (step.owner[u] != part) continue;
      if (step.units[u].block < 0) {
        graft_path.push_back(int(u));
        continue;
      }
      auto it =
          std::find_if(groups.begin(), groups.end(), [&](const ShapeGroup& g) { return g.size == shape_of(int(u)); });
      if (it == groups.end())
        it = groups.insert(groups.end(),
                           ShapeGroup{shape_of(int(u)), plan.parameters[step.units[u].parameter].dims, {}, 0});
      it->units.push_back(int(u));
    }
    auto& order = step.order[part];
    for (const auto& g : groups) order.insert(order.end(), g.units.begin(), g.units.end());
    order.insert(order.end(), graft_path.begin(), graft_path.end());
    for (int u : order) {
      step.packed_offset[u] = step.part_elements[part];
      step.part_elements[part] += step.units[u].elements;
    }
    if (part == step.part) step.groups = std::move(groups);
  }

  // Slots: the statistics of this rank's groups, dimension by dimension, so that a group's
  // matrices of one dimension are consecutive slots.
  step.slot.assign(plan.num_statistics(), -1);
  for (auto& group : step.groups) {
    group.first_slot = int(step.stored.size());
    for (std::size_t j = 0; j < group.dims.size(); ++j)
      for (int u : group.units) {
        const auto& unit = step.units[u];
        const int s = plan.parameters[unit.parameter].local_block_statistic[std::size_t(unit.block)] + int(j);
        step.slot[s] = int(step.stored.size());
        step.stored.push_back(s);
      }
  }

  // Roots: distributed, the owner of a block computes its statistics' roots; replicated, the
  // group splits the statistics of this shard (balanced on n^3 or the reference's even split).
  step.root_owner.assign(plan.num_statistics(), -1);
  if (step.distributed) {
    for (std::size_t u = 0; u < step.units.size(); ++u) {
      const auto& unit = step.units[u];
      if (unit.block < 0) continue;
      const auto& pp = plan.parameters[unit.parameter];
      const int first = pp.local_block_statistic[std::size_t(unit.block)];
      for (std::size_t j = 0; j < pp.dims.size(); ++j) step.root_owner[first + int(j)] = step.owner[u];
    }
  } else {
    std::vector<int> sizes;
    for (int s : plan.local_statistics) sizes.push_back(plan.statistic_size[s]);
    const auto owners =
        assign_statistics(sizes, ranks, options.balance_root_work ? RootAssignment::balanced : RootAssignment::even);
    for (std::size_t k = 0; k < plan.local_statistics.size(); ++k)
      step.root_owner[plan.local_statistics[k]] = owners[k];
  }
  return step;
}

}  // namespace lather::optim::Impl
