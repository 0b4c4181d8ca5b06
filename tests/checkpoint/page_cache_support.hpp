#pragma once
// The page cache as the checkpoint tests need it: whether a file system takes O_DIRECT, and a
// file's pages dropped from the cache (as on a fresh node) or read into it.

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace lather::test {

/// Whether `path` (an existing file) opens with O_DIRECT: tmpfs on older kernels refuses it.
inline bool direct_supported(const std::string& path) {
#ifdef O_DIRECT
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  ::close(fd);
  return true;
#else
  (void)path;
  return false;
#endif
}

/// Writes back and drops the file's cached pages (posix_fadvise DONTNEED, no privileges needed).
inline void drop_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// Reads the file through the page cache, so that its pages are there.
inline void read_through_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  std::vector<char> piece(1 << 20);
  for (off_t at = 0; ::pread(fd, piece.data(), piece.size(), at) > 0; at += off_t(piece.size())) {
  }
  ::close(fd);
}

}  // namespace lather::test
