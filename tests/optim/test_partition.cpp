// Shape interpretation and block partitioning against the reference's documented examples and
// against a plain element-by-element model of the block layout.
#include <lather/optim/partition.hpp>

#include <lather/optim/impl/shampoo_kernels.hpp>  // white box: the packing kernels

#include <gtest/gtest.h>

#include <numeric>

using lather::TensorShape;
using lather::optim::BlockPartition;
using lather::optim::merge_small_dims;

TEST(MergeSmallDims, ReferenceExamples) {
  EXPECT_EQ(merge_small_dims({1, 2, 512, 1, 2048, 1, 3, 4}, 1024), (TensorShape{1024, 2048, 12}));
  EXPECT_EQ(merge_small_dims({1, 2, 768, 1, 2048}, 1024), (TensorShape{2, 768, 2048}));
  EXPECT_EQ(merge_small_dims({1, 1, 1}, 1024), (TensorShape{1}));
  EXPECT_EQ(merge_small_dims({}, 1024), (TensorShape{}));
  EXPECT_EQ(merge_small_dims({3, 3, 4, 5}, 8), (TensorShape{3, 3, 4, 5}));
  EXPECT_EQ(merge_small_dims({3, 3, 4, 5}, 4096), (TensorShape{180}));
  EXPECT_EQ(merge_small_dims({3, 3, 512, 512}, 4096), (TensorShape{9, 512, 512}));
  EXPECT_EQ(merge_small_dims({4096, 2}, 4096), (TensorShape{4096, 2}));
}

TEST(BlockPartition, SplitsWithRemainderInReferenceOrder) {
  const BlockPartition p({20, 11}, 8);
  ASSERT_EQ(p.split_sizes().size(), 2u);
  EXPECT_EQ(p.split_sizes()[0], (std::vector<std::int64_t>{8, 8, 4}));
  EXPECT_EQ(p.split_sizes()[1], (std::vector<std::int64_t>{8, 3}));
  ASSERT_EQ(p.blocks().size(), 6u);
  // itertools.product order: first dimension outermost.
  EXPECT_EQ(p.blocks()[1].offset, (std::vector<std::int64_t>{0, 8}));
  EXPECT_EQ(p.blocks()[1].size, (std::vector<std::int64_t>{8, 3}));
  EXPECT_EQ(p.blocks()[2].offset, (std::vector<std::int64_t>{8, 0}));
  EXPECT_EQ(p.blocks()[5].size, (std::vector<std::int64_t>{4, 3}));
  EXPECT_EQ(p.statistic_sizes(), (std::vector<int>{8, 8, 8, 3, 8, 8, 8, 3, 4, 8, 4, 3}));
  std::int64_t packed = 0;
  for (const auto& b : p.blocks()) {
    EXPECT_EQ(b.packed_offset, packed);
    packed += b.elements();
  }
  EXPECT_EQ(packed, 220);
  // block_size >= every dimension, or <= 0: one block.
  EXPECT_EQ(BlockPartition({20, 11}, 32).blocks().size(), 1u);
  EXPECT_EQ(BlockPartition({20, 11}, 0).blocks().size(), 1u);
  EXPECT_EQ(BlockPartition({7}, 8).statistic_sizes(), (std::vector<int>{7}));
}

// Packing then unpacking restores every element, and each packed element is where the plain
// model (block by block, row-major inside the block) puts it.
TEST(BlockPartition, PackingRoundTripsForManyShapes) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Mem = Space::memory_space;
  const std::vector<std::pair<TensorShape, std::int64_t>> cases = {
      {{7}, 3},         {{20, 11}, 8},        {{4, 6, 5}, 2},    {{3, 3, 4, 5}, 2},
      {{1, 9}, 4},      {{13, 1, 6}, 5},      {{2, 3, 4, 5, 6}, 3}, {{5, 5}, 5},
      {{17, 19, 3}, 7}, {{2, 2, 2, 2, 2, 2, 2, 2}, 1},
  };
  for (const auto& [shape, block_size] : cases) {
    const BlockPartition p(shape, block_size);
    const std::int64_t n = p.elements();
    Kokkos::View<double*, Mem> tensor("tensor", n), packed("packed", n), back("back", n);
    auto host = Kokkos::create_mirror_view(tensor);
    for (std::int64_t k = 0; k < n; ++k) host(k) = double(k);
    Kokkos::deep_copy(tensor, host);
    const auto table = lather::optim::Impl::make_block_table(Kokkos::DefaultExecutionSpace(), p.shape(), p.blocks(), "test");
    lather::optim::Impl::repack_blocks<Space, double, double, Mem>(Space(), table, true, tensor, packed);
    lather::optim::Impl::repack_blocks<Space, double, double, Mem>(Space(), table, false, packed, back);
    auto packed_host = Kokkos::create_mirror_view(packed);
    auto back_host = Kokkos::create_mirror_view(back);
    Kokkos::deep_copy(packed_host, packed);
    Kokkos::deep_copy(back_host, back);
    for (std::int64_t k = 0; k < n; ++k) ASSERT_EQ(back_host(k), double(k)) << lather::to_string(shape);
    // Plain model: walk each block's elements row-major, compute the global row-major index.
    std::vector<std::int64_t> stride(shape.size(), 1);
    for (int d = int(shape.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
    for (const auto& block : p.blocks()) {
      for (std::int64_t e = 0; e < block.elements(); ++e) {
        std::int64_t rest = e, global = 0;
        for (int d = int(shape.size()) - 1; d >= 0; --d) {
          global += (block.offset[d] + rest % block.size[d]) * stride[d];
          rest /= block.size[d];
        }
        ASSERT_EQ(packed_host(block.packed_offset + e), double(global)) << lather::to_string(shape);
      }
    }
  }
}
