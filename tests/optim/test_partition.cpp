// Shape interpretation and block partitioning against the reference's documented examples and
// against a plain element-by-element model of the block layout.
#include <lather/optim/partition.hpp>

#include <lather/core/error.hpp>

#include <lather/optim/impl/shampoo_plan.hpp>  // white box: the step plan and packing kernels
#include <lather/optim/impl/step_passes.hpp>

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

// An extent per dimension (one-sided Shampoo's unpreconditioned_block_size): each dimension is cut
// at its own extent, in the same order; <= 0 or >= the dimension keeps it whole.
TEST(BlockPartition, ExtentPerDimension) {
  const BlockPartition p({20, 11}, std::vector<std::int64_t>{8, 0});
  EXPECT_EQ(p.split_sizes()[0], (std::vector<std::int64_t>{8, 8, 4}));
  EXPECT_EQ(p.split_sizes()[1], (std::vector<std::int64_t>{11}));
  ASSERT_EQ(p.blocks().size(), 3u);
  EXPECT_EQ(p.blocks()[2].offset, (std::vector<std::int64_t>{16, 0}));
  EXPECT_EQ(p.blocks()[2].size, (std::vector<std::int64_t>{4, 11}));
  EXPECT_EQ(p.statistic_sizes(), (std::vector<int>{8, 11, 8, 11, 4, 11}));
  const BlockPartition q({6, 9, 5}, std::vector<std::int64_t>{4, 4, 2});
  EXPECT_EQ(q.split_sizes()[2], (std::vector<std::int64_t>{2, 2, 1}));
  EXPECT_EQ(q.blocks().size(), 2u * 3u * 3u);
  EXPECT_EQ(q.blocks()[1].offset, (std::vector<std::int64_t>{0, 0, 2}));
  // The same extent everywhere is the single-size partition.
  const BlockPartition r({20, 11}, std::vector<std::int64_t>{8, 8});
  EXPECT_EQ(r.statistic_sizes(), BlockPartition({20, 11}, 8).statistic_sizes());
  EXPECT_THROW(BlockPartition({20, 11}, std::vector<std::int64_t>{8}), lather::Error);
}

// The plan cuts one-sided blocks at unpreconditioned_block_size along the dimensions without a
// statistic: an MLP kernel [784, 512] preconditioned on its input side has 7 statistics (blocks of
// 128 x 512 and 16 x 512) instead of 28, with the same elements.
TEST(ShampooPlan, OneSidedBlocksTakeTheirOwnExtent) {
  lather::optim::ShampooOptions o;
  o.preconditioner_type = lather::optim::PreconditionerType::input;
  const std::vector<lather::optim::ParameterSpec> specs = {{"kernel", {784, 512}}, {"bias", {512}}};
  const auto reference = lather::optim::Impl::make_plan(specs, o);
  o.unpreconditioned_block_size = 4096;
  const auto wide = lather::optim::Impl::make_plan(specs, o);
  EXPECT_EQ(reference.parameters[0].statistics, 28);
  EXPECT_EQ(wide.parameters[0].statistics, 7);
  EXPECT_EQ(wide.parameters[0].local_blocks.back().size, (std::vector<std::int64_t>{16, 512}));
  // A rank-1 tensor has a statistic along its one dimension: cut at block_size as before.
  EXPECT_EQ(wide.parameters[1].statistics, reference.parameters[1].statistics);
  EXPECT_EQ(wide.max_size, 128);
  o.unpreconditioned_block_size = 256;
  EXPECT_EQ(lather::optim::Impl::make_plan(specs, o).parameters[0].statistics, 14);
}

// Gathering a tensor into a step's packed buffer then scattering it back restores every element,
// and each packed element is where the plain model (unit by unit: a block row-major inside it,
// or a range of the flat tensor) puts it, for the packed order of every part of a distributed
// step.
TEST(StepPlan, PackingRoundTripsForManyShapes) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Mem = Space::memory_space;
  namespace impl = lather::optim::Impl;
  const std::vector<std::pair<TensorShape, std::int64_t>> cases = {
      {{7}, 3},        {{20, 11}, 8},        {{4, 6, 5}, 2}, {{3, 3, 4, 5}, 2}, {{1, 9}, 4},
      {{13, 1, 6}, 5}, {{2, 3, 4, 5, 6}, 3}, {{5, 5}, 5},    {{17, 19, 3}, 7},  {{2, 2, 2, 2, 2, 2, 2, 2}, 1},
      {{70000}, 8},
  };
  for (const auto& [shape, block_size] : cases) {
    lather::optim::ShampooOptions options;
    options.block_size = int(block_size);
    options.merge_small_dims_block_size = 1;  // keep the shape as given
    const std::vector<lather::ParameterSpec> specs = {{"w", shape}};
    const auto plan = impl::make_plan(specs, options);
    const auto& local = plan.parameters[0];
    const std::int64_t n = local.elements;
    for (int parts : {1, 3}) {
      for (int part = 0; part < parts; ++part) {
        const auto step = impl::make_step_plan(
            plan, options, parts, parts, part,
            [&](const std::vector<double>& costs) { return lather::optim::longest_processing_time(costs, parts); });
        const auto& units = step.mine();
        std::vector<std::int64_t> packed_at, state_at;
        for (int u : units) {
          packed_at.push_back(step.packed_offset[u]);
          state_at.push_back(0);
        }
        const auto table = impl::make_unit_table(Space(), plan, step, units, packed_at, state_at);
        Kokkos::View<double*, Mem> tensor("tensor", n), back("back", n);
        Kokkos::View<double*, Mem> packed("packed", std::max<std::int64_t>(step.my_elements(), 1));
        auto host = Kokkos::create_mirror_view(tensor);
        for (std::int64_t k = 0; k < n; ++k) host(k) = double(k);
        Kokkos::deep_copy(tensor, host);
        Kokkos::deep_copy(back, -1.0);
        lather::optim::Impl::PointerTable<double, Mem> in, out;
        in.update(Space(), std::vector<Kokkos::View<double*, Mem>>{tensor});
        out.update(Space(), std::vector<Kokkos::View<double*, Mem>>{back});
        impl::gather<Space, double, double, Mem>(Space(), table, in.device(), packed);
        impl::scatter<Space, double, double, Mem>(Space(), table, out.device(), packed);
        auto packed_host = Kokkos::create_mirror_view(packed);
        auto back_host = Kokkos::create_mirror_view(back);
        Kokkos::deep_copy(packed_host, packed);
        Kokkos::deep_copy(back_host, back);
        // The plain model, unit by unit.
        const auto& lshape = local.local_shape;
        std::vector<std::int64_t> stride(lshape.size(), 1);
        for (int d = int(lshape.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * lshape[d + 1];
        std::vector<char> mine(std::size_t(n), 0);
        std::int64_t covered = 0;
        for (int u : units) {
          const auto& unit = step.units[u];
          covered += unit.elements;
          for (std::int64_t e = 0; e < unit.elements; ++e) {
            std::int64_t global = unit.begin + e;
            if (unit.block >= 0) {
              const auto& block = local.local_blocks[std::size_t(unit.block)];
              std::int64_t rest = e;
              global = 0;
              for (int d = int(lshape.size()) - 1; d >= 0; --d) {
                global += (block.offset[d] + rest % block.size[d]) * stride[d];
                rest /= block.size[d];
              }
            }
            mine[std::size_t(global)] = 1;
            ASSERT_EQ(packed_host(step.packed_offset[u] + e), double(global)) << lather::to_string(shape);
          }
        }
        ASSERT_EQ(covered, step.my_elements());
        // Scatter wrote exactly this part's elements back.
        for (std::int64_t k = 0; k < n; ++k)
          ASSERT_EQ(back_host(k), mine[std::size_t(k)] ? double(k) : -1.0) << lather::to_string(shape) << " " << k;
        if (parts == 1) ASSERT_EQ(covered, n);
      }
    }
  }
}
