#include "row_exchange.hpp"

#include "selection.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace lather::checkpoint::Impl {

namespace {

/// The rank whose range holds row r (the inverse of first_row).
int row_owner(std::int64_t r, std::int64_t n, int size) {
  int k = int(((r + 1) * size - 1) / n);  // first guess, then settle on the exact range
  while (k > 0 && first_row(k, n, size) > r) --k;
  while (k + 1 < size && first_row(k + 1, n, size) <= r) ++k;
  return k;
}

/// How many units every rank sends this rank, given how many it sends every rank (one alltoall).
std::vector<std::size_t> exchange_counts(const comm::Group& group, const std::vector<std::size_t>& sending) {
  std::vector<std::uint64_t> out(sending.begin(), sending.end()), in(sending.size());
  group.alltoall(out.data(), 1, in.data());
  return std::vector<std::size_t>(in.begin(), in.end());
}

std::size_t total(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t(0));
}

}  // namespace

std::pair<std::vector<std::int64_t>, PageAlignedVector<char>> gather_contiguous_rows(const comm::Group& group,
                                                                                     const ArraySlice& a,
                                                                                     const char* data) {
  const int size = group.size();
  const std::int64_t n = a.shape[0];
  const std::size_t bytes_per_row = row_bytes(a);
  std::vector<std::size_t> send_rows(size, 0);
  // `data` holds the rows in ascending order (the caller sorts them), whatever the order of a.rows.
  std::vector<std::int64_t> mine = a.writer ? a.rows : std::vector<std::int64_t>{};
  std::sort(mine.begin(), mine.end());
  for (auto r : mine) ++send_rows[row_owner(r, n, size)];
  const auto receive_rows = exchange_counts(group, send_rows);
  // Rows are sorted, so rows for each target are consecutive in `data`: they are sent in place.
  std::vector<std::int64_t> rows(total(receive_rows));
  group.alltoallv(mine.data(), send_rows, rows.data(), receive_rows, sizeof(std::int64_t));
  PageAlignedVector<char> bytes(rows.size() * bytes_per_row);
  group.alltoallv(data, send_rows, bytes.data(), receive_rows, bytes_per_row);
  if (std::is_sorted(rows.begin(), rows.end())) return {std::move(rows), std::move(bytes)};
  // From different senders the rows interleave: sort them with their bytes.
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return rows[x] < rows[y]; });
  std::vector<std::int64_t> sorted_rows(rows.size());
  PageAlignedVector<char> sorted_bytes(bytes.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    sorted_rows[k] = rows[order[k]];
    std::memcpy(sorted_bytes.data() + k * bytes_per_row, bytes.data() + order[k] * bytes_per_row, bytes_per_row);
  }
  return {std::move(sorted_rows), std::move(sorted_bytes)};
}

bool rows_in_place(const comm::Group& group, const ArraySlice& a, bool writing) {
  const int size = group.size(), rank = group.rank();
  const std::int64_t n = a.shape[0], first = first_row(rank, n, size), last = first_row(rank + 1, n, size);
  const std::vector<std::int64_t> empty;
  const auto& mine = writing && !a.writer ? empty : a.rows;
  int here = std::int64_t(mine.size()) == last - first ? 1 : 0;
  for (std::size_t k = 0; here && k < mine.size(); ++k) here = mine[k] == first + std::int64_t(k);
  return group.allreduce(here, comm::Combine::min) == 1;
}

void scatter_contiguous_rows(const comm::Group& group, const ArraySlice& a, const char* range, std::int64_t range_first,
                             char* out) {
  const int size = group.size();
  const std::int64_t n = a.shape[0];
  const std::size_t bytes_per_row = row_bytes(a);
  std::vector<std::int64_t> wanted = a.rows;
  std::sort(wanted.begin(), wanted.end());
  std::vector<std::size_t> ask(size, 0);
  for (auto r : wanted) ++ask[row_owner(r, n, size)];
  const auto asked = exchange_counts(group, ask);
  std::vector<std::int64_t> requests(total(asked));
  group.alltoallv(wanted.data(), ask, requests.data(), asked, sizeof(std::int64_t));
  std::vector<char> answers(requests.size() * bytes_per_row);
  for (std::size_t k = 0; k < requests.size(); ++k)
    std::memcpy(answers.data() + k * bytes_per_row, range + std::size_t(requests[k] - range_first) * bytes_per_row,
                bytes_per_row);
  group.alltoallv(answers.data(), asked, out, ask, bytes_per_row);
}

}  // namespace lather::checkpoint::Impl
