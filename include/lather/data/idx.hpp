#pragma once
// The IDX format of MNIST and Fashion-MNIST (optionally gzip-compressed): a big-endian header
// (magic, dimensions) followed by unsigned bytes. Read on the host, validated before anything is
// allocated from the header.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_DATA)
#error "lather/data/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <cstdint>
#include <string>
#include <vector>

namespace lather::data {

struct IdxArray {
  std::vector<std::int64_t> dims;  ///< e.g. [60000, 28, 28] or [60000]
  std::vector<std::uint8_t> values;
};

/// Reads an IDX file of unsigned bytes (type code 0x08), plain or gzip. Throws lather::Error
/// naming the file for a missing file, a bad magic number, implausible dimensions (more than
/// `max_elements` values, or more than the file can hold: a plain file's size, 1032 times a gzip
/// file's, deflate's largest expansion), a file shorter or longer than its header says, or a
/// damaged gzip stream. The dimensions are checked before anything is allocated, and the values
/// are read in pieces of 16 MiB, so memory follows what the file really holds.
IdxArray read_idx(const std::string& path, std::int64_t max_elements = std::int64_t(1) << 31);

/// A labelled image set: images as float in [0, 1], row-major [count, features].
struct LabelledImages {
  std::int64_t count = 0;
  std::int64_t features = 0;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  int classes = 0;
};

/// Fashion-MNIST (or MNIST) from a directory holding train-images-idx3-ubyte[.gz],
/// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz].
/// `split` is "train" or "t10k".
LabelledImages load_mnist_like(const std::string& directory, const std::string& split);

/// The directory the Debian package dataset-fashion-mnist installs.
inline constexpr const char* default_fashion_mnist_directory = "/usr/share/datasets/fashion-mnist";

}  // namespace lather::data
