#include <lather/checkpoint/page_aligned.hpp>

#include <cstdlib>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace lather::checkpoint {

namespace {
constexpr std::size_t huge_page = std::size_t(2) << 20;
std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }
}  // namespace

void* allocate_page_aligned(std::size_t bytes) noexcept {
  // std::aligned_alloc wants a size that is a multiple of the alignment, which must not overflow.
  if (bytes > std::size_t(-1) - huge_page) return nullptr;
  const std::size_t alignment = bytes >= huge_page ? huge_page : page_bytes;
  const std::size_t size = round_up(bytes == 0 ? 1 : bytes, alignment);
  void* p = std::aligned_alloc(alignment, size);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // A hint: refused (no transparent huge pages in this kernel) the buffer is simply 4 KiB pages.
  if (p && alignment == huge_page) (void)::madvise(p, size, MADV_HUGEPAGE);
#endif
  return p;
}

void free_page_aligned(void* p) noexcept { std::free(p); }

}  // namespace lather::checkpoint
