#pragma once
// Where a format-2 checkpoint keeps its per-chunk checksums (checksum.hpp) and how the ranks fill
// and check them: beside each non-empty array `<path>` a dataset `_checksums/<path>` of uint64
// [chunks, 2] (plain, mixed per chunk) with the attribute `rows_per_chunk`.
//
// Saving, each rank adds the terms of its share of what it writes and one allreduce sums them.
// Loading, each rank adds the terms of its share of what it reads, one allreduce sums them, and
// every chunk read whole by the ranks together is compared; a chunk only partly read is read whole
// again by one rank and compared there.

#include "checksum.hpp"
#include "hdf5_handles.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/group.hpp>

#include <string>
#include <vector>

namespace lather::checkpoint::Impl {

/// The group holding the checksum datasets.
inline constexpr const char* checksum_group = "_checksums";
inline std::string checksum_path(const std::string& array_path) {
  return std::string(checksum_group) + "/" + array_path;
}

/// The chunk grid of an array as saved with `chunk_bytes`.
ChunkGrid grid_of(const ArraySlice& a, std::size_t chunk_bytes);

/// Adds the terms of this rank's part of a whole or block selection, `data` holding it in the
/// selection's row-major order; only rows [first_row, first_row + rows) of the block (counted
/// from the block's first row) are added.
void add_block_rows(const ChunkGrid& grid, const ArraySlice& a, const void* data, std::int64_t first_row,
                    std::int64_t rows, std::vector<ChunkSum>& sums);

/// Creates `_checksums/<a.path>` in a file open on this process alone and writes `sums`.
void write_checksums(hid_t file, hid_t lcpl, const ArraySlice& a, const ChunkGrid& grid,
                     const std::vector<ChunkSum>& sums);

/// The checksums stored for dataset `path` of dimensions `dims` (elements of `element_bytes`),
/// validated against them before anything is allocated: the grid and one sum per chunk. Throws
/// naming the dataset when they are missing or malformed.
struct StoredChecksums {
  ChunkGrid grid;
  std::vector<ChunkSum> sums;
};
StoredChecksums read_checksums(hid_t file, const std::string& path, const std::vector<hsize_t>& dims,
                               std::size_t element_bytes);

/// "dataset '<path>' fails its checksum in rows [a, b) (chunk c)".
std::string checksum_failure(const std::string& path, const ChunkGrid& grid, std::int64_t chunk);

/// Reads rows [first, first + count) of an open dataset into `buffer` (independent transfer on
/// `dxpl`, or H5P_DEFAULT) and returns the sums of each whole chunk among them; "" or the reason.
std::string read_and_check_rows(hid_t dataset, hid_t type, hid_t dxpl, const std::string& path,
                                const StoredChecksums& stored, std::int64_t first_chunk, std::int64_t chunks,
                                std::vector<unsigned char>& buffer);

/// Rows [first, first + count) of `rows` that member `member` of `members` takes: consecutive
/// shares in member order, their sizes differing by at most one row.
inline std::pair<std::int64_t, std::int64_t> row_share(std::int64_t rows, std::int64_t member, std::int64_t members) {
  return {rows * member / members, rows * (member + 1) / members - rows * member / members};
}

/// The checksum terms of what the ranks of `group` write or read of `arrays`, each element counted
/// once: ranks writing or reading the same block (replicas) split its rows between them, rows
/// are added as written or read. Construct before the transfers (collective when some array is
/// not selected by rows: one allgather of the selections), set each array's grid, add() each
/// rank's data, then finish() (collective: one allreduce).
class SelectionChecksums {
 public:
  enum class Use { saving, loading };
  SelectionChecksums(const comm::Group& group, const std::vector<ArraySlice>& arrays, Use use);
  /// Saving: array k is cut by `grid`, its terms start at zero.
  void set_grid(std::size_t k, const ChunkGrid& grid);
  /// Loading: the stored checksums of array k (after opening the file; arrays left without stay
  /// unchecked).
  void set_stored(std::size_t k, StoredChecksums stored);
  bool has_grid(std::size_t k) const { return m_grid_set[k] != 0; }
  const ChunkGrid& grid(std::size_t k) const { return m_stored[k].grid; }
  /// Adds the terms of elements [first, first + count) of array k, in `data`.
  void add_elements(std::size_t k, std::int64_t first, std::int64_t count, const void* data);
  /// Adds the terms of rows [first_row, first_row + rows) of array k selected whole, in `data`, as
  /// far as they fall in this rank's share.
  void add_whole_rows(std::size_t k, std::int64_t first_row, std::int64_t rows, const void* data);
  /// Adds the terms of this rank's share of array k's whole or block selection, in `data`.
  void add_selection(std::size_t k, const void* data);
  /// This rank's share of array k's whole or block selection: (first row, rows) counted from the
  /// block's first row. Ranks holding the same block (replicas; saving, a whole array's writers)
  /// split its rows in rank order; saving, each writes its share. (0, 0) where the rank has none.
  std::pair<std::int64_t, std::int64_t> share(std::size_t k) const { return m_share[k]; }
  /// Every rank of the group selects array k whole (and it is not empty): the shares then split
  /// its rows over all the ranks in rank order, as row_share(rows, rank, ranks).
  bool whole_on_every_rank(std::size_t k) const { return m_whole_everywhere[k] != 0; }
  /// Collective: sums every rank's terms (every rank calls it, whatever happened before).
  void finish();
  /// Saving, after finish(): the summed terms of array k; throws naming the array when the ranks'
  /// blocks overlap without being equal or leave some of it unwritten.
  const std::vector<ChunkSum>& saved_sums(std::size_t k) const;
  /// Loading, after finish(): "" or the first failure among the chunks read whole by the ranks
  /// together; chunks only partly read are read again from `file` by rank (chunk mod size).
  std::string compare(hid_t file, hid_t dxpl) const;

 private:
  void set_coverage(std::size_t k);

  const comm::Group& m_group;
  const std::vector<ArraySlice>& m_arrays;
  std::vector<char> m_grid_set;
  std::vector<StoredChecksums> m_stored;  ///< the grid, and when loading the stored sums
  std::vector<std::vector<ChunkSum>> m_sums;
  std::vector<std::pair<std::int64_t, std::int64_t>> m_share;    ///< (first block row, rows) this rank adds
  std::vector<char> m_whole_everywhere;                          ///< whole_on_every_rank()
  std::vector<std::vector<char>> m_coverage;                     ///< per chunk: 0 none, 1 exactly once, 2 partly
  std::vector<std::vector<std::vector<std::int64_t>>> m_blocks;  ///< distinct blocks: offsets, then counts
};

}  // namespace lather::checkpoint::Impl
