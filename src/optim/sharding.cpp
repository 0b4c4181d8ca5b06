#include <lather/optim/sharding.hpp>

#include <lather/core/error.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/impl/soap_reading.hpp>
#include <lather/optim/partition.hpp>

#include <algorithm>
#include <numeric>

namespace lather::optim {

std::vector<comm::ShardLayout> shampoo_shard_layouts(const std::vector<ParameterSpec>& parameters,
                                                     const ShampooOptions& options) {
  std::vector<comm::ShardLayout> layouts;
  for (const auto& spec : parameters) {
    LATHER_REQUIRE(!spec.row_band() && !spec.band_of_whole, "Shampoo: parameter '", spec.name,
                   "' is already a band of rows; sharded parameters cut whole tensors or weight shards' slices");
    comm::ShardLayout layout;
    if (spec.shape.empty() || spec.shape.front() == 0) {  // a scalar, or a slice of no rows: nothing to split
      layout.replicated = spec.shape.empty();
      layouts.push_back(layout);
      continue;
    }
    const std::int64_t row_elements = element_count(spec.shape) / spec.shape.front();
    // How the replicated run reads the tensor, and how it reads a band of it (comm::band_of, as
    // ParameterShards::slices hands it over). Where the two differ (a tensor whose reading
    // merges its rows with the dimensions after them differently for a band), it is replicated.
    const Impl::ShampooPlan plan = Impl::make_plan({spec}, options);
    const auto& pp = plan.parameters.front();
    const ParameterSpec band = comm::band_of(spec, 0, spec.shape.front());
    if (Impl::make_plan({band}, options).parameters.front().partition.shape() != pp.partition.shape()) {
      layout.replicated = true;
      layouts.push_back(layout);
      continue;
    }
    // The reading's first dimension holds the rows, merged with the small dimensions after them
    // (`inner` elements per row); bands are cut where its blocks are. A weight shard's slice
    // begins on a block's first row, so its bands are cut alike.
    const std::int64_t inner = pp.local_shape.front() / spec.shape.front();
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
      for (const auto& block : pp.local_blocks)  // this slice's blocks, at their offsets in it
        if (block.offset.front() < first_rows_end)
          layout.unit_cost += 5.0 * double(block.elements()) + 2.0 * slot * double(pp.dims.size());
    }
    layouts.push_back(layout);
  }
  return layouts;
}

std::vector<comm::ShardLayout> soap_shard_layouts(const std::vector<ParameterSpec>& parameters,
                                                  const SoapOptions& options) {
  std::vector<comm::ShardLayout> layouts;
  for (const auto& spec : parameters) {
    LATHER_REQUIRE(!spec.row_band() && !spec.band_of_whole, "SOAP: parameter '", spec.name,
                   "' is already a band of rows; sharded parameters cut whole tensors or weight shards' slices");
    comm::ShardLayout layout;
    if (spec.shape.empty() || spec.shape.front() == 0) {  // a scalar, or a slice of no rows: nothing to split
      layout.replicated = spec.shape.empty();
      layout.unit_rows = 1;
      layouts.push_back(layout);
      continue;
    }
    // SOAP's reading (Soap's constructor, soap_reading.hpp): merged, then blocked; a weight
    // shard's slice is read as the whole tensor with its split axis kept apart, and holds the
    // blocks inside it. The reading's first dimension holds the rows, merged with the small
    // dimensions after them (`inner` elements per row); bands are cut where its blocks are.
    const Impl::SoapReading reading = Impl::soap_reading(spec, options.merge_small_dims_block_size, true);
    const BlockPartition partition(reading.shape, options.block_size);
    const std::int64_t inner = reading.shape.front() / spec.global().front();
    const std::int64_t extent = partition.split_sizes().front().front();
    layout.unit_rows = std::lcm(extent, inner) / inner;
    // The cost balanced is memory, in floats: a value, its gradient, the two moments and three
    // buffers of the step per element, and a factor and a basis (n x n) per factored dimension of
    // each block of the slice's first row of blocks.
    const auto& merged = reading.shape;
    const bool rank_ok = merged.size() >= 2 || (merged.size() == 1 && options.precondition_1d);
    const std::int64_t first_rows_end = reading.held.front().first + layout.unit_rows * inner;
    for (const auto& whole_block : partition.blocks()) {
      Block block = whole_block;
      if (whole_block.offset.front() >= first_rows_end || !reading.place(block, spec.name)) continue;
      layout.unit_cost += 7.0 * double(block.elements());
      for (std::size_t d = 0; d < block.size.size(); ++d)
        if (rank_ok && merged[d] <= options.max_precond_dim)
          layout.unit_cost += 2.0 * double(block.size[d]) * double(block.size[d]);
    }
    layouts.push_back(layout);
  }
  return layouts;
}

}  // namespace lather::optim
