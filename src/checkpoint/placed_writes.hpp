#pragma once
// How a save puts the arrays' bytes in the file. Rank 0 alone lays the file out with HDF5 (every
// dataset contiguous, unfiltered and allocated at creation, the root attributes but "complete"),
// closes it and tells every rank where each dataset's bytes begin; then each rank writes its own
// bytes there with plain POSIX writes, in parallel and with no MPI call between them; last, rank 0
// adds the checksums and "complete". HDF5 never sees the data, so the file is exactly what a
// collective HDF5 write makes of the same arrays (h5py and h5dump read it the same way), but none of
// parallel HDF5's collective calls (about 20 per dataset and file on MPICH, each a busy wait of
// milliseconds where ranks outnumber cores) is made, and no MPI-IO layer sits between the ranks
// and the disk.

#include "hdf5_handles.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/checkpoint/page_aligned.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lather::checkpoint::Impl {

/// Rank 0: creates `file` with every array of `arrays` as a contiguous dataset allocated at
/// creation and never filled, and the root attributes but "complete"; returns each dataset's
/// byte offset in the file (-1 for an empty one).
std::vector<std::int64_t> lay_out(const std::string& file, const std::vector<ArraySlice>& arrays,
                                  const Attributes& root_attributes);

/// A file opened for writing at offsets; closes on destruction. Errors are kept, not thrown, so
/// that a rank whose write failed still takes part in the collectives after it.
///
/// Whole pages from page-aligned memory go to the disk on a helper thread, with no copy: the
/// caller goes on (a save computes the checksums of the bytes just handed over) while the disk
/// writes, and queued writes that continue each other in memory and in the file go as one
/// request. So **the bytes of a write must stay unchanged until wait() or flush()**.
class PlacedWriter {
 public:
  /// With `durable`, each plain write also starts its write-back to the disk (Linux), for flush()
  /// to wait for. With `direct`, the whole 4 KiB pages of each write go with O_DIRECT (Linux,
  /// where the file system takes it): a page is written either directly by one rank or through
  /// the page cache by every rank that writes part of it, never both, so ranks sharing a page
  /// (their rows meet inside it) both write it through the cache, where their bytes merge.
  PlacedWriter(const std::string& file, bool durable, bool direct);
  /// Waits for the queued writes.
  ~PlacedWriter();
  PlacedWriter(const PlacedWriter&) = delete;
  PlacedWriter& operator=(const PlacedWriter&) = delete;

  /// `bytes` bytes from `data` at `offset` of the file.
  void write(const void* data, std::size_t bytes, std::int64_t offset, const std::string& where);
  /// The box [start, start + count) of a row-major array of dimensions `dims` (elements of
  /// `element_bytes`) whose first byte is at `base`, from a buffer holding the box row-major.
  void write_box(const void* data, const std::vector<hsize_t>& dims, const std::vector<hsize_t>& start,
                 const std::vector<hsize_t>& count, std::size_t element_bytes, std::int64_t base,
                 const std::string& where);
  /// Waits for the queued writes: then the caller may change or free the bytes it passed.
  void wait();
  /// wait(), then, when durable, waits for the write-back of every byte this rank wrote through
  /// the cache (Linux; elsewhere a no-op), so that the ranks' write-backs run in parallel before
  /// rank 0's fsync of the file.
  void flush();
  /// The first error ("" when none); complete after wait() or flush().
  const std::string& error() const { return m_error; }
  /// Bytes written (or queued) with O_DIRECT so far.
  std::int64_t direct_bytes() const { return m_direct_bytes; }

 private:
  /// A write of whole pages from page-aligned memory, for the helper thread.
  struct QueuedWrite {
    const char* data;
    std::size_t bytes;
    std::int64_t offset;
    std::string where;
  };

  void write_cached(const char* data, std::size_t bytes, std::int64_t offset, const std::string& where);
  /// Whole pages [offset, offset + bytes); false when O_DIRECT was refused (then off for good).
  bool write_direct(const char* data, std::size_t bytes, std::int64_t offset, const std::string& where);
  /// Every byte, retrying short writes; false only for O_DIRECT refused before any byte went.
  /// Other failures set `error`.
  bool write_all(int fd, const char* data, std::size_t bytes, std::int64_t offset, const std::string& where,
                 std::string& error) const;
  /// Starts the helper thread where none runs; false when the system gives none.
  bool helper_running();
  void queue(const char* data, std::size_t bytes, std::int64_t offset, const std::string& where);
  void write_queued();  // the helper thread

  std::string m_file, m_error;
  int m_fd = -1, m_direct_fd = -1;
  bool m_durable = false;
  bool m_direct_taken = false;             // a direct write from aligned memory succeeded: the file takes O_DIRECT
  std::int64_t m_first = -1, m_last = -1;  // the span written through the cache, for the write-back
  std::int64_t m_direct_bytes = 0;
  std::unique_ptr<char, void (*)(void*)> m_bounce{nullptr, free_page_aligned};  // for unaligned sources

  std::thread m_thread;
  std::mutex m_mutex;
  std::condition_variable m_changed;
  std::deque<QueuedWrite> m_queue;
  bool m_writing = false, m_stopping = false;
  std::string m_queue_error;  // the helper thread's first error
};

}  // namespace lather::checkpoint::Impl
