#pragma once
// Host buffers for the bytes of a checkpoint. A save writes the whole pages of an array with
// O_DIRECT (src/checkpoint/placed_writes.hpp), which the kernel takes only from memory aligned to
// the disk's sector: bytes elsewhere are first copied through a 1 MiB staging buffer, piece by
// piece, and written while nothing else runs. From these buffers the pages go to the disk with no
// copy, on a helper thread while the save computes their checksums. Buffers of 2 MiB or more are
// also aligned to 2 MiB and offered to Linux's transparent huge pages (`madvise`, which the
// default "madvise" setting honours): the 2 MiB of a huge page are one segment of a disk
// request, against 512 segments in 4 KiB pages, and fewer segments alone make the writes faster
// (docs/reference/benchmarks.md). The library's own saves stage through such buffers; callers of
// Checkpointer::save with their own ArraySlice data can use them too.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_CHECKPOINT)
#error "lather/checkpoint/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <cstddef>
#include <new>
#include <vector>

namespace lather::checkpoint {

/// The page: O_DIRECT's unit of memory alignment, offset and length for a checkpoint's writes.
inline constexpr std::size_t page_bytes = 4096;

/// `bytes` bytes on a 4 KiB boundary (2 MiB, offered to huge pages, from 2 MiB up); nullptr
/// when the memory is not there (or `bytes` is beyond any allocation). Freed with
/// free_page_aligned().
void* allocate_page_aligned(std::size_t bytes) noexcept;
void free_page_aligned(void* p) noexcept;

/// std::allocator with every allocation from allocate_page_aligned().
template <class T>
struct PageAlignedAllocator {
  using value_type = T;

  PageAlignedAllocator() = default;
  template <class U>
  PageAlignedAllocator(const PageAlignedAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / 2 / sizeof(T)) throw std::bad_array_new_length();
    void* p = allocate_page_aligned(n * sizeof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { free_page_aligned(p); }

  template <class U>
  bool operator==(const PageAlignedAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const PageAlignedAllocator<U>&) const noexcept {
    return false;
  }
};

/// A growable host buffer from allocate_page_aligned().
template <class T>
using PageAlignedVector = std::vector<T, PageAlignedAllocator<T>>;

}  // namespace lather::checkpoint
