#pragma once
// What the harnesses of tests/fuzz share: a private scratch directory for the APIs that take a
// path (the fuzzer's bytes are written to a file there), and the check that turns a broken
// invariant into a crash the fuzzer reports.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace lather::fuzz {

/// A directory of this process's own, in memory (/dev/shm) where there is one: one file write per
/// input must stay cheap next to the parsing it feeds. Removed at exit.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    namespace fs = std::filesystem;
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string pattern = (base / "lather-fuzz-XXXXXX").string();
    if (!mkdtemp(pattern.data())) {
      std::perror("lather fuzz harness: mkdtemp");
      std::abort();
    }
    m_path = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(m_path, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& path() const { return m_path; }

  /// Writes `size` bytes to `name` in the directory (replacing it) and returns its path.
  std::string write(const std::string& name, const std::uint8_t* data, std::size_t size) const {
    const std::filesystem::path file = m_path / name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
    out.close();
    if (!out) {
      std::fprintf(stderr, "lather fuzz harness: cannot write %s\n", file.c_str());
      std::abort();
    }
    return file.string();
  }

 private:
  std::filesystem::path m_path;
};

inline const ScratchDirectory& scratch() {
  static const ScratchDirectory directory;
  return directory;
}

/// An invariant of the code under test: its failure is a bug, reported as a crash.
#define LATHER_FUZZ_CHECK(condition)                                                              \
  do {                                                                                            \
    if (!(condition)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz invariant broken: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

}  // namespace lather::fuzz
