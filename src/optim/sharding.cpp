#include <lather/optim/sharding.hpp>

#include <lather/core/error.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>

#include <algorithm>
#include <numeric>

namespace lather::optim {

std::vector<comm::ShardLayout> shampoo_shard_layouts(const std::vector<ParameterSpec>& parameters,
                                                     const ShampooOptions& options) {
  std::vector<comm::ShardLayout> layouts;
  for (const auto& spec : parameters) {
    LATHER_REQUIRE(!spec.split() || spec.shape == spec.global(), "Shampoo: parameter '", spec.name,
                   "' is already a weight shard's slice; sharded parameters cannot split it again");
    comm::ShardLayout layout;
    if (spec.shape.empty()) {  // a scalar: no rows to split
      layout.replicated = true;
      layouts.push_back(layout);
      continue;
    }
    const std::int64_t row_elements = element_count(spec.shape) / spec.shape.front();
    // How the replicated run reads the tensor, and how it reads a band of it (comm::band_of, as
    // ParameterShards::slices hands it over). Where the two differ (a tensor split along its
    // columns whose rows merge with them), the tensor is replicated.
    const Impl::ShampooPlan plan = Impl::make_plan({spec}, options);
    const auto& pp = plan.parameters.front();
    const ParameterSpec band = comm::band_of(spec, 0, spec.shape.front());
    if (Impl::make_plan({band}, options).parameters.front().partition.shape() != pp.partition.shape()) {
      layout.replicated = true;
      layouts.push_back(layout);
      continue;
    }
    // The reading's first dimension holds the rows, merged with the small dimensions after them
    // (`inner` elements per row); bands are cut where its blocks are.
    const std::int64_t inner = pp.partition.shape().front() / spec.shape.front();
    // The cost balanced is memory, what sharding is for, in floats: a value, its gradient and
    // three floats of per-element state (the graft's statistics, two momenta) per element, and two
    // padded slots (statistic, preconditioner) per statistic of a block in the unit.
    if (!pp.preconditioned) {
      layout.unit_cost = 5.0 * double(row_elements);  // the graft path: any row
    } else {
      // The rows of the first row of blocks, made whole rows: lcm(block extent, inner) / inner.
      const std::int64_t extent = pp.partition.split_sizes().front().front();
      layout.unit_rows = std::lcm(extent, inner) / inner;
      const double slot = double(options.block_size) * double(options.block_size);
      const std::int64_t first_rows_end = layout.unit_rows * inner;
      for (const auto& block : pp.partition.blocks())
        if (block.offset.front() < first_rows_end)
          layout.unit_cost += 5.0 * double(block.elements()) + 2.0 * slot * double(pp.dims.size());
    }
    layouts.push_back(layout);
  }
  return layouts;
}

std::vector<comm::ShardLayout> whole_parameter_shard_layouts(const std::vector<ParameterSpec>& parameters) {
  std::vector<comm::ShardLayout> layouts;
  for (const auto& spec : parameters) {
    const std::int64_t rows = spec.shape.empty() ? 1 : spec.shape.front();
    const std::int64_t elements = element_count(spec.shape);
    comm::ShardLayout layout;
    layout.unit_rows = rows;
    layout.unit_cost = double(elements) * double(std::max<std::int64_t>(1, std::min(rows, elements / rows)));
    layouts.push_back(layout);
  }
  return layouts;
}

}  // namespace lather::optim
