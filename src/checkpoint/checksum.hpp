#pragma once
// Per-chunk checksums of a checkpoint's arrays, computed by the ranks in parallel on what each
// writes or reads, so that the data itself goes to disk unfiltered (at the disk's speed) and a
// flipped bit anywhere is still found and named.
//
// An array's leading dimension is cut into chunks of `rows_per_chunk` rows (about
// CheckpointOptions::chunk_bytes each). Chunk c's checksum is two 64-bit sums over its elements,
// each element read as an unsigned integer of its own width (w_i, i its linear index in the array):
//   plain = sum of w_i                       (mod 2^64)
//   mixed = sum of f(w_i, i)                 (mod 2^64), f below
// Both are sums, so any rank can add the part of a chunk it holds and the parts are summed over the
// ranks: no rank needs a whole chunk, whatever the rows or blocks it writes. `plain` changes for any
// change confined to one element (a flipped bit or byte anywhere); `mixed` depends on the position,
// so moved, swapped or compensating changes are caught too (but for a 2^-64 chance).
//   f(w, i) for elements of 1, 2 or 4 bytes: x = w xor k_i, k_i = (i + 1) * 0x9E3779B9 mod 2^32,
//           f = x * x (the full 64-bit product);
//   f(w, i) for 8-byte elements: x = w xor (i + 1) * 0x9E3779B97F4A7C15 mod 2^64,
//           f = lo32(x) * hi32(x) + x.
// docs/reference/checkpoint-format.md describes where the sums are stored.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lather::checkpoint::Impl {

/// The two sums of one chunk.
struct ChunkSum {
  std::uint64_t plain = 0;
  std::uint64_t mixed = 0;
  bool operator==(const ChunkSum& other) const { return plain == other.plain && mixed == other.mixed; }
  bool operator!=(const ChunkSum& other) const { return !(*this == other); }
};

/// How an array of `rows` x `row_elements` elements of `element_bytes` each is cut into chunks.
struct ChunkGrid {
  std::int64_t rows = 0;
  std::int64_t row_elements = 1;
  std::int64_t rows_per_chunk = 1;
  std::size_t element_bytes = 4;

  /// Rows of about `chunk_bytes` per chunk (at least one row).
  static ChunkGrid of(const std::vector<std::int64_t>& stored_dims, std::size_t element_bytes, std::size_t chunk_bytes);
  std::int64_t chunks() const { return rows == 0 ? 0 : (rows + rows_per_chunk - 1) / rows_per_chunk; }
  std::int64_t chunk_elements() const { return rows_per_chunk * row_elements; }
  /// Rows [first_row(c), first_row(c + 1)) form chunk c.
  std::int64_t first_row(std::int64_t chunk) const {
    return chunk * rows_per_chunk < rows ? chunk * rows_per_chunk : rows;
  }
  std::int64_t elements() const { return rows * row_elements; }
};

/// Adds to sums[c] (one per chunk of `grid`) the terms of elements [first, first + count) of the
/// array, whose values are `data` (count elements, native byte order).
void add_to_chunk_sums(const ChunkGrid& grid, std::int64_t first, std::int64_t count, const void* data,
                       std::vector<ChunkSum>& sums);

/// The sums of `count` elements of `element_bytes` that are elements [first, first + count) of
/// their array (all of them counted, whatever chunk they fall in).
ChunkSum sum_elements(const void* data, std::size_t element_bytes, std::int64_t first, std::int64_t count);

}  // namespace lather::checkpoint::Impl
