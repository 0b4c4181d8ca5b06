// The reader of a load's ranges straight from the disk (src/checkpoint/placed_reads.hpp), white
// box: a queued range arrives byte for byte, its partial pages at either end included, in pieces
// of whole rows handed over in order; what it must not take (ranges in the cache, unaligned
// buffers, small ranges, converted types) it refuses having read nothing; without a helper thread
// finish() reads; a file cut short and a piece that throws end in errors, not hangs.
#include "checkpoint/placed_reads.hpp"
#include "checkpoint/placed_writes.hpp"
#include "page_cache_support.hpp"

#include <lather/checkpoint/page_aligned.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace {

using lather::checkpoint::ArraySlice;
using lather::checkpoint::PageAlignedVector;
using lather::checkpoint::Impl::PlacedReader;
namespace ck = lather::checkpoint::Impl;
using lather::test::direct_supported;

constexpr std::int64_t rows = 3000, columns = 1000;  // rows of 4000 bytes: ranges start inside pages
constexpr std::int64_t row_bytes = columns * 4;

unsigned char expected_byte(std::int64_t at) { return static_cast<unsigned char>((at * 131 + at / 4096) % 251); }

/// A checkpoint-like file with two float arrays of `rows` x `columns` ("a" and "b"), laid out as a
/// save lays them out, every byte expected_byte(its offset in the file). Returns their offsets.
std::vector<std::int64_t> make_file(const std::string& path) {
  std::vector<ArraySlice> arrays(2);
  arrays[0].path = "a";
  arrays[1].path = "b";
  for (auto& a : arrays) {
    a.dtype = lather::optim::DType::float32;
    a.shape = {rows, columns};
  }
  const auto offsets = ck::lay_out(path, arrays, {});
  const int fd = ::open(path.c_str(), O_WRONLY);
  EXPECT_GE(fd, 0);
  std::vector<unsigned char> bytes(std::size_t(rows * row_bytes));
  for (const std::int64_t at : offsets) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = expected_byte(at + std::int64_t(i));
    EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), off_t(at)), ssize_t(bytes.size()));
  }
  ::close(fd);
  lather::test::drop_from_page_cache(path);
  return offsets;
}

/// A buffer for rows [first, ...) of the dataset at `offset`, on the same offset within a page as
/// the rows in the file (as O_DIRECT wants), plus `shift` bytes.
struct Into {
  PageAlignedVector<char> memory;
  char* at;
  Into(std::int64_t offset, std::int64_t first, std::int64_t count, std::size_t shift = 0)
      : memory(std::size_t(count * row_bytes) + 2 * lather::checkpoint::page_bytes) {
    at = memory.data() + std::size_t((offset + first * row_bytes) % std::int64_t(lather::checkpoint::page_bytes)) +
         shift;
  }
};

struct Opened {
  ck::QuietHdf5 quiet;
  ck::File file;
  ck::Dataset a, b;
  explicit Opened(const std::string& path)
      : file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)),
        a(H5Dopen2(file.get(), "a", H5P_DEFAULT)),
        b(H5Dopen2(file.get(), "b", H5P_DEFAULT)) {}
};

/// finish() of range `range` into a list of the pieces it handed over, checking their bytes.
void finish_and_check(PlacedReader& reader, int range, std::int64_t offset, std::int64_t first, std::int64_t count,
                      const char* into) {
  std::int64_t next = first;
  reader.finish(range, [&](std::int64_t from, std::int64_t piece_rows, const char* bytes) {
    EXPECT_EQ(from, next) << "pieces in order, none skipped";
    EXPECT_GT(piece_rows, 0);
    EXPECT_EQ(bytes, into + (from - first) * row_bytes);
    next = from + piece_rows;
  });
  EXPECT_EQ(next, first + count);
  for (std::int64_t i = 0; i < count * row_bytes; ++i)
    ASSERT_EQ(static_cast<unsigned char>(into[i]), expected_byte(offset + first * row_bytes + i)) << "byte " << i;
}

/// The system refuses the reader's helper thread (std::thread throws std::system_error).
void refuse_reader_thread() {
  lather::Impl::set_fault_hook([](const char* point) {
    if (std::string(point) == "checkpoint.reader_thread")
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  });
}

class PlacedReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path = (std::filesystem::current_path() / ("placed-reads-" + std::to_string(::getpid()) + ".h5")).string();
    offsets = make_file(path);
    if (!direct_supported(path)) GTEST_SKIP() << "the file system under " << path << " refuses O_DIRECT";
  }
  void TearDown() override {
    lather::Impl::set_fault_hook(nullptr);
    std::filesystem::remove(path);
  }
  std::string path;
  std::vector<std::int64_t> offsets;
};

TEST_F(PlacedReaderTest, QueuedRangesArriveByteForByteInPiecesInOrder) {
  Opened h5(path);
  PlacedReader reader(path);
  // Two ranges starting and ending inside pages, in two datasets, both queued before either is
  // finished (the helper thread reads them one after the other).
  const std::int64_t first_a = 3, count_a = 2900, first_b = 1, count_b = 2998;
  Into into_a(offsets[0], first_a, count_a), into_b(offsets[1], first_b, count_b);
  const int a = reader.add(h5.a.get(), H5T_NATIVE_FLOAT, first_a, count_a, row_bytes, into_a.at, "a");
  const int b = reader.add(h5.b.get(), H5T_NATIVE_FLOAT, first_b, count_b, row_bytes, into_b.at, "b");
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ(reader.queued_bytes(), (count_a + count_b) * row_bytes);
  finish_and_check(reader, a, offsets[0], first_a, count_a, into_a.at);
  finish_and_check(reader, b, offsets[1], first_b, count_b, into_b.at);
}

TEST_F(PlacedReaderTest, WhatItMustNotTakeIsRefusedHavingReadNothing) {
  Opened h5(path);
  PlacedReader reader(path);
  Into into(offsets[0], 0, rows, 8);  // 8 bytes off the rows' place within a page
  std::memset(into.memory.data(), 0x5a, into.memory.size());
  EXPECT_EQ(reader.add(h5.a.get(), H5T_NATIVE_FLOAT, 0, rows, row_bytes, into.at, "unaligned"), -1);
  Into small(offsets[0], 0, 1000);
  EXPECT_EQ(reader.add(h5.a.get(), H5T_NATIVE_FLOAT, 0, 1000, row_bytes, small.at, "under 8 MiB"), -1);
  Into converted(offsets[0], 0, rows);
  EXPECT_EQ(reader.add(h5.a.get(), H5T_NATIVE_INT32, 0, rows, row_bytes, converted.at, "converted"), -1);
  for (char c : into.memory) ASSERT_EQ(c, 0x5a);
  EXPECT_EQ(reader.queued_bytes(), 0);
  // Once the cache holds the file, the cache serves it (a copy beats a read from the disk).
  lather::test::read_through_page_cache(path);
  Into cached(offsets[0], 0, rows);
  EXPECT_EQ(reader.add(h5.a.get(), H5T_NATIVE_FLOAT, 0, rows, row_bytes, cached.at, "cached"), -1);
}

TEST_F(PlacedReaderTest, WithoutAHelperThreadFinishReadsEveryByte) {
  refuse_reader_thread();
  Opened h5(path);
  PlacedReader reader(path);
  Into into(offsets[1], 0, rows);
  const int range = reader.add(h5.b.get(), H5T_NATIVE_FLOAT, 0, rows, row_bytes, into.at, "b");
  ASSERT_GE(range, 0);
  finish_and_check(reader, range, offsets[1], 0, rows, into.at);
}

TEST_F(PlacedReaderTest, AFileCutShortFailsNamingTheRange) {
  // No helper thread, so that the cut comes between add() and the reads.
  refuse_reader_thread();
  Opened h5(path);
  PlacedReader reader(path);
  Into into(offsets[1], 0, rows);
  const int range = reader.add(h5.b.get(), H5T_NATIVE_FLOAT, 0, rows, row_bytes, into.at, "dataset 'b'");
  ASSERT_GE(range, 0);
  std::filesystem::resize_file(path, std::uintmax_t(offsets[1] + rows * row_bytes / 2));
  try {
    reader.finish(range, [](std::int64_t, std::int64_t, const char*) {});
    FAIL() << "a read past the end of the file went unnoticed";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset 'b': read failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the file ends at offset"), std::string::npos) << e.what();
  }
}

TEST_F(PlacedReaderTest, APieceThatThrowsLeavesNoThreadBehind) {
  Opened h5(path);
  Into into_a(offsets[0], 0, rows), into_b(offsets[1], 0, rows);
  {
    PlacedReader reader(path);
    const int a = reader.add(h5.a.get(), H5T_NATIVE_FLOAT, 0, rows, row_bytes, into_a.at, "a");
    ASSERT_GE(reader.add(h5.b.get(), H5T_NATIVE_FLOAT, 0, rows, row_bytes, into_b.at, "b"), 0);
    ASSERT_GE(a, 0);
    EXPECT_THROW(reader.finish(a, [](std::int64_t, std::int64_t, const char*) { throw std::runtime_error("bad sum"); }),
                 std::runtime_error);
  }  // the destructor stops the helper thread before the buffers go (ASan and TSan would see it)
}

}  // namespace
