#pragma once
// Which part of an array a rank reads or writes, in HDF5's terms: dataspace selections for the
// three kinds of ArraySlice, chunk shapes, and the bookkeeping of row selections (runs of
// consecutive rows, rows listed out of file order).

#include <lather/checkpoint/checkpoint.hpp>

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace lather::checkpoint::Impl {

/// Stored dimensions: a 0-D array is stored as [1] (chunked datasets need a rank), marked so.
std::vector<hsize_t> stored_dims(const TensorShape& shape);
/// This rank's selection in the file's dataspace, for reading it.
void select(hid_t space, const ArraySlice& a);
/// Throws, naming the array, when a slice is inconsistent (rows out of range or repeated, ...).
void check_slice(const ArraySlice& a);
/// A memory dataspace shaped like this rank's selection (its rows, or its block), all selected.
hid_t memory_space_for(const ArraySlice& a, hssize_t selected);
/// Runs of consecutive rows in ascending order: (first row, count), over the sorted rows.
std::vector<std::pair<std::int64_t, std::int64_t>> row_runs(const ArraySlice& a);
/// Buffer row k is file row order[k] (HDF5 moves the points of a selection in file order).
std::vector<std::size_t> row_order(const ArraySlice& a);
bool rows_sorted(const ArraySlice& a);
/// Copies rows between the caller's buffer order and file (sorted) order.
void permute_rows(const ArraySlice& a, const std::vector<std::size_t>& order, const char* from, char* to,
                  bool to_sorted);
/// Reads rows [first, first + count) of an open dataset of dimensions `dims` (every other
/// dimension whole) into `into`; false when HDF5 fails (hdf5_error_reason() says why).
bool read_rows(hid_t dataset, hid_t type, hid_t dxpl, const std::vector<hsize_t>& dims, std::int64_t first,
               std::int64_t count, void* into);
/// Asks the kernel to read rows [first, first + count) of a contiguous dataset ahead, all at once
/// (posix_fadvise WILLNEED on the file's descriptor): the pieces read later then find their bytes
/// arriving, instead of each piece's read waiting for its own 1 MiB with the default read-ahead
/// window (with which cold reads from the disk reach about half the raw bandwidth, benchmarks.md).
/// Chunked or filtered datasets, or other drivers, are left alone.
void read_ahead(hid_t dataset, std::int64_t first, std::int64_t count, std::size_t row_bytes);
/// Reads rows [first, first + count) of an open dataset (dimensions `dims`) into `into` in pieces,
/// calling `piece(first row, rows, bytes)` for each while it is still in cache (the checksum
/// terms), through HDF5 and the page cache: with `overlap`, pieces of about 8 MiB, each handed
/// to a second thread while the next is read; without (no core free for that thread), pieces of
/// about 1 MiB, each summed right after its read. Throws "<where>: read failed ..." on a failed
/// read, or what `piece` threw.
void read_rows_in_pieces(hid_t dataset, hid_t type, hid_t dxpl, const std::vector<hsize_t>& dims, std::int64_t first,
                         std::int64_t count, std::size_t row_bytes, char* into, const std::string& where, bool overlap,
                         const std::function<void(std::int64_t, std::int64_t, const char*)>& piece);
/// Bytes of one row of the leading dimension.
std::size_t row_bytes(const ArraySlice& a);

}  // namespace lather::checkpoint::Impl
