#include "stored_checksums.hpp"

#include "attributes.hpp"
#include "selection.hpp"

#include <algorithm>

namespace lather::checkpoint::Impl {

namespace {

std::vector<std::int64_t> as_int64(const std::vector<hsize_t>& dims) { return {dims.begin(), dims.end()}; }

/// A whole or block selection as (offset, count) per stored dimension.
void block_of(const ArraySlice& a, std::vector<std::int64_t>& offset, std::vector<std::int64_t>& count) {
  const auto dims = as_int64(stored_dims(a.shape));
  if (a.selection == ArraySlice::Selection::whole || a.shape.empty()) {
    offset.assign(dims.size(), 0);
    count = dims;  // a scalar's block is the scalar, as select() takes it
    return;
  }
  offset = a.offset;
  count = a.count;
}

constexpr std::int64_t kind_block = 1, kind_rows = 2, kind_whole = 3;

}  // namespace

ChunkGrid grid_of(const ArraySlice& a, std::size_t chunk_bytes) {
  return ChunkGrid::of(as_int64(stored_dims(a.shape)), ::lather::size_of(a.dtype), chunk_bytes);
}

void add_block_rows(const ChunkGrid& grid, const ArraySlice& a, const void* data, std::int64_t first_row,
                    std::int64_t rows, std::vector<ChunkSum>& sums) {
  if (rows <= 0) return;
  std::vector<std::int64_t> offset, count;
  block_of(a, offset, count);
  const auto dims = as_int64(stored_dims(a.shape));
  const std::size_t rank = dims.size();
  std::int64_t block_row = 1;  // elements of one row of the block
  bool full_rows = true;
  for (std::size_t d = 1; d < rank; ++d) {
    block_row *= count[d];
    full_rows = full_rows && count[d] == dims[d];
  }
  const auto* bytes = static_cast<const unsigned char*>(data) + std::size_t(first_row * block_row) * grid.element_bytes;
  if (full_rows) {  // the rows are one run of the file
    add_to_chunk_sums(grid, (offset[0] + first_row) * grid.row_elements, rows * grid.row_elements, bytes, sums);
    return;
  }
  // Lines along the last dimension, in the block's row-major order.
  const std::int64_t line = count[rank - 1];
  if (line == 0) return;
  std::vector<std::int64_t> stride(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) stride[d] = stride[d + 1] * dims[d + 1];
  std::vector<std::int64_t> index(rank, 0);
  for (std::int64_t r = first_row; r < first_row + rows; ++r) {
    std::fill(index.begin(), index.end(), 0);
    index[0] = r;
    for (std::int64_t l = 0, lines = block_row / line; l < lines; ++l) {
      std::int64_t first = 0;
      for (std::size_t d = 0; d < rank; ++d) first += (offset[d] + index[d]) * stride[d];
      add_to_chunk_sums(grid, first, line, bytes, sums);
      bytes += std::size_t(line) * grid.element_bytes;
      for (std::size_t d = rank - 1; d-- > 1;) {  // next line: odometer over dimensions 1 .. rank-2
        if (++index[d] < count[d]) break;
        index[d] = 0;
      }
    }
  }
}

void write_checksums(hid_t file, hid_t lcpl, const ArraySlice& a, const ChunkGrid& grid,
                     const std::vector<ChunkSum>& sums) {
  const std::string path = checksum_path(a.path);
  const std::string where = "checksums of dataset '" + a.path + "'";
  const hsize_t dims[2] = {hsize_t(grid.chunks()), 2};
  Dataspace space(check(H5Screate_simple(2, dims, nullptr), where));
  Dataset dataset(check(H5Dcreate2(file, path.c_str(), H5T_NATIVE_UINT64, space.get(), lcpl, H5P_DEFAULT, H5P_DEFAULT),
                        where + ": create"));
  write_integer_attribute(dataset.get(), "rows_per_chunk", grid.rows_per_chunk);
  static_assert(sizeof(ChunkSum) == 2 * sizeof(std::uint64_t), "ChunkSum is stored as two uint64");
  check(H5Dwrite(dataset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, sums.data()), where + ": write");
}

StoredChecksums read_checksums(hid_t file, const std::string& path, const std::vector<hsize_t>& dims,
                               std::size_t element_bytes) {
  const std::string where = "dataset '" + path + "'";
  const std::string stored_path = checksum_path(path);
  if (H5Lexists(file, checksum_group, H5P_DEFAULT) <= 0 || H5Lexists(file, stored_path.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    LATHER_FAIL(where, " has no checksums ('", stored_path, "' is missing)");
  }
  Dataset dataset(H5Dopen2(file, stored_path.c_str(), H5P_DEFAULT));
  if (!dataset.valid()) LATHER_FAIL(where, ": its checksums cannot be opened: ", hdf5_error_reason());
  std::int64_t rows_per_chunk = 0;
  {
    Attribute attribute(H5Aopen(dataset.get(), "rows_per_chunk", H5P_DEFAULT));
    if (!attribute.valid() || H5Aread(attribute.get(), H5T_NATIVE_INT64, &rows_per_chunk) < 0)
      LATHER_FAIL(where, ": its checksums have no attribute rows_per_chunk");
  }
  const std::int64_t rows = dims.empty() ? 1 : std::int64_t(dims[0]);
  if (rows_per_chunk < 1 || rows_per_chunk > std::max<std::int64_t>(rows, 1))
    LATHER_FAIL(where, ": its checksums claim ", rows_per_chunk, " rows per chunk for ", rows, " rows");
  StoredChecksums stored;
  std::vector<std::int64_t> shape = as_int64(dims);
  if (shape.empty()) shape = {1};
  stored.grid = ChunkGrid::of(shape, element_bytes, 1);
  stored.grid.rows_per_chunk = rows_per_chunk;
  Dataspace space(H5Dget_space(dataset.get()));
  hsize_t stored_dims[2] = {0, 0};
  if (!space.valid() || H5Sget_simple_extent_ndims(space.get()) != 2 ||
      H5Sget_simple_extent_dims(space.get(), stored_dims, nullptr) < 0 ||
      stored_dims[0] != hsize_t(stored.grid.chunks()) || stored_dims[1] != 2)
    LATHER_FAIL(where, ": its checksums do not have the shape [", stored.grid.chunks(), ", 2]");
  stored.sums.resize(std::size_t(stored.grid.chunks()));
  if (H5Dread(dataset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.sums.data()) < 0)
    LATHER_FAIL(where, ": its checksums cannot be read: ", hdf5_error_reason());
  return stored;
}

std::string checksum_failure(const std::string& path, const ChunkGrid& grid, std::int64_t chunk) {
  return "dataset '" + path + "' fails its checksum in rows [" + std::to_string(grid.first_row(chunk)) + ", " +
         std::to_string(grid.first_row(chunk + 1)) + ") (chunk " + std::to_string(chunk) + " of " +
         std::to_string(grid.chunks()) + ")";
}

std::string read_and_check_rows(hid_t dataset, hid_t type, hid_t dxpl, const std::string& path,
                                const StoredChecksums& stored, std::int64_t first_chunk, std::int64_t chunks,
                                std::vector<unsigned char>& buffer) {
  const ChunkGrid& grid = stored.grid;
  const std::int64_t first = grid.first_row(first_chunk), last = grid.first_row(first_chunk + chunks);
  if (last <= first) return {};
  Dataspace space(H5Dget_space(dataset));
  if (!space.valid()) return "dataset '" + path + "': " + hdf5_error_reason();
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(std::size_t(std::max(rank, 0)), 0);
  if (rank <= 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
    return "dataset '" + path + "' has an unreadable shape";
  buffer.resize(std::size_t((last - first) * grid.row_elements) * grid.element_bytes);
  if (!read_rows(dataset, type, dxpl, dims, first, last - first, buffer.data()))
    return "dataset '" + path + "' cannot be read (rows " + std::to_string(first) + " to " + std::to_string(last) +
           "): " + hdf5_error_reason();
  for (std::int64_t c = first_chunk; c < first_chunk + chunks; ++c) {
    const std::int64_t row = grid.first_row(c), rows = grid.first_row(c + 1) - row;
    const ChunkSum sum =
        sum_elements(buffer.data() + std::size_t((row - first) * grid.row_elements) * grid.element_bytes,
                     grid.element_bytes, row * grid.row_elements, rows * grid.row_elements);
    if (sum != stored.sums[std::size_t(c)]) return checksum_failure(path, grid, c);
  }
  return {};
}

// ---- the ranks' shares ---------------------------------------------------------------------------

SelectionChecksums::SelectionChecksums(const comm::Group& group, const std::vector<ArraySlice>& arrays, Use use)
    : m_group(group),
      m_arrays(arrays),
      m_grid_set(arrays.size(), 0),
      m_stored(arrays.size()),
      m_sums(arrays.size()),
      m_share(arrays.size(), {0, 0}),
      m_whole_everywhere(arrays.size(), 0),
      m_coverage(arrays.size()),
      m_blocks(arrays.size()) {
  // Every rank's selection of every array: kind, then (offset, count) per stored dimension, all
  // counts 0 where the rank transfers nothing. The lists agree in length because the ranks agreed
  // on the arrays' shapes. A whole array is written by its writer only; a block by every rank
  // that selects it (select()).
  std::vector<std::int64_t> mine;
  std::vector<std::size_t> at(arrays.size() + 1, 0);
  for (std::size_t k = 0; k < arrays.size(); ++k) {
    const auto& a = arrays[k];
    std::vector<std::int64_t> offset, count;
    const std::size_t rank = stored_dims(a.shape).size();
    const bool silent = a.selection == ArraySlice::Selection::rows ||
                        (use == Use::saving && a.selection == ArraySlice::Selection::whole && !a.writer);
    if (silent)
      offset.assign(rank, 0), count.assign(rank, 0);
    else
      block_of(a, offset, count);
    mine.push_back(a.selection == ArraySlice::Selection::rows    ? kind_rows
                   : a.selection == ArraySlice::Selection::whole ? kind_whole
                                                                 : kind_block);
    mine.insert(mine.end(), offset.begin(), offset.end());
    mine.insert(mine.end(), count.begin(), count.end());
    at[k + 1] = mine.size();
  }
  const int size = group.size(), me = group.rank();
  std::vector<std::int64_t> all(mine.size() * std::size_t(size));
  if (size == 1)
    all = mine;
  else if (std::any_of(arrays.begin(), arrays.end(),
                       [](const ArraySlice& a) { return a.selection != ArraySlice::Selection::rows; }))
    group.allgather(mine.data(), mine.size(), all.data());
  for (std::size_t k = 0; k < arrays.size(); ++k) {
    if (arrays[k].selection == ArraySlice::Selection::rows) continue;
    const std::size_t width = at[k + 1] - at[k], rank = (width - 1) / 2;
    auto block = [&](int r) {
      const auto* p = all.data() + std::size_t(r) * mine.size() + at[k];
      return std::vector<std::int64_t>(p + 1, p + width);
    };
    auto counts = [&](int r) {
      const auto* p = all.data() + std::size_t(r) * mine.size() + at[k];
      return p[0] != kind_rows && std::none_of(p + 1 + rank, p + width, [](std::int64_t c) { return c == 0; });
    };
    // The first rank of each distinct block keeps it for the coverage; the ranks selecting the
    // same block split its rows between them, in rank order.
    std::vector<int> same;
    const auto own = block(me);
    for (int r = 0; r < size; ++r) {
      if (!counts(r)) continue;
      const auto other = block(r);
      if (counts(me) && other == own) same.push_back(r);
      if (std::find(m_blocks[k].begin(), m_blocks[k].end(), other) == m_blocks[k].end()) m_blocks[k].push_back(other);
    }
    if (same.empty()) continue;
    const std::int64_t member = std::find(same.begin(), same.end(), me) - same.begin(),
                       members = std::int64_t(same.size());
    m_share[k] = row_share(own[rank], member, members);
    bool whole_everywhere = int(same.size()) == size;
    for (int r = 0; r < size; ++r)
      whole_everywhere = whole_everywhere && all[std::size_t(r) * mine.size() + at[k]] == kind_whole;
    m_whole_everywhere[k] = whole_everywhere;
  }
}

void SelectionChecksums::set_coverage(std::size_t k) {
  const auto& a = m_arrays[k];
  const ChunkGrid& grid = m_stored[k].grid;
  auto& coverage = m_coverage[k];
  if (a.selection == ArraySlice::Selection::rows) {
    coverage.assign(std::size_t(grid.chunks()), 1);  // contiguous ranges covering every row (or the writers' rows)
    return;
  }
  coverage.assign(std::size_t(grid.chunks()), 0);
  const auto& blocks = m_blocks[k];
  const std::size_t rank = blocks.empty() ? 0 : blocks[0].size() / 2;
  auto overlaps = [&](const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& y) {
    for (std::size_t d = 0; d < rank; ++d)
      if (x[d] + x[rank + d] <= y[d] || y[d] + y[rank + d] <= x[d]) return false;
    return true;
  };
  bool disjoint = true;
  for (std::size_t i = 0; i < blocks.size() && disjoint; ++i)
    for (std::size_t j = i + 1; j < blocks.size() && disjoint; ++j) disjoint = !overlaps(blocks[i], blocks[j]);
  for (std::int64_t c = 0; c < grid.chunks(); ++c) {
    const std::int64_t r0 = grid.first_row(c), r1 = grid.first_row(c + 1);
    std::int64_t covered = 0;
    for (const auto& b : blocks) {
      std::int64_t n = std::max<std::int64_t>(0, std::min(r1, b[0] + b[rank]) - std::max(r0, b[0]));
      for (std::size_t d = 1; d < rank; ++d) n *= b[rank + d];
      covered += n;
    }
    if (covered > 0) coverage[std::size_t(c)] = disjoint && covered == (r1 - r0) * grid.row_elements ? 1 : 2;
  }
}

void SelectionChecksums::set_grid(std::size_t k, const ChunkGrid& grid) {
  m_stored[k].grid = grid;
  m_sums[k].assign(std::size_t(grid.chunks()), ChunkSum{});
  m_grid_set[k] = 1;
  set_coverage(k);
}

void SelectionChecksums::set_stored(std::size_t k, StoredChecksums stored) {
  m_stored[k] = std::move(stored);
  m_sums[k].assign(m_stored[k].sums.size(), ChunkSum{});
  m_grid_set[k] = 1;
  set_coverage(k);
}

void SelectionChecksums::add_elements(std::size_t k, std::int64_t first, std::int64_t count, const void* data) {
  if (has_grid(k)) add_to_chunk_sums(m_stored[k].grid, first, count, data, m_sums[k]);
}

void SelectionChecksums::add_whole_rows(std::size_t k, std::int64_t first_row, std::int64_t rows, const void* data) {
  if (!has_grid(k)) return;
  const auto& grid = m_stored[k].grid;
  const std::int64_t from = std::max(first_row, m_share[k].first);
  const std::int64_t to = std::min(first_row + rows, m_share[k].first + m_share[k].second);
  if (to <= from) return;
  add_to_chunk_sums(grid, from * grid.row_elements, (to - from) * grid.row_elements,
                    static_cast<const unsigned char*>(data) +
                        std::size_t((from - first_row) * grid.row_elements) * grid.element_bytes,
                    m_sums[k]);
}

void SelectionChecksums::add_selection(std::size_t k, const void* data) {
  if (has_grid(k)) add_block_rows(m_stored[k].grid, m_arrays[k], data, m_share[k].first, m_share[k].second, m_sums[k]);
}

void SelectionChecksums::finish() {
  // One allreduce of every array's sums, once the ranks agree on its length (they differ only
  // after a failure on some rank, which every rank learns about next).
  std::size_t total = 0;
  for (const auto& s : m_sums) total += s.size();
  std::uint64_t extremes[2] = {total, ~std::uint64_t(total)};  // the smallest and the largest at once
  m_group.allreduce(extremes, 2, comm::Combine::min);
  if (extremes[0] != ~extremes[1]) {
    for (auto& s : m_sums) s.clear();
    return;
  }
  if (total == 0) return;
  std::vector<std::uint64_t> flat;
  flat.reserve(2 * total);
  for (const auto& s : m_sums)
    for (const auto& c : s) flat.push_back(c.plain), flat.push_back(c.mixed);
  m_group.allreduce(flat, comm::Combine::sum);
  std::size_t i = 0;
  for (auto& s : m_sums)
    for (auto& c : s) c.plain = flat[i++], c.mixed = flat[i++];
}

const std::vector<ChunkSum>& SelectionChecksums::saved_sums(std::size_t k) const {
  const auto& a = m_arrays[k];
  LATHER_REQUIRE(m_sums[k].size() == std::size_t(m_stored[k].grid.chunks()), "checkpoint array '", a.path,
                 "': the ranks could not agree on its checksums");
  for (std::size_t c = 0; c < m_coverage[k].size(); ++c)
    LATHER_REQUIRE(m_coverage[k][c] == 1, "checkpoint array '", a.path, "': the ranks' blocks ",
                   m_coverage[k][c] == 0 ? "leave rows unwritten" : "overlap without being equal", " (rows ",
                   m_stored[k].grid.first_row(std::int64_t(c)), " to ", m_stored[k].grid.first_row(std::int64_t(c) + 1),
                   ")");
  return m_sums[k];
}

std::string SelectionChecksums::compare(hid_t file, hid_t dxpl) const {
  std::vector<unsigned char> buffer;
  for (std::size_t k = 0; k < m_arrays.size(); ++k) {
    if (!has_grid(k)) continue;
    const auto& stored = m_stored[k];
    if (m_sums[k].size() != stored.sums.size())
      return "the ranks could not agree on the checksums of '" + m_arrays[k].path + "'";
    for (std::int64_t c = 0; c < stored.grid.chunks(); ++c) {
      const char coverage = m_coverage[k][std::size_t(c)];
      if (coverage == 1 && m_sums[k][std::size_t(c)] != stored.sums[std::size_t(c)])
        return checksum_failure(m_arrays[k].path, stored.grid, c);
      if (coverage == 2 && c % m_group.size() == m_group.rank()) {
        Dataset dataset(H5Dopen2(file, m_arrays[k].path.c_str(), H5P_DEFAULT));
        if (!dataset.valid()) return "dataset '" + m_arrays[k].path + "' cannot be opened: " + hdf5_error_reason();
        const std::string error = read_and_check_rows(dataset.get(), native_type(m_arrays[k].dtype), dxpl,
                                                      m_arrays[k].path, stored, c, 1, buffer);
        if (!error.empty()) return error;
      }
    }
  }
  return {};
}

}  // namespace lather::checkpoint::Impl
