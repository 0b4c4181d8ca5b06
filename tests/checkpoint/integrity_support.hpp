#pragma once
// What the checkpoint MPI tests share (round trips, damaged and partly failing checkpoints): a
// directory every rank sees, a damaged copy of a file, and where a dataset's checksummed chunks
// lie in the file.

#include <hdf5.h>
#include <mpi.h>

#include "common/mpi_ranks.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace lather::test {

/// A new directory under `parent` (made by rank 0, its name broadcast): "" if none could be made.
inline std::string shared_directory(const std::string& tag,
                                    const std::filesystem::path& parent = std::filesystem::temp_directory_path()) {
  char name[256] = {};
  if (world_rank() == 0) {
    const std::string pattern = (parent / ("lather-" + tag + "-XXXXXX")).string();
    std::strncpy(name, pattern.c_str(), sizeof name - 1);
    if (!mkdtemp(name)) name[0] = '\0';
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

/// A copy of `file` named `name` beside it, its bytes changed by `damage` (rank 0 writes it).
inline std::string copy_with(const std::string& file, const std::string& name,
                             const std::function<void(std::vector<char>&)>& damage) {
  const std::string target = (std::filesystem::path(file).parent_path() / name).string();
  if (world_rank() == 0) {
    std::ifstream in(file, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    damage(bytes);
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return target;
}

/// File offsets and sizes of the checksummed chunks of a dataset (rank 0 reads them serially):
/// the data are stored contiguously from H5Dget_offset, cut into chunks of the `rows_per_chunk`
/// stored beside them in _checksums/<path>.
inline std::vector<std::pair<haddr_t, hsize_t>> chunk_locations(const std::string& file, const std::string& path) {
  std::vector<std::pair<haddr_t, hsize_t>> out;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  hid_t space = H5Dget_space(d);
  hid_t type = H5Dget_type(d);
  hsize_t dims[8] = {};
  const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
  hsize_t row_bytes = H5Tget_size(type);
  for (int k = 1; k < rank; ++k) row_bytes *= dims[k];
  hid_t sums = H5Dopen2(f, ("_checksums/" + path).c_str(), H5P_DEFAULT);
  hid_t attribute = H5Aopen(sums, "rows_per_chunk", H5P_DEFAULT);
  long long rows_per_chunk = 0;
  H5Aread(attribute, H5T_NATIVE_LLONG, &rows_per_chunk);
  const haddr_t start = H5Dget_offset(d);
  for (hsize_t row = 0; row < dims[0]; row += hsize_t(rows_per_chunk))
    out.push_back({start + row * row_bytes, std::min<hsize_t>(hsize_t(rows_per_chunk), dims[0] - row) * row_bytes});
  H5Aclose(attribute);
  H5Dclose(sums);
  H5Tclose(type);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  return out;
}

}  // namespace lather::test
