// Quantization round trips against the bound of linear quantization: each value comes back within
// half a quantization step (scale / 2) of itself, plus float rounding; diagonals and zero columns
// are exact.
#include <lather/optim/quantization.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

namespace {
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

template <class Code>
void check_columns(std::int64_t rows, std::int64_t columns) {
  Kokkos::View<float*, Mem> values("values", rows * columns), back("back", rows * columns);
  Kokkos::View<Code*, Mem> codes("codes", rows * columns);
  Kokkos::View<float*, Mem> scales("scales", columns);
  auto host = Kokkos::create_mirror_view(values);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (std::int64_t k = 0; k < rows * columns; ++k)
    host(k) = (k % columns == 1) ? 0.0f : normal(rng) * std::pow(10.0f, float(k % columns) - 2);
  Kokkos::deep_copy(values, host);
  lather::optim::quantize_columns<Space, float, Code>(Space(), values, rows, columns, codes, scales);
  lather::optim::dequantize_columns<Space, float, Code>(Space(), codes, scales, rows, columns, back);
  auto back_host = Kokkos::create_mirror_view(back);
  auto scale_host = Kokkos::create_mirror_view(scales);
  Kokkos::deep_copy(back_host, back);
  Kokkos::deep_copy(scale_host, scales);
  for (std::int64_t j = 0; j < columns; ++j) {
    float largest = 0;
    for (std::int64_t i = 0; i < rows; ++i) largest = std::max(largest, std::fabs(host(i * columns + j)));
    EXPECT_FLOAT_EQ(scale_host(j), largest / float(lather::optim::max_code<Code>()));
    for (std::int64_t i = 0; i < rows; ++i) {
      const float x = host(i * columns + j), y = back_host(i * columns + j);
      EXPECT_LE(std::fabs(x - y), 0.5f * scale_host(j) + 1e-6f * std::fabs(x)) << i << "," << j;
      if (x == 0.0f) EXPECT_EQ(y, 0.0f);
    }
  }
}
}  // namespace

TEST(Quantization, Int8ColumnsWithinHalfAStep) { check_columns<std::int8_t>(33, 7); }
TEST(Quantization, Int16ColumnsWithinHalfAStep) { check_columns<std::int16_t>(50, 5); }

TEST(Quantization, SymmetricKeepsDiagonalExact) {
  const int b = 3, m = 6;
  Kokkos::View<float***, Kokkos::LayoutRight, Mem> values("values", b, m, m), back("back", b, m, m);
  Kokkos::View<std::int16_t***, Kokkos::LayoutRight, Mem> codes("codes", b, m, m);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> diagonal("diagonal", b, m), scales("scales", b, m);
  Kokkos::View<int*, Mem> index("index", 2), size("size", 2);
  auto host = Kokkos::create_mirror_view(values);
  for (int k = 0; k < b; ++k)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j <= i; ++j) host(k, i, j) = host(k, j, i) = (i == j ? 100.0f + i : std::sin(1.0f + i * j + k));
  Kokkos::deep_copy(values, host);
  auto index_host = Kokkos::create_mirror_view(index);
  auto size_host = Kokkos::create_mirror_view(size);
  index_host(0) = 0, size_host(0) = 6;
  index_host(1) = 2, size_host(1) = 4;  // leading 4x4 block of matrix 2 only
  Kokkos::deep_copy(index, index_host);
  Kokkos::deep_copy(size, size_host);
  Kokkos::deep_copy(back, -7.0f);
  lather::optim::quantize_symmetric<Space, float>(Space(), values, index, size, codes, diagonal, scales);
  lather::optim::dequantize_symmetric<Space, float>(Space(), codes, diagonal, scales, index, size, back);
  auto back_host = Kokkos::create_mirror_view(back);
  auto scale_host = Kokkos::create_mirror_view(scales);
  Kokkos::deep_copy(back_host, back);
  Kokkos::deep_copy(scale_host, scales);
  for (int t = 0; t < 2; ++t) {
    const int k = index_host(t), n = size_host(t);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) {
        if (i >= n || j >= n) {
          EXPECT_EQ(back_host(k, i, j), -7.0f);  // outside the leading block: untouched
        } else if (i == j) {
          EXPECT_EQ(back_host(k, i, j), host(k, i, j));
        } else {
          EXPECT_LE(std::fabs(back_host(k, i, j) - host(k, i, j)), 0.5f * scale_host(k, j) + 1e-7f);
        }
      }
  }
}
