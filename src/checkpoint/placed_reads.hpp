#pragma once
// How a load reads ranges of datasets' rows straight from the disk: the mirror of
// placed_writes.hpp. A helper thread reads the queued ranges' whole 4 KiB pages with O_DIRECT into
// the caller's buffers, in 8 MiB requests, one range after the other, while the calling thread
// goes on: it reads what is not queued through HDF5, then checks each queued piece as soon as its
// bytes are in. The bytes make no stop in the page cache, so a load neither copies them out of it
// nor has the kernel allocate cache pages for them: on a VM whose unused memory goes back to the
// host, a first load through the cache reads several times slower than O_DIRECT into the
// caller's memory (docs/reference/benchmarks.md).
//
// HDF5 reads, through the cache, what this does not take: small or unaligned ranges, stored types
// that need converting, files in a layout other than plain bytes, ranges the cache holds already
// (a checkpoint just read by `lather-checkpoint verify`), and file systems that refuse O_DIRECT.

#include <hdf5.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace lather::checkpoint::Impl {

class PlacedReader {
 public:
  /// `file` is the file the datasets passed to add() are in.
  explicit PlacedReader(std::string file);
  /// Stops the helper thread after its current request: ranges not finished are left unread.
  ~PlacedReader();
  PlacedReader(const PlacedReader&) = delete;
  PlacedReader& operator=(const PlacedReader&) = delete;

  /// Queues rows [first, first + count) (of `row_bytes` each) of the open dataset `dataset` for
  /// reading into `into`, which must stay valid until finish() or the destructor. Queued only
  /// where the bytes can be read as they lie and the cache does not hold them: a contiguous
  /// dataset stored as `type`, in a file opened with HDF5's POSIX driver and without a user
  /// block, at least one request (8 MiB) of whole pages, `into` on the same offset within a page
  /// as the range in the file, the range's first and last pages not cached, and a file system
  /// that takes O_DIRECT. Returns the range's number, or -1, having read nothing, where not.
  /// Throws "<where>: read failed (corrupted or truncated?): ..." when a read of the range's
  /// partial pages at either end (done here, through the cache) fails.
  int add(hid_t dataset, hid_t type, std::int64_t first, std::int64_t count, std::size_t row_bytes, char* into,
          const std::string& where);
  /// Calls `piece(first row, rows, bytes)` for consecutive pieces of whole rows of range `range`
  /// as their bytes arrive (on the calling thread, in order). Throws "<where>: read failed
  /// (corrupted or truncated?): ..." on a failed or short read, or what `piece` threw.
  void finish(int range, const std::function<void(std::int64_t, std::int64_t, const char*)>& piece);
  /// Bytes queued so far.
  std::int64_t queued_bytes() const { return m_queued_bytes; }

 private:
  struct Range {
    char* into;
    std::int64_t begin, first_page, last_page;  // file offsets: the range, its whole pages
    std::int64_t first_row, rows, row_bytes;
    std::string where;
    std::int64_t arrived;  // file offset up to which the whole pages are in
    std::string error;
  };

  /// Starts the helper thread where none runs; false when the system gives none.
  bool helper_running();
  void read_queued();  // the helper thread
  /// Reads range `r`'s whole pages from `from` on, publishing each request's arrival.
  void read_range(Range& r, std::int64_t from, bool helper);

  std::string m_file;
  int m_fd = -1, m_direct_fd = -1;
  bool m_direct_refused = false;
  bool m_direct_taken = false;  // a direct read succeeded: the file takes O_DIRECT
  std::int64_t m_queued_bytes = 0;

  std::thread m_thread;
  bool m_no_thread = false;  // the system gave none: finish() reads
  std::mutex m_mutex;
  std::condition_variable m_changed;
  std::deque<Range> m_ranges;  // a deque: the helper thread's reference survives add()
  std::size_t m_next = 0;      // the first range the helper thread has not started
  bool m_stopping = false;
};

}  // namespace lather::checkpoint::Impl
