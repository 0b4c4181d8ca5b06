// The writer of a save's bytes (src/checkpoint/placed_writes.hpp), white box: writes at any
// offset, of any length, from memory of any alignment, land byte for byte where they were asked
// to, whether their whole pages go with O_DIRECT or every byte through the page cache; the
// direct path is really taken where the file system allows it, and refused O_DIRECT falls back.
#include "checkpoint/placed_writes.hpp"
#include "page_cache_support.hpp"

#include <lather/checkpoint/page_aligned.hpp>
#include <lather/core/fault_injection.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <vector>

namespace {

using lather::checkpoint::PageAlignedVector;
using lather::checkpoint::Impl::PlacedWriter;
using lather::test::direct_supported;

unsigned char expected_byte(std::int64_t at) { return static_cast<unsigned char>((at * 131 + at / 4096) % 251); }

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Covers a file of `size` bytes with pieces of many lengths (inside one page, across pages, past
/// the 1 MiB staging buffer) in shuffled order, each from a source at a different alignment.
std::int64_t write_pieces(const std::string& path, std::int64_t size, bool direct) {
  { std::ofstream create(path, std::ios::binary | std::ios::trunc); }
  std::filesystem::resize_file(path, std::uintmax_t(size));   // as lay_out leaves it: allocated, unwritten
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;  // offset, length
  const std::int64_t lengths[] = {1, 100, 4095, 4096, 4097, 12288, 65536 + 17, 3 << 20, 200000, 512, 7};
  std::int64_t at = 0;
  for (std::size_t k = 0; at < size; ++k) {
    const std::int64_t n = std::min(lengths[k % std::size(lengths)], size - at);
    pieces.emplace_back(at, n);
    at += n;
  }
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937(7));
  // Each piece's own source, kept until flush() (page-aligned ones are written on a helper thread).
  std::vector<PageAlignedVector<unsigned char>> sources;
  PlacedWriter writer(path, true, direct);
  std::size_t shift = 0;
  for (const auto& [offset, length] : pieces) {
    // The source at every alignment: 0, 1, ..., 63 bytes past a 4 KiB boundary.
    sources.emplace_back(std::size_t(length) + 64);
    unsigned char* from = sources.back().data() + shift;
    shift = (shift + 1) % 64;
    for (std::int64_t i = 0; i < length; ++i) from[i] = expected_byte(offset + i);
    writer.write(from, std::size_t(length), offset, "test");
    EXPECT_EQ(writer.error(), "");
  }
  writer.flush();
  EXPECT_EQ(writer.error(), "");
  return writer.direct_bytes();
}

void check_file(const std::string& path, std::int64_t size) {
  const auto bytes = file_bytes(path);
  ASSERT_EQ(std::int64_t(bytes.size()), size);
  for (std::int64_t i = 0; i < size; ++i)
    ASSERT_EQ(bytes[std::size_t(i)], expected_byte(i)) << "byte " << i << " of " << path;
}

TEST(PlacedWriter, DirectAndCachedWritesPutEveryByteInPlace) {
  const std::string path = (std::filesystem::current_path() / "placed-writes-test.bin").string();
  const std::int64_t size = (9 << 20) + 12345;
  for (bool direct : {true, false}) {
    const std::int64_t direct_bytes = write_pieces(path, size, direct);
    check_file(path, size);
    if (!direct) EXPECT_EQ(direct_bytes, 0);
    // Most of the file is whole pages of pieces longer than a page: those went directly.
    if (direct && direct_supported(path)) EXPECT_GT(direct_bytes, size / 2);
  }
  std::filesystem::remove(path);
}

/// A save's pattern: one page-aligned buffer handed over in consecutive 1 MiB pieces (queued for
/// the helper thread and joined there into larger requests), then, after wait(), the same buffer
/// refilled for the next array. A write still queued when the buffer changed would leave the
/// second array's bytes in the first's place.
void write_one_buffer_twice(const std::string& path) {
  const std::int64_t half = 24 << 20, piece = 1 << 20;
  { std::ofstream create(path, std::ios::binary | std::ios::trunc); }
  std::filesystem::resize_file(path, std::uintmax_t(2 * half));
  PageAlignedVector<unsigned char> buffer((std::size_t(half)));
  std::int64_t direct_bytes = 0;
  {
    PlacedWriter writer(path, true, true);
    std::vector<unsigned char> image(std::size_t(2 * half));  // refills by memcpy, faster than the disk
    for (std::int64_t i = 0; i < 2 * half; ++i) image[std::size_t(i)] = expected_byte(i);
    for (std::int64_t base : {std::int64_t(0), half}) {
      std::memcpy(buffer.data(), image.data() + base, std::size_t(half));
      for (std::int64_t at = 0; at < half; at += piece)
        writer.write(buffer.data() + at, std::size_t(piece), base + at, "test");
      writer.wait();
      EXPECT_EQ(writer.error(), "");
    }
    writer.flush();
    EXPECT_EQ(writer.error(), "");
    direct_bytes = writer.direct_bytes();
  }
  check_file(path, 2 * half);
  if (direct_supported(path)) EXPECT_EQ(direct_bytes, 2 * half);
  std::filesystem::remove(path);
}

TEST(PlacedWriter, PageAlignedPiecesGoStraightAndWaitLetsTheCallerReuseTheirBytes) {
  write_one_buffer_twice((std::filesystem::current_path() / "placed-writes-aligned.bin").string());
}

TEST(PlacedWriter, WithoutAHelperThreadTheCallerWritesEveryByte) {
  // The system refuses the helper thread (std::thread throws std::system_error): the writer
  // writes on the calling thread instead, and nothing is lost.
  lather::Impl::set_fault_hook([](const char* point) {
    if (std::string(point) == "checkpoint.writer_thread")
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  });
  write_one_buffer_twice((std::filesystem::current_path() / "placed-writes-no-thread.bin").string());
  lather::Impl::set_fault_hook(nullptr);
}

TEST(PlacedWriter, AFileThatIsNotThereIsAnErrorThatSaysWhyItMayNotBe) {
  // What a rank sees when rank 0 created the file on a file system this rank does not share.
  const std::string path = (std::filesystem::current_path() / "no-such-dir" / "checkpoint.h5").string();
  PlacedWriter writer(path, true, true);
  EXPECT_EQ(writer.error(), "cannot open checkpoint '" + path + "' for writing: " + std::strerror(ENOENT) +
                                " (is the checkpoint directory on a file system every rank shares?)");
  const char byte = 1;
  writer.write(&byte, 1, 0, "dataset 'x'");  // ignored after the error, not a crash
  writer.flush();
  EXPECT_NE(writer.error().find("cannot open checkpoint"), std::string::npos);
}

TEST(PageAligned, BuffersStartOnPagesAndAbsurdSizesAreRefused) {
  using lather::checkpoint::allocate_page_aligned;
  using lather::checkpoint::free_page_aligned;
  for (std::size_t bytes : {std::size_t(0), std::size_t(1), std::size_t(5000), std::size_t(3) << 20}) {
    void* p = allocate_page_aligned(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % lather::checkpoint::page_bytes, 0u) << bytes;
    if (bytes >= (std::size_t(2) << 20)) EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (std::size_t(2) << 20), 0u);
    free_page_aligned(p);
  }
  // Rounding these up to whole pages would wrap around to a few bytes.
  EXPECT_EQ(allocate_page_aligned(std::size_t(-1)), nullptr);
  EXPECT_EQ(allocate_page_aligned(std::size_t(-1) - 4096), nullptr);
}

TEST(PlacedWriter, ARefusedDirectWriteFallsBackToTheCache) {
  // /dev/shm is tmpfs, which refuses O_DIRECT on older kernels and takes it on newer ones: either
  // way every byte must land.
  const std::filesystem::path shm = "/dev/shm";
  if (!std::filesystem::is_directory(shm)) GTEST_SKIP() << "no /dev/shm";
  const std::string path = (shm / ("lather-placed-writes-" + std::to_string(::getpid()) + ".bin")).string();
  const std::int64_t size = (2 << 20) + 999;
  write_pieces(path, size, true);
  check_file(path, size);
  std::filesystem::remove(path);
}

}  // namespace
