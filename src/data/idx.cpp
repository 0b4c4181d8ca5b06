#include <lather/data/idx.hpp>

#include <lather/core/error.hpp>

#include <zlib.h>

#include <filesystem>
#include <memory>

namespace lather::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const {
    if (f) gzclose(f);
  }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

/// zlib reads plain files through the same interface, so .gz and raw IDX share one path.
void read_exactly(gzFile file, void* out, std::size_t bytes, const std::string& path, const char* what) {
  std::size_t done = 0;
  auto* p = static_cast<char*>(out);
  while (done < bytes) {
    const unsigned piece = unsigned(std::min<std::size_t>(bytes - done, 1u << 30));
    const int got = gzread(file, p + done, piece);
    if (got <= 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      LATHER_FAIL("IDX file '", path, "' ends early while reading ", what, " (", done, " of ", bytes,
                  " bytes", code != Z_OK && code != Z_STREAM_END ? std::string(": ") + message : std::string(), ")");
    }
    done += std::size_t(got);
  }
}

}  // namespace

IdxArray read_idx(const std::string& path, std::int64_t max_elements) {
  LATHER_REQUIRE(std::filesystem::exists(path), "IDX file '", path, "' does not exist");
  GzFile file(gzopen(path.c_str(), "rb"));
  LATHER_REQUIRE(file != nullptr, "cannot open IDX file '", path, "'");
  unsigned char magic[4];
  read_exactly(file.get(), magic, 4, path, "the magic number");
  LATHER_REQUIRE(magic[0] == 0 && magic[1] == 0, "'", path, "' is not an IDX file (bad magic number)");
  LATHER_REQUIRE(magic[2] == 0x08, "IDX file '", path, "' holds type 0x", std::hex, int(magic[2]),
                 ", only unsigned bytes (0x08) are supported");
  const int rank = magic[3];
  LATHER_REQUIRE(rank >= 1 && rank <= 4, "IDX file '", path, "' declares ", rank, " dimensions");
  IdxArray out;
  std::int64_t elements = 1;
  for (int d = 0; d < rank; ++d) {
    unsigned char b[4];
    read_exactly(file.get(), b, 4, path, "the dimensions");
    const std::int64_t dim = (std::int64_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    LATHER_REQUIRE(dim >= 1 && elements <= max_elements / dim, "IDX file '", path, "' declares dimension ", d,
                   " = ", dim, ", more than ", max_elements, " values in all");
    out.dims.push_back(dim);
    elements *= dim;
  }
  out.values.resize(std::size_t(elements));
  read_exactly(file.get(), out.values.data(), out.values.size(), path, "the values");
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
