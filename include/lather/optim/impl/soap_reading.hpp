#pragma once
// How SOAP reads a parameter it may hold only a piece of: the merged shape whose blocks it keeps
// (Soap's constructor) and the ranges of that shape's dimensions the piece covers. The same
// reading cuts the bands of sharded parameters (optim::soap_shard_layouts).
//
//  * the whole tensor: merge_small_dims of its shape;
//  * rows of the whole (a band of comm::ParameterShards, a weight shard's slice along axis 0, or a
//    band of one): the whole tensor's reading, the rows a range of its first dimension (which holds
//    them, merged with the small dimensions after them: `inner` elements per row);
//  * a weight shard's slice along a later axis, or a band of rows of one (row_offset): the whole
//    tensor read with the split axis kept apart (merge_small_dims_around, as Shampoo reads it), the
//    slice a range of that dimension and the band a range of the first. Where merging would join
//    the split axis with its neighbours, this reading blocks the tensor otherwise than a run
//    without weight shards does.
// The piece holds the blocks inside its ranges; a block it cuts is an error naming the parameter.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/parameters.hpp>
#include <lather/optim/partition.hpp>

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

namespace lather::optim::Impl {

struct SoapReading {
  TensorShape shape;  ///< the whole tensor's merged reading, which is blocked
  /// Per dimension of `shape`: the range [first, end) this rank's piece holds.
  std::vector<std::pair<std::int64_t, std::int64_t>> held;
  bool piece = false;  ///< the piece is not the whole tensor
  TensorShape local() const {
    TensorShape out;
    for (const auto& [first, end] : held) out.push_back(end - first);
    return out;
  }
  /// The block's offset in the piece, or false when the block lies outside it; throws when the
  /// piece cuts it.
  bool place(Block& block, const std::string& name) const {
    for (std::size_t d = 0; d < held.size(); ++d) {
      const std::int64_t b0 = block.offset[d], b1 = b0 + block.size[d];
      if (b1 <= held[d].first || b0 >= held[d].second) return false;  // another piece's block
    }
    for (std::size_t d = 0; d < held.size(); ++d) {
      const std::int64_t b0 = block.offset[d], b1 = b0 + block.size[d];
      LATHER_REQUIRE(b0 >= held[d].first && b1 <= held[d].second, "Soap: the piece [", held[d].first, ", ",
                     held[d].second, ") of dimension ", d, " of parameter '", name, "''s reading cuts its block [", b0,
                     ", ", b1, "); pieces must hold whole blocks (optim::soap_shard_layouts, or block sizes that ",
                     "divide the weight shards' slices)");
      block.offset[d] -= held[d].first;
    }
    return true;
  }
};

/// `pieces`: the parameters may be pieces of the whole (Soap with a group of shards); otherwise a
/// parameter is read as the tensor it is.
inline SoapReading soap_reading(const ParameterSpec& spec, std::int64_t merge_small_dims_block_size, bool pieces) {
  const auto merge = [&](const TensorShape& shape) {
    return merge_small_dims_block_size > 0 ? merge_small_dims(shape, merge_small_dims_block_size) : shape;
  };
  SoapReading r;
  const auto& global = spec.global();
  r.piece = pieces && spec.shape != global;
  const bool rows = r.piece && (spec.band_of_whole || spec.split_axis == 0);
  int split = -1;  // a slice along a later axis: where its axis lands in the reading
  if (!r.piece) {
    r.shape = merge(spec.shape);
  } else if (rows) {
    r.shape = merge(global);
    LATHER_REQUIRE(spec.split_axis == 0 && !r.shape.empty() && global[0] > 0, "Soap: parameter '", spec.name,
                   "' is a band split along axis ", spec.split_axis, "; a band must be rows (axis 0) of the whole");
  } else if (merge_small_dims_block_size > 0) {
    std::tie(r.shape, split) = merge_small_dims_around(global, spec.split_axis, merge_small_dims_block_size);
  } else {
    r.shape = global;
    split = spec.split_axis;
  }
  for (auto d : r.shape) r.held.push_back({0, d});
  if (rows) {
    const std::int64_t inner = r.shape[0] / global[0];
    r.held[0] = {spec.split_offset * inner, (spec.split_offset + spec.shape[0]) * inner};
  } else if (r.piece) {
    r.held[std::size_t(split)] = {spec.split_offset, spec.split_offset + spec.shape[std::size_t(spec.split_axis)]};
    if (spec.row_band()) {
      // The rows are the first dimension of the reading, merged with the dimensions after them and
      // before the split axis when they are small: `row_inner` elements per row.
      LATHER_REQUIRE(split > 0 && r.shape[0] % global[0] == 0, "Soap: parameter '", spec.name,
                     "' is a band of rows of a slice along axis ", spec.split_axis,
                     ", but its reading merges its rows with the split axis");
      const std::int64_t row_inner = r.shape[0] / global[0];
      r.held[0] = {spec.row_offset * row_inner, (spec.row_offset + spec.shape[0]) * row_inner};
    }
  }
  return r;
}

}  // namespace lather::optim::Impl
