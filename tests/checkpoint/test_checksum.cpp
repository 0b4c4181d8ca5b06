// The per-chunk checksums of checkpoint format 2 (src/checkpoint/checksum.hpp), white box: the
// vectorised sums against the documented formula written out element by element, the additivity
// the parallel writers and readers rely on (any split of an array into runs or blocks sums to the
// whole), and detection: every single-bit flip of every byte, and swapped elements.
#include "checkpoint/checksum.hpp"
#include "checkpoint/stored_checksums.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace {

using namespace lather::checkpoint;
using namespace lather::checkpoint::Impl;

/// The formula of checksum.hpp, one element at a time, keys computed from the index directly.
ChunkSum reference_sum(const void* data, std::size_t width, std::uint64_t first, std::int64_t count) {
  ChunkSum sum;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::int64_t k = 0; k < count; ++k) {
    std::uint64_t w = 0;
    for (std::size_t b = 0; b < width; ++b)
      w |= std::uint64_t(bytes[std::size_t(k) * width + b]) << (8 * b);  // little endian host
    const std::uint64_t i = first + std::uint64_t(k);
    sum.plain += w;
    if (width == 8) {
      const std::uint64_t x = w ^ ((i + 1) * 0x9E3779B97F4A7C15ull);
      sum.mixed += (x & 0xffffffffu) * (x >> 32) + x;
    } else {
      const std::uint64_t x = (w ^ ((i + 1) * 0x9E3779B9ull)) & 0xffffffffu;
      sum.mixed += x * x;
    }
  }
  return sum;
}

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

TEST(CheckpointChecksum, MatchesTheDocumentedFormula) {
  for (std::size_t width : {1u, 2u, 4u, 8u})
    for (std::uint64_t first : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(12345), std::uint64_t(1) << 33})
      for (std::int64_t count : {0, 1, 7, 64, 1001}) {
        const auto bytes = random_bytes(std::size_t(count) * width + 8, unsigned(width * 31 + count));
        EXPECT_EQ(sum_elements(bytes.data(), width, std::int64_t(first), count),
                  reference_sum(bytes.data(), width, first, count))
            << "width " << width << " first " << first << " count " << count;
      }
}

TEST(CheckpointChecksum, AnySplitIntoRunsSumsToTheWhole) {
  const ChunkGrid grid = ChunkGrid::of({37, 5, 3}, 4, 400);  // 15 elements per row, 6 rows per chunk
  ASSERT_EQ(grid.rows_per_chunk, 6);
  ASSERT_EQ(grid.chunks(), 7);
  const auto bytes = random_bytes(std::size_t(grid.elements()) * 4, 7);
  std::vector<ChunkSum> whole(std::size_t(grid.chunks())), parts(std::size_t(grid.chunks()));
  add_to_chunk_sums(grid, 0, grid.elements(), bytes.data(), whole);
  for (std::int64_t c = 0; c < grid.chunks(); ++c) {
    const std::int64_t first = grid.first_row(c) * 15, count = (grid.first_row(c + 1) - grid.first_row(c)) * 15;
    EXPECT_EQ(whole[std::size_t(c)], reference_sum(bytes.data() + first * 4, 4, std::uint64_t(first), count)) << c;
  }
  std::mt19937 rng(3);
  for (std::int64_t at = 0; at < grid.elements();) {  // random runs, crossing chunk boundaries
    const std::int64_t run = std::min<std::int64_t>(grid.elements() - at, 1 + std::int64_t(rng() % 200));
    add_to_chunk_sums(grid, at, run, bytes.data() + at * 4, parts);
    at += run;
  }
  EXPECT_EQ(parts, whole);
}

TEST(CheckpointChecksum, BlocksOfAnyShapeSumToTheWhole) {
  // A [9, 6, 10] float64 array cut into 2 x 3 x 2 blocks along every dimension, as tensor-parallel
  // shards and their replicas' shares of rows are.
  ArraySlice a;
  a.path = "x";
  a.dtype = lather::optim::DType::float64;
  a.shape = {9, 6, 10};
  const ChunkGrid grid = grid_of(a, 2 * 60 * 8);
  const auto bytes = random_bytes(9 * 6 * 10 * 8, 11);
  std::vector<ChunkSum> whole(std::size_t(grid.chunks())), parts(std::size_t(grid.chunks()));
  a.selection = ArraySlice::Selection::whole;
  add_block_rows(grid, a, bytes.data(), 0, 9, whole);
  a.selection = ArraySlice::Selection::block;
  const std::vector<std::pair<std::int64_t, std::int64_t>> cuts0 = {{0, 4}, {4, 5}}, cuts1 = {{0, 1}, {1, 3}, {4, 2}},
                                                           cuts2 = {{0, 3}, {3, 7}};
  for (auto [o0, c0] : cuts0)
    for (auto [o1, c1] : cuts1)
      for (auto [o2, c2] : cuts2) {
        a.offset = {o0, o1, o2};
        a.count = {c0, c1, c2};
        std::vector<unsigned char> block;
        for (std::int64_t i = 0; i < c0; ++i)
          for (std::int64_t j = 0; j < c1; ++j)
            for (std::int64_t k = 0; k < c2; ++k) {
              const auto* element = bytes.data() + std::size_t(((o0 + i) * 6 + (o1 + j)) * 10 + (o2 + k)) * 8;
              block.insert(block.end(), element, element + 8);
            }
        // Two readers of the same block split its rows: both shares together count it once.
        add_block_rows(grid, a, block.data(), 0, c0 / 2, parts);
        add_block_rows(grid, a, block.data(), c0 / 2, c0 - c0 / 2, parts);
      }
  EXPECT_EQ(parts, whole);
}

TEST(CheckpointChecksum, EverySingleBitFlipAndEverySwapIsDetected) {
  for (std::size_t width : {1u, 2u, 4u, 8u}) {
    auto bytes = random_bytes(512, unsigned(width));
    const std::int64_t count = std::int64_t(512 / width);
    const ChunkSum intact = sum_elements(bytes.data(), width, 100, count);
    for (std::size_t byte = 0; byte < bytes.size(); ++byte)
      for (int bit = 0; bit < 8; ++bit) {
        bytes[byte] ^= static_cast<unsigned char>(1u << bit);
        const ChunkSum flipped = sum_elements(bytes.data(), width, 100, count);
        bytes[byte] ^= static_cast<unsigned char>(1u << bit);
        ASSERT_NE(flipped.plain, intact.plain) << "width " << width << " byte " << byte << " bit " << bit;
      }
    for (std::int64_t i = 0; i + 1 < count; i += 5) {  // two different elements swapped
      std::vector<unsigned char> swapped = bytes;
      if (std::memcmp(&bytes[std::size_t(i) * width], &bytes[std::size_t(i + 1) * width], width) == 0) continue;
      std::memcpy(&swapped[std::size_t(i) * width], &bytes[std::size_t(i + 1) * width], width);
      std::memcpy(&swapped[std::size_t(i + 1) * width], &bytes[std::size_t(i) * width], width);
      const ChunkSum moved = sum_elements(swapped.data(), width, 100, count);
      EXPECT_EQ(moved.plain, intact.plain);  // the plain sum cannot see a move ...
      EXPECT_NE(moved.mixed, intact.mixed) << "width " << width << " swap at " << i;  // ... the mixed one does
    }
  }
}

}  // namespace
