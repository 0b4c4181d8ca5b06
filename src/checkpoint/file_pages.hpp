#pragma once
// Page arithmetic of the O_DIRECT reads and writes (placed_reads.cpp, placed_writes.cpp): O_DIRECT
// moves whole pages only, so each range of a file is split into its whole pages and the partial
// pages at either end, which go through the page cache.

#include <lather/checkpoint/page_aligned.hpp>

#include <cstdint>

namespace lather::checkpoint::Impl {

inline constexpr std::int64_t page = std::int64_t(page_bytes);

/// The whole pages inside the file range [begin, end) (offsets >= 0): [first, last), with
/// first >= last when the range holds none.
struct WholePages {
  std::int64_t first, last;
};
inline WholePages whole_pages(std::int64_t begin, std::int64_t end) {
  return {(begin + page - 1) / page * page, end / page * page};
}

}  // namespace lather::checkpoint::Impl
