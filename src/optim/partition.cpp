#include <lather/optim/partition.hpp>

#include <lather/core/error.hpp>

#include <algorithm>

namespace lather::optim {

TensorShape merge_small_dims(const TensorShape& shape, std::int64_t max_dim) {
  if (!shape.empty() && std::all_of(shape.begin(), shape.end(), [](std::int64_t d) { return d == 1; }))
    return {1};
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

std::int64_t Block::elements() const {
  std::int64_t n = 1;
  for (auto s : size) n *= s;
  return n;
}

BlockPartition::BlockPartition(const TensorShape& shape, std::int64_t block_size) : m_shape(shape) {
  m_elements = element_count(shape);
  for (std::int64_t d : shape) {
    std::vector<std::int64_t> sizes;
    if (block_size > 0 && block_size < d) {
      for (std::int64_t start = 0; start < d; start += block_size)
        sizes.push_back(std::min(block_size, d - start));
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

}  // namespace lather::optim
