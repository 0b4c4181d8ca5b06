#pragma once
// How Shampoo sees a parameter: the reference's best-effort shape interpretation (merge small
// dimensions) and block partitioning (split dimensions larger than block_size, remainder blocks
// last), with one statistic per dimension of every block; and how the statistics are assigned to
// the ranks that share the work.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/tensor.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace lather::optim {

/// The reference's merge_small_dims: consecutive dimensions are multiplied together while the
/// product stays <= max_dim; dimensions of size 1 vanish; all-ones becomes [1].
/// [1, 2, 512, 1, 2048, 1, 3, 4] with max_dim 1024 -> [1024, 2048, 12].
TensorShape merge_small_dims(const TensorShape& shape, std::int64_t max_dim);

/// merge_small_dims of a tensor split along `split_axis` (a weight shard's slice, or the whole
/// tensor it is a slice of): the split axis stays a dimension of its own, and the dimensions
/// before and after it merge separately (a run of ones merges to nothing), so the whole tensor and
/// each slice are read alike and their blocks line up. Returns the merged shape and where the
/// split axis landed in it. [4, 6, 32, 3, 3] split at 2 with max_dim 64 -> ([24, 32, 9], 1).
std::pair<TensorShape, int> merge_small_dims_around(const TensorShape& shape, int split_axis, std::int64_t max_dim);

/// One block of a partitioned tensor.
struct Block {
  std::vector<std::int64_t> offset;  ///< first index along each dimension
  std::vector<std::int64_t> size;    ///< extent along each dimension
  std::int64_t packed_offset = 0;    ///< where the block starts in the packed (block-major) buffer
  std::int64_t elements() const;
};

/// The partition of one (already interpreted) shape into blocks of at most block_size per
/// dimension. Blocks are ordered as the reference orders them: row-major over block indices, the
/// first dimension outermost. block_size <= 0 means no partitioning.
class BlockPartition {
 public:
  BlockPartition() = default;
  BlockPartition(const TensorShape& shape, std::int64_t block_size);
  /// The same with an extent of its own along each dimension (one-sided Shampoo's blocks, cut only
  /// along the dimensions with a statistic): block_sizes[d] <= 0 keeps dimension d whole.
  BlockPartition(const TensorShape& shape, const std::vector<std::int64_t>& block_sizes);

  const TensorShape& shape() const { return m_shape; }
  int rank() const { return int(m_shape.size()); }
  const std::vector<Block>& blocks() const { return m_blocks; }
  /// Sizes of the splits along dimension d (the reference's split_sizes()).
  const std::vector<std::vector<std::int64_t>>& split_sizes() const { return m_split_sizes; }
  /// Statistic sizes in order: for each block, one per dimension.
  std::vector<int> statistic_sizes() const;
  std::int64_t elements() const { return m_elements; }

 private:
  TensorShape m_shape;
  std::vector<std::vector<std::int64_t>> m_split_sizes;
  std::vector<Block> m_blocks;
  std::int64_t m_elements = 1;
};

/// How statistics are assigned to the ranks of a group for their inverse roots.
enum class RootAssignment {
  even,     ///< the reference: the padded stack split into equal contiguous slices by count
  balanced  ///< greedy longest-processing-time on the root cost n^3
};

/// owner[s] for each statistic of the given sizes; cost of statistic s is size[s]^3.
std::vector<int> assign_statistics(const std::vector<int>& sizes, int ranks, RootAssignment how);
/// max over ranks of the summed n^3 cost, divided by the mean over ranks (1 is perfect balance).
double load_imbalance(const std::vector<int>& sizes, const std::vector<int>& owner, int ranks);

}  // namespace lather::optim
