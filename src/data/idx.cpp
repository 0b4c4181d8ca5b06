#include <lather/data/idx.hpp>

#include <lather/core/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace lather::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const {
    if (f) gzclose(f);
  }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

/// Deflate's largest expansion: one 2-bit code for a match of 258 bytes (RFC 1951) makes at most
/// about 1032 bytes out of one compressed byte. A gzip file of n bytes cannot decompress to more.
constexpr std::uintmax_t max_deflate_expansion = 1032;

/// Values are read (and the array grown) in pieces of this many bytes, so that what is allocated
/// follows what the file really holds, never only what its header says.
constexpr std::size_t read_piece = std::size_t(1) << 24;

/// gzread's result for `bytes` bytes at `out`: the count read (short only at the end of the data),
/// or a lather::Error naming the file for a damaged gzip stream.
std::size_t read_some(gzFile file, void* out, std::size_t bytes, const std::string& path, const char* what) {
  std::size_t done = 0;
  auto* p = static_cast<char*>(out);
  while (done < bytes) {
    const unsigned piece = unsigned(std::min<std::size_t>(bytes - done, 1u << 30));
    const int got = gzread(file, p + done, piece);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      LATHER_FAIL("IDX file '", path, "' is damaged while reading ", what, " (after ", done, " of ", bytes,
                  " bytes): ", message);
    }
    if (got == 0) break;
    done += std::size_t(got);
  }
  return done;
}

/// zlib reads plain files through the same interface, so .gz and raw IDX share one path.
void read_exactly(gzFile file, void* out, std::size_t bytes, const std::string& path, const char* what) {
  const std::size_t done = read_some(file, out, bytes, path, what);
  LATHER_REQUIRE(done == bytes, "IDX file '", path, "' ends early while reading ", what, " (", done, " of ", bytes,
                 " bytes)");
}

std::string describe_dims(const std::vector<std::int64_t>& dims) {
  std::string text;
  for (const std::int64_t dim : dims) text += (text.empty() ? "" : " x ") + std::to_string(dim);
  return text;
}

}  // namespace

IdxArray read_idx(const std::string& path, std::int64_t max_elements) {
  std::error_code error;
  LATHER_REQUIRE(std::filesystem::exists(path, error), "IDX file '", path, "' does not exist");
  LATHER_REQUIRE(std::filesystem::is_regular_file(path, error), "IDX file '", path, "' is not a regular file");
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, error);
  LATHER_REQUIRE(!error, "cannot read the size of IDX file '", path, "': ", error.message());
  GzFile file(gzopen(path.c_str(), "rb"));
  LATHER_REQUIRE(file != nullptr, "cannot open IDX file '", path, "'");
  unsigned char magic[4];
  read_exactly(file.get(), magic, 4, path, "the magic number");
  LATHER_REQUIRE(magic[0] == 0 && magic[1] == 0, "'", path, "' is not an IDX file (bad magic number)");
  LATHER_REQUIRE(magic[2] == 0x08, "IDX file '", path, "' holds type 0x", std::hex, int(magic[2]),
                 ", only unsigned bytes (0x08) are supported");
  const int rank = magic[3];
  LATHER_REQUIRE(rank >= 1 && rank <= 4, "IDX file '", path, "' declares ", rank, " dimensions");
  const bool compressed = gzdirect(file.get()) == 0;
  IdxArray out;
  std::int64_t elements = 1;
  for (int d = 0; d < rank; ++d) {
    unsigned char b[4];
    read_exactly(file.get(), b, 4, path, "the dimensions");
    const std::int64_t dim =
        (std::int64_t(b[0]) << 24) | (std::int64_t(b[1]) << 16) | (std::int64_t(b[2]) << 8) | std::int64_t(b[3]);
    LATHER_REQUIRE(dim >= 1, "IDX file '", path, "' declares dimension ", d, " = 0");
    LATHER_REQUIRE(elements <= max_elements / dim, "IDX file '", path, "' declares dimension ", d, " = ", dim,
                   ": more than max_elements = ", max_elements, " values in all");
    out.dims.push_back(dim);
    elements *= dim;
  }
  // Refused before anything is allocated: a header that declares more values than the file can
  // hold (a damaged header, a truncated file, a decompression bomb's claim).
  const auto needed = std::uintmax_t(4 + 4 * rank) + std::uintmax_t(elements);
  if (compressed) {
    LATHER_REQUIRE(needed / max_deflate_expansion <= file_bytes, "IDX file '", path, "' declares ",
                   describe_dims(out.dims), " = ", elements, " values, but as gzip of ", file_bytes,
                   " bytes it cannot hold more than ", file_bytes * max_deflate_expansion, " (deflate expands at most ",
                   max_deflate_expansion, ":1)");
  } else {
    LATHER_REQUIRE(needed <= file_bytes, "IDX file '", path, "' declares ", describe_dims(out.dims), " = ", elements,
                   " values but holds only ", file_bytes - std::min(file_bytes, needed - elements),
                   " bytes after its header (truncated?)");
  }
  // Grown piece by piece (a gzip file shows how much it holds only by being decompressed), the
  // capacity never past the declared size.
  const auto total = std::size_t(elements);
  if (!compressed) out.values.reserve(total);
  while (out.values.size() < total) {
    const std::size_t have = out.values.size(), piece = std::min(read_piece, total - have);
    if (out.values.capacity() < have + piece) out.values.reserve(std::min(total, std::max(have + piece, 2 * have)));
    out.values.resize(have + piece);
    const std::size_t got = read_some(file.get(), out.values.data() + have, piece, path, "the values");
    LATHER_REQUIRE(got == piece, "IDX file '", path, "' ends early while reading the values: it holds ", have + got,
                   " of the ", elements, " its header declares (", describe_dims(out.dims), ")");
  }
  // Also reads a gzip stream to its end, so its checksum is checked.
  unsigned char extra[64];
  const std::size_t trailing = read_some(file.get(), extra, sizeof extra, path, "past the values");
  LATHER_REQUIRE(trailing == 0, "IDX file '", path, "' holds more bytes than the ", elements,
                 " values its header declares (", describe_dims(out.dims), "): not an IDX file of this shape");
  return out;
}

LabelledImages load_mnist_like(const std::string& directory, const std::string& split) {
  LATHER_REQUIRE(split == "train" || split == "t10k", "data split must be 'train' or 't10k', got '", split, "'");
  LATHER_REQUIRE(std::filesystem::is_directory(directory), "data directory '", directory,
                 "' does not exist (Fashion-MNIST: install the Debian package dataset-fashion-mnist, or pass --data "
                 "DIR with train-images-idx3-ubyte.gz and friends)");
  const auto find = [&](const std::string& stem) {
    for (const std::string& name : {stem + ".gz", stem}) {
      const auto path = std::filesystem::path(directory) / name;
      if (std::filesystem::exists(path)) return path.string();
    }
    LATHER_FAIL("data directory '", directory, "' has no ", stem, "[.gz]");
  };
  const IdxArray images = read_idx(find(split + "-images-idx3-ubyte"));
  const IdxArray labels = read_idx(find(split + "-labels-idx1-ubyte"));
  LATHER_REQUIRE(images.dims.size() == 3, "'", split, "' images have ", images.dims.size(), " dimensions, expected 3");
  LATHER_REQUIRE(labels.dims.size() == 1 && labels.dims[0] == images.dims[0], "'", split, "' has ", images.dims[0],
                 " images but ", labels.dims.empty() ? 0 : labels.dims[0], " labels");
  LabelledImages out;
  out.count = images.dims[0];
  out.features = images.dims[1] * images.dims[2];
  out.images.resize(images.values.size());
  for (std::size_t k = 0; k < images.values.size(); ++k) out.images[k] = float(images.values[k]) / 255.0f;
  out.labels.resize(labels.values.size());
  int classes = 0;
  for (std::size_t k = 0; k < labels.values.size(); ++k) {
    out.labels[k] = labels.values[k];
    classes = std::max(classes, int(labels.values[k]) + 1);
  }
  out.classes = classes;
  return out;
}

}  // namespace lather::data
