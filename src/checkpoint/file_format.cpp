#include "file_format.hpp"

#include "attributes.hpp"

#include "selection.hpp"
#include "stored_checksums.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <cstring>

namespace lather::checkpoint::Impl {

Attributes inspect(const std::string& file, const std::vector<ArraySlice>& arrays) {
  File f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) LATHER_FAIL("checkpoint '", file, "' cannot be opened as HDF5: ", hdf5_error_reason());
  Attributes attributes;
  try {
    attributes = read_root_attributes(f.get());
  } catch (const Error& e) {
    LATHER_FAIL("checkpoint '", file, "': ", e.message());
  }
  const auto format = attributes.strings.find("format");
  if (format == attributes.strings.end() || format->second != format_name)
    LATHER_FAIL("'", file, "' is not a Lather checkpoint (no root attribute format = \"", format_name, "\")");
  const auto version = attributes.integers.find("format_version");
  if (version == attributes.integers.end() || version->second < 1 || version->second > format_version)
    LATHER_FAIL("checkpoint '", file, "' has format_version ",
                version == attributes.integers.end() ? std::string("(missing)") : std::to_string(version->second),
                "; this build reads 1..", format_version);
  if (attributes.integers.count("complete") == 0 || attributes.integers["complete"] != 1)
    LATHER_FAIL("checkpoint '", file, "' is incomplete (no root attribute complete = 1)");
  for (const auto& a : arrays) {
    if (H5Lexists(f.get(), a.path.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      LATHER_FAIL("checkpoint '", file, "' has no dataset '", a.path, "'");
    }
    Dataset d(H5Dopen2(f.get(), a.path.c_str(), H5P_DEFAULT));
    if (!d.valid()) LATHER_FAIL("checkpoint '", file, "' dataset '", a.path, "': ", hdf5_error_reason());
    Datatype type(check(H5Dget_type(d.get()), "checkpoint '" + file + "' dataset '" + a.path + "'"));
    DType stored;
    if (!dtype_of_stored(type.get(), stored) || stored != a.dtype)
      LATHER_FAIL("checkpoint '", file, "' dataset '", a.path, "' does not hold ", ::lather::to_string(a.dtype));
    Dataspace space(check(H5Dget_space(d.get()), "checkpoint '" + file + "' dataset '" + a.path + "'"));
    const int rank = H5Sget_simple_extent_ndims(space.get());
    const auto want = stored_dims(a.shape);
    if (rank != int(want.size()))
      LATHER_FAIL("checkpoint '", file, "' dataset '", a.path, "' has rank ", rank, ", expected ", want.size(),
                  " for shape ", lather::to_string(a.shape));
    std::vector<hsize_t> dims(rank);
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (dims != want) {
      TensorShape got(dims.begin(), dims.end());
      LATHER_FAIL("checkpoint '", file, "' dataset '", a.path, "' has shape ", lather::to_string(got), ", expected ",
                  lather::to_string(a.shape));
    }
  }
  return attributes;
}

namespace {

/// Calls `body(root, path)` for every array of an open file (the checksum datasets left out) in
/// name order, until it returns an error ("" to go on). Returns that error, or what kept HDF5 from
/// listing the objects.
std::string for_each_dataset(hid_t file, const std::function<std::string(hid_t, const char*)>& body) {
  struct Walk {
    const std::function<std::string(hid_t, const char*)>& body;
    std::string error;
  } walk{body, {}};
  const auto visit = [](hid_t root, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    auto& w = *static_cast<Walk*>(data);
    if (info->type != H5O_TYPE_DATASET) return 0;
    const std::string prefix = std::string(checksum_group) + "/";
    if (std::strncmp(name, prefix.c_str(), prefix.size()) == 0) return 0;  // checked with their arrays
    w.error = w.body(root, name);
    return w.error.empty() ? 0 : 1;
  };
  const herr_t status = H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, visit, &walk
#if H5_VERSION_GE(1, 12, 0)
                                 ,
                                 H5O_INFO_BASIC
#endif
  );
  if (!walk.error.empty()) return walk.error;
  if (status < 0) return "its objects cannot be listed: " + hdf5_error_reason();
  return {};
}

/// A dataset cannot hold more bytes than its file: what the metadata claims beyond that is refused
/// before anything is sized from it. "" or the refusal.
std::string claims_more_than_the_file(const std::string& where, hid_t space, std::size_t element,
                                      std::uintmax_t file_bytes) {
  const hssize_t points = H5Sget_simple_extent_npoints(space);
  if (points < 0) return where + " has an unreadable shape";
  if (double(points) * double(element) > double(file_bytes))
    return where + " claims " + std::to_string(points) + " elements of " + std::to_string(element) +
           " bytes, more than the file's " + std::to_string(file_bytes) + " bytes";
  return {};
}

/// Format 1: reads one dataset whole, in pieces of at most 64 MiB along its first dimension (into
/// `piece`), which makes HDF5 check every chunk's Fletcher32 checksum: "" or why it failed.
std::string verify_dataset(hid_t root, const char* name, std::vector<unsigned char>& piece, std::uintmax_t file_bytes) {
  const std::string where = "dataset '" + std::string(name) + "'";
  Dataset dataset(H5Dopen2(root, name, H5P_DEFAULT));
  if (!dataset.valid()) return where + " cannot be opened: " + hdf5_error_reason();
  Datatype stored(H5Dget_type(dataset.get()));
  Dataspace space(H5Dget_space(dataset.get()));
  if (!stored.valid() || !space.valid()) return where + ": " + hdf5_error_reason();
  Datatype native(H5Tget_native_type(stored.get(), H5T_DIR_ASCEND));
  const std::size_t element = native.valid() ? H5Tget_size(native.get()) : 0;
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (element == 0 || rank < 0 || rank > 32) return where + " has an unreadable type or shape";
  if (rank == 0) {
    piece.resize(element);
    if (H5Dread(dataset.get(), native.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, piece.data()) < 0)
      return where + ": " + hdf5_error_reason();
    return {};
  }
  std::vector<hsize_t> dims(std::size_t(rank), 0);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const std::string claim = claims_more_than_the_file(where, space.get(), element, file_bytes);
  if (!claim.empty()) return claim;
  hsize_t row = element;
  for (int d = 1; d < rank; ++d) row *= dims[std::size_t(d)];
  const hsize_t budget = hsize_t(64) << 20;
  const hsize_t rows_per_piece = std::max<hsize_t>(1, budget / std::max<hsize_t>(row, 1));
  for (hsize_t first = 0; first < dims[0]; first += rows_per_piece) {
    const hsize_t rows = std::min(rows_per_piece, dims[0] - first);
    piece.resize(std::size_t(rows * row));
    if (!read_rows(dataset.get(), native.get(), H5P_DEFAULT, dims, std::int64_t(first), std::int64_t(rows),
                   piece.data()))
      return where + " fails its checksum or cannot be read (rows " + std::to_string(first) + " to " +
             std::to_string(first + rows) + "): " + hdf5_error_reason();
  }
  return {};
}

/// Format 2: reads one dataset in pieces of whole chunks (about 8 MiB, so that each piece is summed
/// while in cache) and compares every chunk with its stored checksum: "" or what is wrong.
std::string verify_checksummed_dataset(hid_t root, const char* name, std::vector<unsigned char>& piece,
                                       std::uintmax_t file_bytes) {
  const std::string where = "dataset '" + std::string(name) + "'";
  Dataset dataset(H5Dopen2(root, name, H5P_DEFAULT));
  if (!dataset.valid()) return where + " cannot be opened: " + hdf5_error_reason();
  Datatype stored_type(H5Dget_type(dataset.get()));
  Dataspace space(H5Dget_space(dataset.get()));
  ::lather::DType dtype;
  if (!stored_type.valid() || !space.valid() || !dtype_of_stored(stored_type.get(), dtype))
    return where + " does not hold a type Lather writes";
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 1 || rank > 32) return where + " has an unreadable shape";
  std::vector<hsize_t> dims(std::size_t(rank), 0);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  if (H5Sget_simple_extent_npoints(space.get()) == 0) return {};
  const std::string claim = claims_more_than_the_file(where, space.get(), ::lather::size_of(dtype), file_bytes);
  if (!claim.empty()) return claim;
  try {
    const StoredChecksums stored = read_checksums(root, name, dims, ::lather::size_of(dtype));
    const std::int64_t chunk_bytes = stored.grid.chunk_elements() * std::int64_t(stored.grid.element_bytes);
    const std::int64_t per_piece =
        std::max<std::int64_t>(1, (std::int64_t(8) << 20) / std::max<std::int64_t>(chunk_bytes, 1));
    for (std::int64_t c = 0; c < stored.grid.chunks(); c += per_piece) {
      const std::string error = read_and_check_rows(dataset.get(), native_type(dtype), H5P_DEFAULT, name, stored, c,
                                                    std::min(per_piece, stored.grid.chunks() - c), piece);
      if (!error.empty()) return error;
    }
  } catch (const Error& e) {
    return e.message();
  }
  return {};
}

/// What `lather-checkpoint info` shows of one dataset (one that cannot be opened is left out).
void summarise_dataset(hid_t root, const char* name, std::vector<DatasetSummary>& out) {
  Dataset dataset(H5Dopen2(root, name, H5P_DEFAULT));
  if (!dataset.valid()) return;
  DatasetSummary summary;
  summary.path = name;
  Datatype type(H5Dget_type(dataset.get()));
  Dataspace space(H5Dget_space(dataset.get()));
  ::lather::DType dtype;
  summary.type = type.valid() && dtype_of_stored(type.get(), dtype) ? ::lather::to_string(dtype) : "other";
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank >= 0 && rank <= 32) {
    std::vector<hsize_t> dims(std::size_t(rank), 0);
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    summary.shape.assign(dims.begin(), dims.end());
  }
  summary.bytes = space.valid() && type.valid()
                      ? std::int64_t(H5Sget_simple_extent_npoints(space.get())) * std::int64_t(H5Tget_size(type.get()))
                      : 0;
  out.push_back(std::move(summary));
}

}  // namespace

std::string verify_datasets(const std::string& file) {
  Attributes attributes;
  try {
    attributes = inspect(file, {});
  } catch (const Error& e) {
    return e.message();
  }
  File f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) return "cannot be opened as HDF5: " + hdf5_error_reason();
  std::vector<unsigned char> piece;
  std::error_code ec;
  const std::uintmax_t file_bytes = std::filesystem::file_size(file, ec);
  if (ec) return "cannot be sized: " + ec.message();
  // Format 1 kept HDF5's Fletcher32 per chunk, checked by reading; format 2 keeps its own sums.
  const bool checksummed = attributes.integers["format_version"] >= 2;
  return for_each_dataset(f.get(), [&](hid_t root, const char* name) {
    return checksummed ? verify_checksummed_dataset(root, name, piece, file_bytes)
                       : verify_dataset(root, name, piece, file_bytes);
  });
}

CheckpointSummary describe(const std::string& file) {
  CheckpointSummary summary;
  summary.attributes = inspect(file, {});
  File f(check(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "opening checkpoint '" + file + "'"));
  const std::string error = for_each_dataset(f.get(), [&](hid_t root, const char* name) {
    summarise_dataset(root, name, summary.datasets);
    return std::string();
  });
  LATHER_REQUIRE(error.empty(), "listing the datasets of checkpoint '", file, "': ", error);
  return summary;
}

}  // namespace lather::checkpoint::Impl

namespace lather::checkpoint {

CheckpointSummary describe_checkpoint(const std::string& file) {
  Impl::QuietHdf5 quiet;
  return Impl::describe(file);
}

std::string verify_checkpoint(const std::string& file) {
  Impl::QuietHdf5 quiet;
  return Impl::verify_datasets(file);
}

}  // namespace lather::checkpoint
