// The MLP split across the ranks of MPI_COMM_WORLD (tensor parallelism: hidden layers column- then
// row-parallel) against the same MLP whole on every rank: same loss, and each shard's gradients
// equal its slice of the whole model's.
#include <lather/comm/comm.hpp>
#include <lather/nn/mlp.hpp>

#include "common/host_copies.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// Both runs sum the same products in a different order (a split GEMM plus an all-reduce), so
// they agree to float rounding: ~1e-6 relative on sums of a few dozen terms.
TEST(MlpSharded, MatchesWholeModel) {
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<int> sizes = {12, 8 * size, 4 * size, 8 * size, 5};  // three hidden layers: col, row, col
  const lather::comm::Mesh mesh(MPI_COMM_WORLD, size);
  lather::nn::Mlp<Space> whole(Space(), sizes, 7);
  lather::nn::Mlp<Space> sharded(Space(), sizes, 7, mesh);

  const int rows = 6;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("x", rows, sizes[0]);
  Kokkos::View<std::int32_t*, Mem> y("y", rows);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (int i = 0; i < rows; ++i) {
    hy(i) = i % sizes.back();
    for (int k = 0; k < sizes[0]; ++k) hx(i, k) = float(std::sin(0.3 * i + 0.7 * k));
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  const auto a = whole.train_batch(Space(), x, y, false);
  const auto b = sharded.train_batch(Space(), x, y, false);
  EXPECT_NEAR(b.loss_sum, a.loss_sum, 1e-5 * std::fabs(a.loss_sum));
  EXPECT_EQ(b.correct, a.correct);

  const auto& specs = sharded.parameter_specs();
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const auto full = lather::test::host_vector(whole.parameters().gradient(p)),
               mine = lather::test::host_vector(sharded.parameters().gradient(p));
    const auto& spec = specs[p];
    ASSERT_EQ(spec.global(), whole.parameter_specs()[p].shape) << spec.name;
    // Element (i, j) of this shard's slice is element (i, j + offset) or (i + offset, j) globally.
    const std::int64_t cols = spec.shape.size() == 2 ? spec.shape[1] : spec.shape[0];
    const std::int64_t global_cols = spec.global().size() == 2 ? spec.global()[1] : spec.global()[0];
    for (std::size_t k = 0; k < mine.size(); ++k) {
      std::int64_t i = std::int64_t(k) / cols, j = std::int64_t(k) % cols;
      if (spec.split()) (spec.split_axis == 0 && spec.shape.size() == 2 ? i : j) += spec.split_offset;
      if (spec.shape.size() == 1) i = 0, j = std::int64_t(k) + (spec.split() ? spec.split_offset : 0);
      const float want = full[std::size_t(i * global_cols + j)];
      ASSERT_NEAR(mine[k], want, 1e-5f * (1 + std::fabs(want))) << spec.name << " element " << k;
    }
  }
}

}  // namespace
