// The IDX reader (MNIST / Fashion-MNIST files, plain or gzip): what it reads, and what it refuses
// before allocating. Exact checks throughout; the files are written here, so no data set is needed.
#include <lather/core/error.hpp>
#include <lather/data/idx.hpp>

#include "common/scratch_files.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using lather::data::read_idx;

/// An IDX header for unsigned bytes with these dimensions (big-endian).
std::string header(const std::vector<std::uint32_t>& dims) {
  std::string out = {'\0', '\0', '\x08', char(dims.size())};
  for (const std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out += char((d >> shift) & 0xFF);
  return out;
}

std::string bytes_counting(std::size_t n) {
  std::string out(n, '\0');
  for (std::size_t k = 0; k < n; ++k) out[k] = char(k % 251);
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const lather::Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "no lather::Error thrown";
  return {};
}

class IdxFiles : public lather::testing::ScratchFiles {
 protected:
  std::string write_gzip(const std::string& name, const std::string& bytes) const {
    const fs::path path = m_dir / name;
    gzFile file = gzopen(path.c_str(), "wb9");
    EXPECT_NE(file, nullptr);
    EXPECT_EQ(gzwrite(file, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
    gzclose(file);
    return path.string();
  }
};

TEST_F(IdxFiles, PlainAndGzipReadTheSameValues) {
  const std::string values = bytes_counting(3 * 5 * 7);
  for (const bool gzip : {false, true}) {
    const std::string content = header({3, 5, 7}) + values;
    const auto array = read_idx(gzip ? write_gzip("a.gz", content) : write("a", content));
    EXPECT_EQ(array.dims, (std::vector<std::int64_t>{3, 5, 7})) << "gzip " << gzip;
    EXPECT_EQ(std::string(array.values.begin(), array.values.end()), values) << "gzip " << gzip;
  }
}

TEST_F(IdxFiles, DimensionsAreBigEndian) {
  const std::string path = write("big", header({0x00800001}));
  EXPECT_NE(error_of([&] { read_idx(path); }).find("declares 8388609 = 8388609 values but holds only 0 bytes"),
            std::string::npos);
}

TEST_F(IdxFiles, AbsurdSizesAreRefusedBeforeAllocating) {
  // 2^40 values declared in a 16-byte file: more than max_elements, refused at the dimension.
  const std::string huge = write("huge", header({1u << 16, 1u << 12, 1u << 12}));
  EXPECT_NE(error_of([&] { read_idx(huge); }).find("declares dimension 2 = 4096: more than max_elements"),
            std::string::npos);
  // Within max_elements, but the file cannot hold them: refused by its size, before reading.
  const std::string claim = write("claim", header({0x7FFFFFFF}) + bytes_counting(8));
  EXPECT_NE(error_of([&] {
              read_idx(claim);
            }).find("declares 2147483647 = 2147483647 values but holds only 8 bytes after its header"),
            std::string::npos);
  // gzip: deflate expands at most 1032:1, so a small .gz cannot hold 2^31 - 1 values.
  const std::string bomb = write_gzip("bomb.gz", header({0x7FFFFFFF}) + std::string(4096, '\0'));
  EXPECT_NE(error_of([&] { read_idx(bomb); }).find("cannot hold more than"), std::string::npos);
}

TEST_F(IdxFiles, GzipClaimWithinTheDeflateBoundIsReadOnlyAsFarAsTheDataGoes) {
  // 4 MiB of incompressible bytes under a header that declares 8 MiB: the .gz is large enough to
  // hold the claim, so only reading shows it short.
  std::string noise(4u << 20, '\0');
  std::uint32_t x = 12345;
  for (char& c : noise) c = char((x = x * 1664525u + 1013904223u) >> 24);
  const std::string path = write_gzip("noise.gz", header({8u << 20}) + noise);
  ASSERT_GE(fs::file_size(path) * 1032, (8u << 20) + 8u) << "the claim must pass the deflate bound";
  EXPECT_NE(
      error_of([&] { read_idx(path); }).find("ends early while reading the values: it holds 4194304 of the 8388608"),
      std::string::npos);
}

TEST_F(IdxFiles, TruncatedAndOverlongFilesAreRefused) {
  const std::string plain = write("short", header({10, 10}) + bytes_counting(50));
  EXPECT_NE(error_of([&] { read_idx(plain); }).find("declares 10 x 10 = 100 values but holds only 50 bytes"),
            std::string::npos);
  const std::string gz = write_gzip("short.gz", header({10, 10}) + bytes_counting(50));
  EXPECT_NE(error_of([&] { read_idx(gz); }).find("it holds 50 of the 100 its header declares (10 x 10)"),
            std::string::npos);
  const std::string long_plain = write("long", header({4}) + bytes_counting(5));
  EXPECT_NE(error_of([&] { read_idx(long_plain); }).find("holds more bytes than the 4 values its header declares"),
            std::string::npos);
  const std::string long_gz = write_gzip("long.gz", header({4}) + bytes_counting(5));
  EXPECT_NE(error_of([&] { read_idx(long_gz); }).find("holds more bytes than the 4 values"), std::string::npos);
  const std::string cut_header = write("cut", header({10, 10}).substr(0, 9));
  EXPECT_NE(error_of([&] { read_idx(cut_header); }).find("ends early while reading the dimensions"), std::string::npos);
}

TEST_F(IdxFiles, DamagedGzipIsRefused) {
  const std::string content = header({64}) + bytes_counting(64);
  std::string gz;
  {
    const std::string path = write_gzip("good.gz", content);
    std::ifstream in(path, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0x01;  // the CRC-32 of the trailer
  EXPECT_NE(error_of([&] { read_idx(write("crc.gz", bad_crc)); }).find("is damaged"), std::string::npos);
  EXPECT_NE(error_of([&] { read_idx(write("cut.gz", gz.substr(0, gz.size() / 2))); }).find("IDX file"),
            std::string::npos);
}

TEST_F(IdxFiles, BadHeadersNameTheFile) {
  const std::string zero = write("zero", header({3, 0}));
  EXPECT_NE(error_of([&] { read_idx(zero); }).find("declares dimension 1 = 0"), std::string::npos);
  std::string rank5 = header({1, 1, 1, 1, 1}) + "x";
  EXPECT_NE(error_of([&] { read_idx(write("rank5", rank5)); }).find("declares 5 dimensions"), std::string::npos);
  std::string floats = header({2}) + "12345678";
  floats[2] = '\x0D';
  EXPECT_NE(error_of([&] { read_idx(write("floats", floats)); }).find("holds type 0xd"), std::string::npos);
  const std::string text = write("text", "hello world");
  EXPECT_NE(error_of([&] { read_idx(text); }).find("'" + text + "' is not an IDX file"), std::string::npos);
  EXPECT_NE(error_of([&] { read_idx((m_dir / "missing").string()); }).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] { read_idx(m_dir.string()); }).find("is not a regular file"), std::string::npos);
}

TEST_F(IdxFiles, LoadMnistLikeScalesAndCountsClasses) {
  write_gzip("t10k-images-idx3-ubyte.gz", header({3, 2, 2}) + std::string("\x00\xFF\x33\x66", 4) + bytes_counting(8));
  write("t10k-labels-idx1-ubyte", header({3}) + std::string("\x02\x00\x04", 3));
  const auto set = lather::data::load_mnist_like(m_dir.string(), "t10k");
  EXPECT_EQ(set.count, 3);
  EXPECT_EQ(set.features, 4);
  EXPECT_EQ(set.classes, 5);
  EXPECT_EQ(set.labels, (std::vector<std::int32_t>{2, 0, 4}));
  EXPECT_EQ(set.images[0], 0.0f);
  EXPECT_EQ(set.images[1], 1.0f);
  EXPECT_EQ(set.images[2], 0x33 / 255.0f);
  write("train-images-idx3-ubyte", header({2, 2, 2}) + bytes_counting(8));
  write("train-labels-idx1-ubyte", header({3}) + bytes_counting(3));
  EXPECT_NE(error_of([&] { lather::data::load_mnist_like(m_dir.string(), "train"); }).find("has 2 images but 3 labels"),
            std::string::npos);
}

}  // namespace
