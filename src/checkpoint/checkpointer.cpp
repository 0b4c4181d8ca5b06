#include <lather/checkpoint/checkpoint.hpp>

#include "agreement.hpp"
#include "directory.hpp"
#include "hdf5_handles.hpp"

#include <lather/core/config.hpp>
#include <lather/core/error.hpp>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <functional>
#include <numeric>
#include <tuple>

namespace lather::checkpoint {

using namespace Impl;

std::int64_t ArraySlice::elements() const {
  switch (selection) {
    case Selection::whole: return element_count(shape);
    case Selection::rows: {
      std::int64_t row = 1;
      for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
      return std::int64_t(rows.size()) * row;
    }
    case Selection::block: {
      std::int64_t n = 1;
      for (auto c : count) n *= c;
      return n;
    }
  }
  return 0;
}

void CheckpointOptions::validate() const {
  LATHER_REQUIRE(!directory.empty(), "CheckpointOptions::directory is empty");
  LATHER_REQUIRE(!prefix.empty() && prefix.find('/') == std::string::npos,
                 "CheckpointOptions::prefix must be a plain file name prefix, got '", prefix, "'");
  LATHER_REQUIRE(keep_last >= 1, "CheckpointOptions::keep_last must be >= 1, got ", keep_last);
  LATHER_REQUIRE(chunk_bytes >= 1024, "CheckpointOptions::chunk_bytes must be >= 1024, got ", chunk_bytes);
}

namespace {

constexpr const char* format_name = "lather-checkpoint";

/// Stored dimensions: a 0-D array is stored as [1] (chunked datasets need a rank), marked so.
std::vector<hsize_t> stored_dims(const TensorShape& shape) {
  if (shape.empty()) return {1};
  return std::vector<hsize_t>(shape.begin(), shape.end());
}

/// Chunks of about `target` bytes: whole trailing dimensions, as many leading rows as fit.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, std::size_t element, std::size_t target) {
  std::vector<hsize_t> chunk = dims;
  for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
  std::size_t bytes = element;
  for (auto c : chunk) bytes *= c;
  // Shrink the leading dimensions first, keeping rows (the unit ranks write) whole if possible.
  for (std::size_t d = 0; d < chunk.size() && bytes > target; ++d) {
    const std::size_t others = bytes / chunk[d];
    const hsize_t fit = std::max<hsize_t>(1, hsize_t(target / std::max<std::size_t>(others, 1)));
    if (fit < chunk[d]) {
      chunk[d] = fit;
      bytes = others * fit;
    }
  }
  return chunk;
}

/// This rank's selection in the file's dataspace.
void select(hid_t space, const ArraySlice& a, bool writing) {
  const auto dims = stored_dims(a.shape);
  const std::size_t rank = dims.size();
  check(H5Sselect_none(space), "selecting nothing");
  switch (a.selection) {
    case ArraySlice::Selection::whole:
      if (!writing || a.writer) check(H5Sselect_all(space), "selecting " + a.path);
      break;
    case ArraySlice::Selection::rows: {
      // Consecutive rows are merged into one hyperslab each.
      std::size_t k = 0;
      while (k < a.rows.size()) {
        std::size_t run = 1;
        while (k + run < a.rows.size() && a.rows[k + run] == a.rows[k] + std::int64_t(run)) ++run;
        std::vector<hsize_t> start(rank, 0), count = dims;
        start[0] = hsize_t(a.rows[k]);
        count[0] = run;
        check(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr),
              "selecting rows of " + a.path);
        k += run;
      }
      break;
    }
    case ArraySlice::Selection::block: {
      std::vector<hsize_t> start(a.offset.begin(), a.offset.end()), count(a.count.begin(), a.count.end());
      if (a.shape.empty()) start = {0}, count = {1};
      if (std::all_of(count.begin(), count.end(), [](hsize_t c) { return c > 0; }))
        check(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
              "selecting a block of " + a.path);
      break;
    }
  }
}

void check_slice(const ArraySlice& a) {
  LATHER_REQUIRE(!a.path.empty() && a.path.front() != '/', "checkpoint array path must be relative, got '",
                 a.path, "'");
  if (a.selection == ArraySlice::Selection::rows) {
    LATHER_REQUIRE(!a.shape.empty(), "checkpoint array '", a.path, "': rows selected from a 0-D array");
    for (auto r : a.rows)
      LATHER_REQUIRE(r >= 0 && r < a.shape[0], "checkpoint array '", a.path, "': row ", r, " outside [0, ",
                     a.shape[0], ")");
    auto sorted = a.rows;
    std::sort(sorted.begin(), sorted.end());
    LATHER_REQUIRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "checkpoint array '", a.path,
                   "': a row is listed twice");
  }
  if (a.selection == ArraySlice::Selection::block) {
    LATHER_REQUIRE(a.offset.size() == a.shape.size() && a.count.size() == a.shape.size(),
                   "checkpoint array '", a.path, "': block offset/count must have one entry per dimension");
    for (std::size_t d = 0; d < a.shape.size(); ++d)
      LATHER_REQUIRE(a.offset[d] >= 0 && a.count[d] >= 0 && a.offset[d] + a.count[d] <= a.shape[d],
                     "checkpoint array '", a.path, "': block [", a.offset[d], ", ", a.offset[d] + a.count[d],
                     ") outside dimension ", d, " of extent ", a.shape[d]);
  }
  LATHER_REQUIRE(a.elements() == 0 || a.data != nullptr, "checkpoint array '", a.path, "' has no buffer");
}

/// A memory dataspace shaped like this rank's selection (its rows, or its block), all selected:
/// HDF5 maps same-shaped selections chunk by chunk, while a 1-D buffer against an N-D selection
/// goes element by element, several times slower.
hid_t memory_space_for(const ArraySlice& a, hssize_t selected) {
  std::vector<hsize_t> dims;
  switch (a.selection) {
    case ArraySlice::Selection::whole: dims = stored_dims(a.shape); break;
    case ArraySlice::Selection::rows:
      dims = stored_dims(a.shape);
      dims[0] = hsize_t(a.rows.size());
      break;
    case ArraySlice::Selection::block:
      if (a.shape.empty())
        dims = {1};
      else
        dims.assign(a.count.begin(), a.count.end());
      break;
  }
  if (selected <= 0 || hsize_t(selected) != std::accumulate(dims.begin(), dims.end(), hsize_t(1), std::multiplies<>())) {
    const hsize_t count = hsize_t(std::max<hssize_t>(selected, 1));
    return H5Screate_simple(1, &count, nullptr);
  }
  return H5Screate_simple(int(dims.size()), dims.data(), nullptr);
}

/// Runs of consecutive rows in ascending order: (first row, count), over the sorted rows.
std::vector<std::pair<std::int64_t, std::int64_t>> row_runs(const ArraySlice& a) {
  std::vector<std::int64_t> rows = a.rows;
  std::sort(rows.begin(), rows.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  for (std::size_t k = 0; k < rows.size();) {
    std::size_t n = 1;
    while (k + n < rows.size() && rows[k + n] == rows[k] + std::int64_t(n)) ++n;
    runs.push_back({rows[k], std::int64_t(n)});
    k += n;
  }
  return runs;
}

/// Selects rows [first, first + count) in `file` and the matching rows [at, at + count) of the
/// memory space [rows, ...] (count 0 selects nothing in either).
void select_run(hid_t file, hid_t memory, const std::vector<hsize_t>& dims, std::int64_t first, std::int64_t at,
                std::int64_t count) {
  check(H5Sselect_none(file), "selecting nothing");
  check(H5Sselect_none(memory), "selecting nothing");
  if (count == 0) return;
  std::vector<hsize_t> start(dims.size(), 0), extent = dims;
  start[0] = hsize_t(first);
  extent[0] = hsize_t(count);
  check(H5Sselect_hyperslab(file, H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr), "selecting rows");
  start[0] = hsize_t(at);
  check(H5Sselect_hyperslab(memory, H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr), "selecting rows");
}

/// HDF5 returns the points of a selection in file order, so rows listed out of order are moved
/// through a buffer sorted by row. Returns the permutation (buffer row k is file row order[k]).
std::vector<std::size_t> row_order(const ArraySlice& a) {
  std::vector<std::size_t> order(a.rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return a.rows[x] < a.rows[y]; });
  return order;
}

bool rows_sorted(const ArraySlice& a) {
  return a.selection != ArraySlice::Selection::rows || std::is_sorted(a.rows.begin(), a.rows.end());
}

/// Copies rows between the caller's buffer order and file (sorted) order.
void permute_rows(const ArraySlice& a, const std::vector<std::size_t>& order, const char* from, char* to,
                  bool to_sorted) {
  std::size_t row_bytes = optim::size_of(a.dtype);
  for (std::size_t d = 1; d < a.shape.size(); ++d) row_bytes *= std::size_t(a.shape[d]);
  for (std::size_t k = 0; k < order.size(); ++k) {
    if (to_sorted)
      std::memcpy(to + k * row_bytes, from + order[k] * row_bytes, row_bytes);
    else
      std::memcpy(to + order[k] * row_bytes, from + k * row_bytes, row_bytes);
  }
}

/// Rank k of `size` handles rows [first_row(k), first_row(k + 1)) of `n`.
std::int64_t first_row(std::int64_t k, std::int64_t n, int size) { return (k * n) / size; }
/// The rank whose range holds row r (the inverse of first_row).
int row_owner(std::int64_t r, std::int64_t n, int size) {
  int k = int(((r + 1) * size - 1) / n);  // first guess, then settle on the exact range
  while (k > 0 && first_row(k, n, size) > r) --k;
  while (k + 1 < size && first_row(k + 1, n, size) <= r) ++k;
  return k;
}

/// Rows written by scattered owners (Shampoo's balanced assignment) are first moved to the rank
/// that writes a contiguous range of them, rank k taking rows [k N / P, (k + 1) N / P): one
/// MPI_Alltoallv, and every rank then writes at most one run. `a` must have sorted rows and
/// `data` in that order. Returns the rows this rank now writes (sorted) and their bytes.
std::pair<std::vector<std::int64_t>, std::vector<char>> gather_contiguous_rows(MPI_Comm comm, const ArraySlice& a,
                                                                              const char* data) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const std::int64_t n = a.shape[0];
  std::size_t row_bytes = optim::size_of(a.dtype);
  for (std::size_t d = 1; d < a.shape.size(); ++d) row_bytes *= std::size_t(a.shape[d]);
  const auto target = [&](std::int64_t r) { return row_owner(r, n, size); };
  std::vector<int> send_rows(size, 0), receive_rows(size, 0);
  const std::vector<std::int64_t> mine = a.writer ? a.rows : std::vector<std::int64_t>{};
  for (auto r : mine) ++send_rows[target(r)];
  MPI_Alltoall(send_rows.data(), 1, MPI_INT, receive_rows.data(), 1, MPI_INT, comm);
  std::vector<int> send_at(size, 0), receive_at(size, 0);
  for (int k = 1; k < size; ++k) {
    send_at[k] = send_at[k - 1] + send_rows[k - 1];
    receive_at[k] = receive_at[k - 1] + receive_rows[k - 1];
  }
  const int received = receive_at[size - 1] + receive_rows[size - 1];
  // Rows are sorted, so rows for each target are consecutive in `data`: send in place.
  std::vector<std::int64_t> rows(received);
  MPI_Alltoallv(mine.data(), send_rows.data(), send_at.data(), MPI_INT64_T, rows.data(), receive_rows.data(),
                receive_at.data(), MPI_INT64_T, comm);
  MPI_Datatype row_type;
  MPI_Type_contiguous(int(row_bytes), MPI_BYTE, &row_type);
  MPI_Type_commit(&row_type);
  std::vector<char> bytes(std::size_t(received) * row_bytes);
  MPI_Alltoallv(data, send_rows.data(), send_at.data(), row_type, bytes.data(), receive_rows.data(),
                receive_at.data(), row_type, comm);
  MPI_Type_free(&row_type);
  if (std::is_sorted(rows.begin(), rows.end())) return {std::move(rows), std::move(bytes)};
  // From different senders the rows interleave: sort them with their bytes.
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return rows[x] < rows[y]; });
  std::vector<std::int64_t> sorted_rows(rows.size());
  std::vector<char> sorted_bytes(bytes.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    sorted_rows[k] = rows[order[k]];
    std::memcpy(sorted_bytes.data() + k * row_bytes, bytes.data() + order[k] * row_bytes, row_bytes);
  }
  return {std::move(sorted_rows), std::move(sorted_bytes)};
}

/// Whether every rank's rows (for writing: only a writer's) are exactly its range [first_row(k),
/// first_row(k + 1)) in order -- the layout of a restart on the same rank count -- so that rows go
/// straight between the caller's buffer and the file. One small allreduce.
bool rows_in_place(MPI_Comm comm, const ArraySlice& a, bool writing) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  const std::int64_t n = a.shape[0], first = first_row(rank, n, size), last = first_row(rank + 1, n, size);
  const std::vector<std::int64_t> empty;
  const auto& mine = writing && !a.writer ? empty : a.rows;
  int here = std::int64_t(mine.size()) == last - first ? 1 : 0;
  for (std::size_t k = 0; here && k < mine.size(); ++k) here = mine[k] == first + std::int64_t(k);
  int everywhere = 0;
  MPI_Allreduce(&here, &everywhere, 1, MPI_INT, MPI_MIN, comm);
  return everywhere == 1;
}

/// The inverse of gather_contiguous_rows for loading: rank k has read rows [k N / P, (k+1) N / P)
/// into `range` (`range_first` is k N / P); every rank receives the rows it asked for, sorted,
/// into `out`. Two MPI_Alltoallv (the requests, then the rows).
void scatter_contiguous_rows(MPI_Comm comm, const ArraySlice& a, const char* range, std::int64_t range_first,
                             char* out) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::int64_t n = a.shape[0];
  std::size_t row_bytes = optim::size_of(a.dtype);
  for (std::size_t d = 1; d < a.shape.size(); ++d) row_bytes *= std::size_t(a.shape[d]);
  std::vector<std::int64_t> wanted = a.rows;
  std::sort(wanted.begin(), wanted.end());
  std::vector<int> ask(size, 0), asked(size, 0);
  for (auto r : wanted) ++ask[row_owner(r, n, size)];
  MPI_Alltoall(ask.data(), 1, MPI_INT, asked.data(), 1, MPI_INT, comm);
  std::vector<int> ask_at(size, 0), asked_at(size, 0);
  for (int k = 1; k < size; ++k) {
    ask_at[k] = ask_at[k - 1] + ask[k - 1];
    asked_at[k] = asked_at[k - 1] + asked[k - 1];
  }
  std::vector<std::int64_t> requests(std::size_t(asked_at[size - 1] + asked[size - 1]));
  MPI_Alltoallv(wanted.data(), ask.data(), ask_at.data(), MPI_INT64_T, requests.data(), asked.data(),
                asked_at.data(), MPI_INT64_T, comm);
  std::vector<char> answers(requests.size() * row_bytes);
  for (std::size_t k = 0; k < requests.size(); ++k)
    std::memcpy(answers.data() + k * row_bytes, range + std::size_t(requests[k] - range_first) * row_bytes, row_bytes);
  MPI_Datatype row_type;
  MPI_Type_contiguous(int(row_bytes), MPI_BYTE, &row_type);
  MPI_Type_commit(&row_type);
  MPI_Alltoallv(answers.data(), asked.data(), asked_at.data(), row_type, out, ask.data(), ask_at.data(), row_type,
                comm);
  MPI_Type_free(&row_type);
}

/// A fingerprint of the array list (paths, types, shapes) that every rank must share.
std::uint64_t fingerprint(const std::vector<ArraySlice>& arrays) {
  std::uint64_t h = 1469598103934665603ull;
  const auto mix = [&](std::uint64_t x) { h = (h ^ x) * 1099511628211ull; };
  for (const auto& a : arrays) {
    for (char c : a.path) mix(std::uint64_t(c));
    mix(std::uint64_t(a.dtype) + 1000);
    for (auto d : a.shape) mix(std::uint64_t(d) + 7);
    mix(0xffff);
  }
  return h;
}

void agree_on_arrays(MPI_Comm comm, const std::vector<ArraySlice>& arrays) {
  std::uint64_t mine = fingerprint(arrays), low = 0, high = 0;
  MPI_Allreduce(&mine, &low, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(&mine, &high, 1, MPI_UINT64_T, MPI_MAX, comm);
  if (low != high)
    LATHER_FAIL("checkpoint: the ranks passed different lists of arrays (paths, types or shapes differ)");
}

PropertyList mpio_access(MPI_Comm comm) {
  PropertyList fapl(check(H5Pcreate(H5P_FILE_ACCESS), "creating a file access list"));
  check(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "setting MPI-IO file access");
  return fapl;
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  Datatype type(check(H5Tcopy(H5T_C_S1), "copying the string type"));
  check(H5Tset_size(type.get(), std::max<std::size_t>(1, value.size())), "sizing a string attribute");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "padding a string attribute");
  Dataspace space(check(H5Screate(H5S_SCALAR), "creating a scalar dataspace"));
  Attribute attribute(check(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                            "creating attribute " + name));
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(attribute.get(), type.get(), padded.data()), "writing attribute " + name);
}

template <class T>
void write_number_attribute(hid_t object, const std::string& name, hid_t type, T value) {
  Dataspace space(check(H5Screate(H5S_SCALAR), "creating a scalar dataspace"));
  Attribute attribute(check(H5Acreate2(object, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                            "creating attribute " + name));
  check(H5Awrite(attribute.get(), type, &value), "writing attribute " + name);
}

herr_t read_attribute(hid_t object, const char* name, const H5A_info_t*, void* data) {
  auto* out = static_cast<Attributes*>(data);
  Attribute attribute(H5Aopen(object, name, H5P_DEFAULT));
  if (!attribute.valid()) return -1;
  Datatype type(H5Aget_type(attribute.get()));
  Dataspace space(H5Aget_space(attribute.get()));
  if (!type.valid() || !space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1) return 0;
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: {
      std::int64_t v = 0;
      if (H5Aread(attribute.get(), H5T_NATIVE_INT64, &v) >= 0) out->integers[name] = v;
      break;
    }
    case H5T_FLOAT: {
      double v = 0;
      if (H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &v) >= 0) out->reals[name] = v;
      break;
    }
    case H5T_STRING: {
      if (H5Tis_variable_str(type.get()) > 0) break;
      const std::size_t size = H5Tget_size(type.get());
      if (size > (1u << 20)) break;  // not ours: refuse to size a buffer from it
      std::string v(size, '\0');
      if (H5Aread(attribute.get(), type.get(), v.data()) >= 0) {
        v.resize(std::strlen(v.c_str()));
        out->strings[name] = v;
      }
      break;
    }
    default: break;
  }
  return 0;
}

Attributes read_root_attributes(hid_t file) {
  Attributes attributes;
  hsize_t index = 0;
  check(H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_NATIVE, &index, read_attribute, &attributes),
        "reading the root attributes");
  return attributes;
}

/// Rank 0's serial look at a file before every rank opens it: is it a Lather checkpoint of a
/// format we read, and does every requested array exist with the expected type and shape?
/// Nothing is allocated from what the file claims.
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
      LATHER_FAIL("checkpoint '", file, "' dataset '", a.path, "' does not hold ", optim::to_string(a.dtype));
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
      LATHER_FAIL("checkpoint '", file, "' dataset '", a.path, "' has shape ", lather::to_string(got),
                  ", expected ", lather::to_string(a.shape));
    }
  }
  return attributes;
}

}  // namespace

Checkpointer::Checkpointer(MPI_Comm comm, CheckpointOptions options) : m_options(std::move(options)) {
  m_options.validate();
  MPI_Comm_dup(comm, &m_comm);
  MPI_Comm_rank(m_comm, &m_rank);
  MPI_Comm_size(m_comm, &m_size);
}

Checkpointer::~Checkpointer() {
  if (m_comm != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&m_comm);
  }
}

std::string Checkpointer::save(long step, const std::vector<ArraySlice>& arrays, const Attributes& attributes) {
  QuietHdf5 quiet;
  LATHER_REQUIRE(step >= 0, "checkpoint step must be >= 0, got ", step);
  agreed(m_comm, [&] {
    for (const auto& a : arrays) check_slice(a);
  });
  agree_on_arrays(m_comm, arrays);

  // Rank 0 prepares the directory and names the temporary file.
  std::string temporary;
  agreed(m_comm, [&] {
    if (m_rank != 0) return;
    make_directories(m_options.directory);
    remove_temporaries(m_options.directory, m_options.prefix);
    temporary = temporary_name(m_options.directory, m_options.prefix, step);
  });
  broadcast(m_comm, 0, temporary);

  agreed(m_comm, [&] {
    auto fapl = mpio_access(m_comm);
    File file(check(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                    "creating checkpoint '" + temporary + "'"));
    PropertyList lcpl(check(H5Pcreate(H5P_LINK_CREATE), "creating a link list"));
    check(H5Pset_create_intermediate_group(lcpl.get(), 1), "enabling intermediate groups");
    PropertyList dxpl(check(H5Pcreate(H5P_DATASET_XFER), "creating a transfer list"));
    check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "setting collective transfers");

    for (const auto& a : arrays) {
      const std::string where = "checkpoint '" + temporary + "' dataset '" + a.path + "'";
      const auto dims = stored_dims(a.shape);
      Dataspace space(check(H5Screate_simple(int(dims.size()), dims.data(), nullptr), where));
      PropertyList dcpl(check(H5Pcreate(H5P_DATASET_CREATE), where));
      const bool empty = element_count(a.shape) == 0;
      if (!empty) {
        const auto chunk = chunk_dims(dims, optim::size_of(a.dtype), m_options.chunk_bytes);
        check(H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data()), where + ": chunking");
        check(H5Pset_fletcher32(dcpl.get()), where + ": checksum filter");
      }
      Dataset dataset(check(H5Dcreate2(file.get(), a.path.c_str(), native_type(a.dtype), space.get(), lcpl.get(),
                                       dcpl.get(), H5P_DEFAULT),
                            where + ": create"));
      if (a.shape.empty()) write_number_attribute<std::int64_t>(dataset.get(), "scalar", H5T_NATIVE_INT64, 1);
      if (empty) continue;
      std::vector<char> sorted;
      const void* source = a.data;
      if (!rows_sorted(a) && a.elements() > 0) {
        sorted.resize(a.bytes());
        permute_rows(a, row_order(a), static_cast<const char*>(a.data), sorted.data(), true);
        source = sorted.data();
      }
      if (a.selection == ArraySlice::Selection::rows) {
        // Rows move to contiguous writers first; then one collective write per run (every rank
        // makes as many calls as the rank with the most runs, normally one): same-shaped
        // selections keep HDF5 on its chunk-wise path.
        ArraySlice contiguous = a;
        contiguous.writer = true;
        std::vector<char> bytes;
        if (!rows_in_place(m_comm, a, true)) {
          std::tie(contiguous.rows, bytes) = gather_contiguous_rows(m_comm, a, static_cast<const char*>(source));
          source = bytes.data();
        } else if (!a.writer) {
          contiguous.rows.clear();
        }
        const auto runs = row_runs(contiguous);
        std::int64_t mine = std::int64_t(runs.size()), most = 0;
        MPI_Allreduce(&mine, &most, 1, MPI_INT64_T, MPI_MAX, m_comm);
        auto memory_dims = dims;
        memory_dims[0] = std::max<hsize_t>(1, hsize_t(contiguous.rows.size()));
        Dataspace memory(check(H5Screate_simple(int(memory_dims.size()), memory_dims.data(), nullptr), where));
        std::int64_t at = 0;
        for (std::int64_t k = 0; k < most; ++k) {
          const bool has = k < mine;
          select_run(space.get(), memory.get(), dims, has ? runs[k].first : 0, at, has ? runs[k].second : 0);
          check(H5Dwrite(dataset.get(), native_type(a.dtype), memory.get(), space.get(), dxpl.get(), source),
                where + ": write");
          if (k < mine) at += runs[k].second;
        }
        continue;
      }
      select(space.get(), a, true);
      const hssize_t selected = H5Sget_select_npoints(space.get());
      Dataspace memory(check(memory_space_for(a, selected), where));
      if (selected == 0) check(H5Sselect_none(memory.get()), where);
      check(H5Dwrite(dataset.get(), native_type(a.dtype), memory.get(), space.get(), dxpl.get(),
                     selected > 0 ? source : nullptr),
            where + ": write");
    }
    // Root attributes: identification first, "complete" last.
    write_string_attribute(file.get(), "format", format_name);
    write_number_attribute<std::int64_t>(file.get(), "format_version", H5T_NATIVE_INT64, format_version);
    write_string_attribute(file.get(), "library_version", LATHER_VERSION_STRING);
    const std::time_t now = std::time(nullptr);
    char created[32];
    std::strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    write_string_attribute(file.get(), "created", created);
    write_number_attribute<std::int64_t>(file.get(), "step", H5T_NATIVE_INT64, step);
    write_number_attribute<std::int64_t>(file.get(), "writer_ranks", H5T_NATIVE_INT64, m_size);
    for (const auto& [name, value] : attributes.integers)
      if (name != "step") write_number_attribute<std::int64_t>(file.get(), name, H5T_NATIVE_INT64, value);
    for (const auto& [name, value] : attributes.reals)
      write_number_attribute<double>(file.get(), name, H5T_NATIVE_DOUBLE, value);
    for (const auto& [name, value] : attributes.strings) write_string_attribute(file.get(), name, value);
    write_number_attribute<std::int64_t>(file.get(), "complete", H5T_NATIVE_INT64, 1);
    check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing checkpoint '" + temporary + "'");
  });

  // Closed everywhere: rank 0 makes it visible under its final name and prunes old ones.
  std::string final = final_name(m_options.directory, m_options.prefix, step);
  agreed(m_comm, [&] {
    if (m_rank != 0) return;
    publish(temporary, final, m_options.fsync);
    prune(m_options.directory, m_options.prefix, m_options.keep_last);
  });
  return final;
}

std::vector<std::string> Checkpointer::list(std::vector<std::string>* skipped) const {
  QuietHdf5 quiet;
  // One line per file; a skipped file's line starts with '\x01' and carries the reason.
  std::string joined;
  if (m_rank == 0) {
    for (const auto& [step, path] : list_final(m_options.directory, m_options.prefix)) {
      try {
        inspect(path, {});
        joined += path + '\n';
      } catch (const Error& e) {
        // Not complete or not ours: never offered as a checkpoint, but reported.
        std::string reason = e.what();
        std::replace(reason.begin(), reason.end(), '\n', ' ');
        joined += '\x01' + path + ": " + reason + '\n';
      }
    }
  }
  broadcast(m_comm, 0, joined);
  std::vector<std::string> files;
  if (skipped) skipped->clear();
  std::size_t start = 0;
  for (std::size_t end; (end = joined.find('\n', start)) != std::string::npos; start = end + 1) {
    std::string line = joined.substr(start, end - start);
    if (!line.empty() && line[0] == '\x01') {
      if (skipped) skipped->push_back(line.substr(1));
    } else {
      files.push_back(std::move(line));
    }
  }
  return files;
}

std::string Checkpointer::latest(std::vector<std::string>* skipped) const {
  const auto files = list(skipped);
  return files.empty() ? std::string() : files.back();
}

Attributes Checkpointer::read_attributes(const std::string& file) const {
  Attributes attributes;
  load(file, {}, &attributes);
  return attributes;
}

void Checkpointer::load(const std::string& file, const std::vector<ArraySlice>& arrays, Attributes* attributes) const {
  QuietHdf5 quiet;
  agreed(m_comm, [&] {
    for (const auto& a : arrays) check_slice(a);
  });
  agree_on_arrays(m_comm, arrays);
  // Rank 0 vets the file alone, so a foreign or damaged file fails before any collective open.
  Attributes root;
  agreed(m_comm, [&] {
    if (m_rank == 0) root = inspect(file, arrays);
  });
  agreed(m_comm, [&] {
    auto fapl = mpio_access(m_comm);
    File f(check(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get()), "opening checkpoint '" + file + "'"));
    std::string error;
    try {
      PropertyList dxpl(check(H5Pcreate(H5P_DATASET_XFER), "creating a transfer list"));
      check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT), "setting independent transfers");
      for (const auto& a : arrays) {
        if (element_count(a.shape) == 0) continue;
        const std::string where = "checkpoint '" + file + "' dataset '" + a.path + "'";
        Dataset dataset(check(H5Dopen2(f.get(), a.path.c_str(), H5P_DEFAULT), where));
        Dataspace space(check(H5Dget_space(dataset.get()), where));
        if (a.selection == ArraySlice::Selection::rows) continue;  // below, with every rank
        select(space.get(), a, false);
        const hssize_t selected = H5Sget_select_npoints(space.get());
        if (selected <= 0) continue;
        LATHER_REQUIRE(hsize_t(selected) == hsize_t(a.elements()), where, ": selection of ", selected,
                       " elements for a buffer of ", a.elements());
        Dataspace memory(check(memory_space_for(a, selected), where));
        std::vector<char> sorted;
        if (!rows_sorted(a)) sorted.resize(a.bytes());
        check(H5Dread(dataset.get(), native_type(a.dtype), memory.get(), space.get(), dxpl.get(),
                      sorted.empty() ? a.data : sorted.data()),
              where + ": read failed (corrupted or truncated?)");
        if (!sorted.empty()) permute_rows(a, row_order(a), sorted.data(), static_cast<char*>(a.data), false);
      }
      if (attributes) *attributes = read_root_attributes(f.get());
    } catch (const Error& e) {
      error = e.message();
    }
    // Arrays read by rows: each rank reads one contiguous range and the rows travel to the ranks
    // that asked for them. Collective, so every rank takes part even after a failure above.
    for (const auto& a : arrays) {
      if (a.selection != ArraySlice::Selection::rows || element_count(a.shape) == 0) continue;
      const std::int64_t n = a.shape[0];
      const std::int64_t first = first_row(m_rank, n, m_size), last = first_row(m_rank + 1, n, m_size);
      ArraySlice range = a;
      range.rows.clear();
      for (std::int64_t r = first; r < last; ++r) range.rows.push_back(r);
      // Same rank count and layout as written: read straight into the caller's buffer.
      const bool in_place = rows_in_place(m_comm, a, false);
      std::vector<char> bytes(in_place ? 0 : range.bytes());
      char* into = in_place ? static_cast<char*>(a.data) : bytes.data();
      if (error.empty() && last > first) {
        try {
          const std::string where = "checkpoint '" + file + "' dataset '" + a.path + "'";
          Dataset dataset(check(H5Dopen2(f.get(), a.path.c_str(), H5P_DEFAULT), where));
          Dataspace space(check(H5Dget_space(dataset.get()), where));
          const auto dims = stored_dims(a.shape);
          auto memory_dims = dims;
          memory_dims[0] = hsize_t(last - first);
          Dataspace memory(check(H5Screate_simple(int(memory_dims.size()), memory_dims.data(), nullptr), where));
          select_run(space.get(), memory.get(), dims, first, 0, last - first);
          PropertyList dxpl(check(H5Pcreate(H5P_DATASET_XFER), "creating a transfer list"));
          check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT), "setting independent transfers");
          check(H5Dread(dataset.get(), native_type(a.dtype), memory.get(), space.get(), dxpl.get(), into),
                where + ": read failed (corrupted or truncated?)");
        } catch (const Error& e) {
          error = e.message();
        }
      }
      if (in_place) continue;
      std::vector<char> sorted(a.bytes());
      scatter_contiguous_rows(m_comm, a, bytes.data(), first, sorted.data());
      if (rows_sorted(a))
        std::memcpy(a.data, sorted.data(), sorted.size());
      else
        permute_rows(a, row_order(a), sorted.data(), static_cast<char*>(a.data), false);
    }
    f.reset();  // collective close on every rank, whatever happened above
    LATHER_REQUIRE(error.empty(), error);
  });
}

}  // namespace lather::checkpoint
