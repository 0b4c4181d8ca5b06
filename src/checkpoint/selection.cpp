#include "selection.hpp"

#include "hdf5_handles.hpp"

#include <algorithm>
#include <fcntl.h>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <string>

namespace lather::checkpoint::Impl {

std::vector<hsize_t> stored_dims(const TensorShape& shape) {
  if (shape.empty()) return {1};
  return std::vector<hsize_t>(shape.begin(), shape.end());
}

void select(hid_t space, const ArraySlice& a) {
  const auto dims = stored_dims(a.shape);
  const std::size_t rank = dims.size();
  check(H5Sselect_none(space), "selecting nothing");
  switch (a.selection) {
    case ArraySlice::Selection::whole:
      check(H5Sselect_all(space), "selecting " + a.path);
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
  LATHER_REQUIRE(!a.path.empty() && a.path.front() != '/', "checkpoint array path must be relative, got '", a.path,
                 "'");
  if (a.selection == ArraySlice::Selection::rows) {
    LATHER_REQUIRE(!a.shape.empty(), "checkpoint array '", a.path, "': rows selected from a 0-D array");
    for (auto r : a.rows)
      LATHER_REQUIRE(r >= 0 && r < a.shape[0], "checkpoint array '", a.path, "': row ", r, " outside [0, ", a.shape[0],
                     ")");
    auto sorted = a.rows;
    std::sort(sorted.begin(), sorted.end());
    LATHER_REQUIRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "checkpoint array '", a.path,
                   "': a row is listed twice");
  }
  if (a.selection == ArraySlice::Selection::block) {
    LATHER_REQUIRE(a.offset.size() == a.shape.size() && a.count.size() == a.shape.size(), "checkpoint array '", a.path,
                   "': block offset/count must have one entry per dimension");
    for (std::size_t d = 0; d < a.shape.size(); ++d)
      LATHER_REQUIRE(a.offset[d] >= 0 && a.count[d] >= 0 && a.offset[d] + a.count[d] <= a.shape[d],
                     "checkpoint array '", a.path, "': block [", a.offset[d], ", ", a.offset[d] + a.count[d],
                     ") outside dimension ", d, " of extent ", a.shape[d]);
  }
  LATHER_REQUIRE(a.elements() == 0 || a.data != nullptr, "checkpoint array '", a.path, "' has no buffer");
}

hid_t memory_space_for(const ArraySlice& a, hssize_t selected) {
  std::vector<hsize_t> dims;
  switch (a.selection) {
    case ArraySlice::Selection::whole:
      dims = stored_dims(a.shape);
      break;
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
  if (selected <= 0 ||
      hsize_t(selected) != std::accumulate(dims.begin(), dims.end(), hsize_t(1), std::multiplies<>())) {
    const hsize_t count = hsize_t(std::max<hssize_t>(selected, 1));
    return H5Screate_simple(1, &count, nullptr);
  }
  return H5Screate_simple(int(dims.size()), dims.data(), nullptr);
}

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

std::vector<std::size_t> row_order(const ArraySlice& a) {
  std::vector<std::size_t> order(a.rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return a.rows[x] < a.rows[y]; });
  return order;
}

bool rows_sorted(const ArraySlice& a) {
  return a.selection != ArraySlice::Selection::rows || std::is_sorted(a.rows.begin(), a.rows.end());
}

void permute_rows(const ArraySlice& a, const std::vector<std::size_t>& order, const char* from, char* to,
                  bool to_sorted) {
  const std::size_t bytes = row_bytes(a);
  for (std::size_t k = 0; k < order.size(); ++k) {
    if (to_sorted)
      std::memcpy(to + k * bytes, from + order[k] * bytes, bytes);
    else
      std::memcpy(to + order[k] * bytes, from + k * bytes, bytes);
  }
}

bool read_rows(hid_t dataset, hid_t type, hid_t dxpl, const std::vector<hsize_t>& dims, std::int64_t first,
               std::int64_t count, void* into) {
  std::vector<hsize_t> start(dims.size(), 0), extent = dims;
  start[0] = hsize_t(first);
  extent[0] = hsize_t(count);
  Dataspace space(H5Dget_space(dataset));
  Dataspace memory(H5Screate_simple(int(extent.size()), extent.data(), nullptr));
  return space.valid() && memory.valid() &&
         H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr) >= 0 &&
         H5Dread(dataset, type, memory.get(), space.get(), dxpl, into) >= 0;
}

void read_ahead(hid_t dataset, std::int64_t first, std::int64_t count, std::size_t row_bytes) {
  const haddr_t at = H5Dget_offset(dataset);
  if (at == HADDR_UNDEF || count <= 0) return;
  const hid_t file = H5Iget_file_id(dataset);
  if (file < 0) return;
  const hid_t access = H5Fget_access_plist(file);
  const bool posix = access >= 0 && H5Pget_driver(access) == H5FD_SEC2;
  if (access >= 0) H5Pclose(access);
  void* handle = nullptr;
  if (posix && H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) >= 0 && handle)
    (void)::posix_fadvise(*static_cast<int*>(handle), off_t(at) + off_t(first) * off_t(row_bytes),
                          off_t(count) * off_t(row_bytes), POSIX_FADV_WILLNEED);
  H5Fclose(file);
}

void read_rows_in_pieces(hid_t dataset, hid_t type, hid_t dxpl, const std::vector<hsize_t>& dims, std::int64_t first,
                         std::int64_t count, std::size_t row_bytes, char* into, const std::string& where, bool overlap,
                         const std::function<void(std::int64_t, std::int64_t, const char*)>& piece) {
  read_ahead(dataset, first, count, row_bytes);
  // Overlapped: a second thread checks piece k while piece k + 1 is read, and the checksums cost
  // no read time where a core is free. Without a free core that thread only competes with the
  // ranks (and two ranks' 8 MiB pieces in flight crowd a shared L3): 1 MiB pieces summed in line
  // read faster where the ranks fill the cores (docs/reference/benchmarks.md). One piece at a time
  // is handed over, so `piece` is never called concurrently with itself; it makes no HDF5 call.
  const std::size_t piece_bytes = std::size_t(overlap ? 8 : 1) << 20;
  const std::int64_t per_piece =
      std::max<std::int64_t>(1, std::int64_t(piece_bytes / std::max<std::size_t>(row_bytes, 1)));
  std::future<void> checking;
  for (std::int64_t at = 0; at < count; at += per_piece) {
    const std::int64_t rows = std::min(per_piece, count - at);
    char* bytes = into + std::size_t(at) * row_bytes;
    if (!read_rows(dataset, type, dxpl, dims, first + at, rows, bytes))
      LATHER_FAIL(where, ": read failed (corrupted or truncated?): ", hdf5_error_reason());
    if (!overlap) {
      piece(first + at, rows, bytes);
      continue;
    }
    if (checking.valid()) checking.get();
    checking = std::async(std::launch::async, [&piece, first, at, rows, bytes] { piece(first + at, rows, bytes); });
  }
  if (checking.valid()) checking.get();
}

std::size_t row_bytes(const ArraySlice& a) {
  std::size_t bytes = ::lather::size_of(a.dtype);
  for (std::size_t d = 1; d < a.shape.size(); ++d) bytes *= std::size_t(a.shape[d]);
  return bytes;
}

}  // namespace lather::checkpoint::Impl
