#include <lather/optim/partition.hpp>

#include <lather/core/error.hpp>
#include <lather/optim/distribution.hpp>

#include <algorithm>
#include <numeric>

namespace lather::optim {

TensorShape merge_small_dims(const TensorShape& shape, std::int64_t max_dim) {
  if (!shape.empty() && std::all_of(shape.begin(), shape.end(), [](std::int64_t d) { return d == 1; })) return {1};
  TensorShape merged;
  std::int64_t product = 1;
  for (std::int64_t d : shape) {
    if (product * d <= max_dim) {
      product *= d;
    } else {
      if (product > 1) merged.push_back(product);
      product = d;
    }
  }
  if (product > 1) merged.push_back(product);
  return merged;
}

std::pair<TensorShape, int> merge_small_dims_around(const TensorShape& shape, int split_axis, std::int64_t max_dim) {
  LATHER_REQUIRE(split_axis >= 0 && split_axis < int(shape.size()), "merge_small_dims_around: split axis ", split_axis,
                 " of a shape of rank ", shape.size());
  const auto merge_part = [&](TensorShape part) {
    if (std::all_of(part.begin(), part.end(), [](std::int64_t d) { return d == 1; })) return TensorShape{};
    return merge_small_dims(part, max_dim);
  };
  TensorShape out = merge_part(TensorShape(shape.begin(), shape.begin() + split_axis));
  const int split = int(out.size());
  out.push_back(shape[std::size_t(split_axis)]);
  const TensorShape after = merge_part(TensorShape(shape.begin() + split_axis + 1, shape.end()));
  out.insert(out.end(), after.begin(), after.end());
  return {out, split};
}

std::int64_t Block::elements() const {
  std::int64_t n = 1;
  for (auto s : size) n *= s;
  return n;
}

BlockPartition::BlockPartition(const TensorShape& shape, std::int64_t block_size)
    : BlockPartition(shape, std::vector<std::int64_t>(shape.size(), block_size)) {}

BlockPartition::BlockPartition(const TensorShape& shape, const std::vector<std::int64_t>& block_sizes)
    : m_shape(shape) {
  LATHER_REQUIRE(block_sizes.size() == shape.size(), "BlockPartition: ", block_sizes.size(),
                 " block extents for a shape of rank ", shape.size());
  m_elements = element_count(shape);
  for (std::size_t axis = 0; axis < shape.size(); ++axis) {
    const std::int64_t d = shape[axis], block_size = block_sizes[axis];
    std::vector<std::int64_t> sizes;
    if (block_size > 0 && block_size < d) {
      for (std::int64_t start = 0; start < d; start += block_size) sizes.push_back(std::min(block_size, d - start));
    } else {
      sizes.push_back(d);
    }
    m_split_sizes.push_back(sizes);
  }
  // Enumerate blocks row-major over block indices (itertools.product order).
  const int r = rank();
  std::vector<std::size_t> index(r, 0);
  std::int64_t packed = 0;
  for (;;) {
    Block block;
    block.offset.resize(r);
    block.size.resize(r);
    for (int d = 0; d < r; ++d) {
      std::int64_t offset = 0;
      for (std::size_t k = 0; k < index[d]; ++k) offset += m_split_sizes[d][k];
      block.offset[d] = offset;
      block.size[d] = m_split_sizes[d][index[d]];
    }
    block.packed_offset = packed;
    packed += block.elements();
    m_blocks.push_back(block);
    int d = r - 1;
    while (d >= 0 && ++index[d] == m_split_sizes[d].size()) index[d--] = 0;
    if (d < 0) break;
  }
}

std::vector<int> BlockPartition::statistic_sizes() const {
  std::vector<int> sizes;
  for (const auto& block : m_blocks)
    for (auto s : block.size) sizes.push_back(int(s));
  return sizes;
}

std::vector<int> assign_statistics(const std::vector<int>& sizes, int ranks, RootAssignment how) {
  LATHER_REQUIRE(ranks >= 1, "assign_statistics: ranks must be >= 1, got ", ranks);
  const int n = int(sizes.size());
  std::vector<int> owner(n, 0);
  if (how == RootAssignment::even) {
    // The reference pads the stack to a multiple of the rank count and gives each rank an equal
    // contiguous slice.
    const int per_rank = (n + ranks - 1) / ranks;
    for (int s = 0; s < n; ++s) owner[s] = per_rank > 0 ? s / per_rank : 0;
    return owner;
  }
  // Balanced: longest processing time on the roots' cost, n^3.
  std::vector<double> costs;
  for (int size : sizes) costs.push_back(double(size) * size * size);
  return longest_processing_time(costs, ranks);
}

double load_imbalance(const std::vector<int>& sizes, const std::vector<int>& owner, int ranks) {
  std::vector<double> load(ranks, 0.0);
  // Statistics owned by no rank of this group (another weight shard's) do not count.
  for (std::size_t s = 0; s < sizes.size(); ++s)
    if (owner[s] >= 0) load[owner[s]] += double(sizes[s]) * sizes[s] * sizes[s];
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (total == 0) return 1.0;
  return *std::max_element(load.begin(), load.end()) / (total / ranks);
}

}  // namespace lather::optim
