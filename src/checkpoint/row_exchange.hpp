#pragma once
// Rows of an array selected by rows (Shampoo's statistics, owned by scattered ranks) travel to
// the rank that writes, or has read, a contiguous range of them: rank k of P handles rows
// [k N / P, (k + 1) N / P), so every rank reads or writes at most one run of the file.

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/checkpoint/page_aligned.hpp>
#include <lather/comm/group.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace lather::checkpoint::Impl {

/// Rank k of `size` handles rows [first_row(k), first_row(k + 1)) of `n`.
inline std::int64_t first_row(std::int64_t k, std::int64_t n, int size) { return (k * n) / size; }

/// Before writing: this rank's rows (`data` holds them in ascending row order, whatever the order of
/// a.rows; none unless a.writer) move to the ranks that write their ranges. Returns the rows this rank
/// writes (sorted) and their bytes.
/// The bytes are page-aligned, so that their whole pages go to the disk without a copy.
std::pair<std::vector<std::int64_t>, PageAlignedVector<char>> gather_contiguous_rows(const comm::Group& group,
                                                                                     const ArraySlice& a,
                                                                                     const char* data);
/// Whether every rank's rows (for writing: only a writer's) are exactly its range, in order -- the
/// layout of a restart on the same rank count -- so that rows go straight between the caller's
/// buffer and the file. One small allreduce.
bool rows_in_place(const comm::Group& group, const ArraySlice& a, bool writing);
/// After reading: rank k has read its range into `range` (`range_first` = first_row(k)); every
/// rank receives the rows it asked for, sorted, into `out`.
void scatter_contiguous_rows(const comm::Group& group, const ArraySlice& a, const char* range, std::int64_t range_first,
                             char* out);

}  // namespace lather::checkpoint::Impl
