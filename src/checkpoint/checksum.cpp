#include "checksum.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <cstring>

// The sums are the cost of checking a checkpoint as it is read; the AVX2 clone runs about half
// again as fast as the SSE2 one (tens of GB/s per core), so read bandwidth stays near the disk's.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LATHER_CHECKSUM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LATHER_CHECKSUM_CLONES
#endif

namespace lather::checkpoint::Impl {

namespace {

constexpr std::uint32_t key32 = 0x9E3779B9u;
constexpr std::uint64_t key64 = 0x9E3779B97F4A7C15ull;

template <class Narrow>
LATHER_CHECKSUM_CLONES ChunkSum sum_narrow(const Narrow* w, std::int64_t count, std::uint64_t first) {
  std::uint64_t plain = 0, mixed = 0;
  std::uint32_t key = std::uint32_t(first + 1) * key32;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint32_t value = w[i];
    const std::uint32_t x = value ^ key;
    plain += value;
    mixed += std::uint64_t(x) * x;
    key += key32;
  }
  return {plain, mixed};
}

LATHER_CHECKSUM_CLONES ChunkSum sum_wide(const std::uint64_t* w, std::int64_t count, std::uint64_t first) {
  std::uint64_t plain = 0, mixed = 0;
  std::uint64_t key = (first + 1) * key64;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint64_t x = w[i] ^ key;
    plain += w[i];
    mixed += (x & 0xffffffffu) * (x >> 32) + x;
    key += key64;
  }
  return {plain, mixed};
}

}  // namespace

ChunkGrid ChunkGrid::of(const std::vector<std::int64_t>& stored_dims, std::size_t element_bytes,
                        std::size_t chunk_bytes) {
  LATHER_REQUIRE(!stored_dims.empty(), "a checksummed array needs at least one dimension");
  ChunkGrid grid;
  grid.rows = stored_dims[0];
  grid.element_bytes = element_bytes;
  for (std::size_t d = 1; d < stored_dims.size(); ++d) grid.row_elements *= stored_dims[d];
  const std::uint64_t row_bytes = std::uint64_t(std::max<std::int64_t>(grid.row_elements, 1)) * element_bytes;
  const std::uint64_t fit = std::max<std::uint64_t>(1, chunk_bytes / std::max<std::uint64_t>(row_bytes, 1));
  grid.rows_per_chunk = std::int64_t(std::min<std::uint64_t>(fit, std::uint64_t(std::max<std::int64_t>(grid.rows, 1))));
  return grid;
}

ChunkSum sum_elements(const void* data, std::size_t element_bytes, std::int64_t first, std::int64_t count) {
  switch (element_bytes) {
    case 1:
      return sum_narrow(static_cast<const std::uint8_t*>(data), count, std::uint64_t(first));
    case 2:
      return sum_narrow(static_cast<const std::uint16_t*>(data), count, std::uint64_t(first));
    case 4:
      return sum_narrow(static_cast<const std::uint32_t*>(data), count, std::uint64_t(first));
    case 8:
      return sum_wide(static_cast<const std::uint64_t*>(data), count, std::uint64_t(first));
    default:
      LATHER_FAIL("checkpoint checksums: elements of ", element_bytes, " bytes are not supported");
  }
}

void add_to_chunk_sums(const ChunkGrid& grid, std::int64_t first, std::int64_t count, const void* data,
                       std::vector<ChunkSum>& sums) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const std::int64_t per_chunk = grid.chunk_elements();
  while (count > 0) {
    const std::int64_t chunk = first / per_chunk;
    const std::int64_t take = std::min(count, (chunk + 1) * per_chunk - first);
    LATHER_REQUIRE(chunk < std::int64_t(sums.size()), "checkpoint checksums: element ", first,
                   " lies outside the array");
    const ChunkSum part = sum_elements(bytes, grid.element_bytes, first, take);
    sums[std::size_t(chunk)].plain += part.plain;
    sums[std::size_t(chunk)].mixed += part.mixed;
    bytes += std::size_t(take) * grid.element_bytes;
    first += take;
    count -= take;
  }
}

}  // namespace lather::checkpoint::Impl
