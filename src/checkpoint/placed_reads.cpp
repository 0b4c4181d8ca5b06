#include "placed_reads.hpp"

#include "file_pages.hpp"
#include "hdf5_handles.hpp"

#include <lather/checkpoint/page_aligned.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace lather::checkpoint::Impl {

namespace {

// The helper thread's requests, and the pieces handed to `piece`. O_DIRECT reads in requests of
// 4 to 64 MiB all come within a few per cent of one read of the whole range, and loads with 8, 16
// or 32 MiB requests do not differ beyond the noise (benchmarks.md); the smaller the request, the
// sooner the first piece is checked.
constexpr std::int64_t request_bytes = std::int64_t(8) << 20;

/// Whether the dataset's bytes lie in its file as they are to be read: stored as `type`, in a
/// file opened with HDF5's POSIX driver and without a user block before HDF5's offsets.
bool stored_plainly(hid_t dataset, hid_t type) {
  const Datatype stored(H5Dget_type(dataset));
  if (!stored.valid() || H5Tequal(stored.get(), type) <= 0) return false;
  const File file(H5Iget_file_id(dataset));
  if (!file.valid()) return false;
  const PropertyList access(H5Fget_access_plist(file.get())), creation(H5Fget_create_plist(file.get()));
  hsize_t user_block = 1;
  return access.valid() && H5Pget_driver(access.get()) == H5FD_SEC2 && creation.valid() &&
         H5Pget_userblock(creation.get(), &user_block) >= 0 && user_block == 0;
}

/// Every byte of [offset, offset + bytes) into `into`: "" or what went wrong. `refused` (when
/// given) is set instead when the first call fails with EINVAL, O_DIRECT's refusal.
std::string read_all(int fd, char* into, std::int64_t bytes, std::int64_t offset, bool* refused = nullptr) {
  for (std::int64_t done = 0; done < bytes;) {
    ssize_t n = -1;
    if (!::lather::Impl::fault_injected("checkpoint.read"))
      n = ::pread(fd, into + done, std::size_t(bytes - done), off_t(offset + done));
    else
      errno = EIO;  // tests: the disk fails the read
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && refused && done == 0) {
      *refused = true;
      return "";
    }
    if (n < 0)
      return "read of " + std::to_string(bytes - done) + " bytes at offset " + std::to_string(offset + done) +
             " failed: " + std::strerror(errno);
    if (n == 0) return "the file ends at offset " + std::to_string(offset + done) + ", before the dataset's bytes do";
    done += n;
  }
  return "";
}

/// Whether the page of the file at `offset` (a multiple of the page) is in the page cache. Asked
/// of mincore() through a mapping, which reads nothing and starts no read-ahead (a read with
/// RWF_NOWAIT would start one); where the kernel will not tell (Linux answers only for files the
/// caller may write), the answer is "no".
bool page_cached(int fd, std::int64_t offset) {
  void* mapped = ::mmap(nullptr, std::size_t(page), PROT_READ, MAP_SHARED, fd, off_t(offset));
  if (mapped == MAP_FAILED) return false;
  unsigned char resident = 0;
  const bool cached = ::mincore(mapped, std::size_t(page), &resident) == 0 && (resident & 1) != 0;
  ::munmap(mapped, std::size_t(page));
  return cached;
}

[[noreturn]] void fail(const std::string& where, const std::string& why) {
  LATHER_FAIL(where, ": read failed (corrupted or truncated?): ", why);
}

}  // namespace

PlacedReader::PlacedReader(std::string file) : m_file(std::move(file)) {
#ifdef O_DIRECT
  m_fd = ::open(m_file.c_str(), O_RDONLY);
#endif
}

PlacedReader::~PlacedReader() {
  if (m_thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_stopping = true;
    }
    m_changed.notify_all();
    m_thread.join();
  }
  if (m_fd >= 0) ::close(m_fd);
  if (m_direct_fd >= 0) ::close(m_direct_fd);
}

int PlacedReader::add(hid_t dataset, hid_t type, std::int64_t first, std::int64_t count, std::size_t row_bytes,
                      char* into, const std::string& where) {
#ifndef O_DIRECT
  (void)dataset, (void)type, (void)first, (void)count, (void)row_bytes, (void)into, (void)where;
  return -1;
#else
  if (m_fd < 0 || m_direct_refused || count <= 0 || row_bytes == 0) return -1;
  const haddr_t at = H5Dget_offset(dataset);  // HADDR_UNDEF unless contiguous and allocated
  if (at == HADDR_UNDEF) return -1;
  const std::int64_t row = std::int64_t(row_bytes), begin = std::int64_t(at) + first * row, end = begin + count * row;
  const auto [first_page, last_page] = whole_pages(begin, end);
  if (last_page - first_page < request_bytes ||
      reinterpret_cast<std::uintptr_t>(into + (first_page - begin)) % std::uintptr_t(page) != 0 ||
      !stored_plainly(dataset, type) || (page_cached(m_fd, first_page) && page_cached(m_fd, last_page - page)))
    return -1;
  if (m_direct_fd < 0) m_direct_fd = ::open(m_file.c_str(), O_RDONLY | O_DIRECT);
  if (m_direct_fd < 0) {
    m_direct_refused = true;
    return -1;
  }
  // Until the file has taken one, the first whole page here: it tells whether the file system
  // takes O_DIRECT (EINVAL where not). Later ranges do not wait behind the helper's requests.
  std::int64_t arrived = first_page;
  std::string error;
  if (!m_direct_taken) {
    error = read_all(m_direct_fd, into + (first_page - begin), page, first_page, &m_direct_refused);
    if (m_direct_refused) return -1;
    m_direct_taken = error.empty();
    arrived += page;
  }
  // The partial pages at either end, through the cache (another rank may read the rest of them).
  if (error.empty()) error = read_all(m_fd, into, first_page - begin, begin);
  if (error.empty()) error = read_all(m_fd, into + (last_page - begin), end - last_page, last_page);
  if (!error.empty()) fail(where, error);
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_ranges.push_back({into, begin, first_page, last_page, first, count, row, where, arrived, ""});
  }
  m_changed.notify_all();
  if (!helper_running()) m_no_thread = true;
  m_queued_bytes += end - begin;
  return int(m_ranges.size()) - 1;
#endif
}

bool PlacedReader::helper_running() {
  if (m_thread.joinable()) return true;
  if (m_no_thread) return false;
  try {
    ::lather::Impl::fault_point("checkpoint.reader_thread");
    m_thread = std::thread([this] { read_queued(); });
  } catch (const std::system_error&) {  // no thread to be had: finish() reads
    return false;
  }
  return true;
}

void PlacedReader::read_range(Range& r, std::int64_t from, bool helper) {
  while (from < r.last_page) {
    const std::int64_t bytes = std::min(request_bytes, r.last_page - from);
    std::string failure = read_all(m_direct_fd, r.into + (from - r.begin), bytes, from);
    std::lock_guard<std::mutex> lock(m_mutex);
    from += bytes;
    r.arrived = from;
    if (!failure.empty()) r.error = "O_DIRECT " + std::move(failure);
    m_changed.notify_all();
    if (!r.error.empty() || (helper && m_stopping)) return;
  }
}

void PlacedReader::read_queued() {
  std::unique_lock<std::mutex> lock(m_mutex);
  for (;;) {
    m_changed.wait(lock, [&] { return m_stopping || m_next < m_ranges.size(); });
    if (m_stopping) return;
    Range& r = m_ranges[m_next++];
    const std::int64_t from = r.arrived;
    lock.unlock();
    read_range(r, from, true);
    lock.lock();
  }
}

void PlacedReader::finish(int range, const std::function<void(std::int64_t, std::int64_t, const char*)>& piece) {
  Range& r = m_ranges.at(std::size_t(range));
  if (m_no_thread) read_range(r, r.arrived, false);
  const std::int64_t piece_rows = std::max<std::int64_t>(1, request_bytes / r.row_bytes);
  for (std::int64_t done = 0; done < r.rows; done += piece_rows) {
    const std::int64_t rows = std::min(piece_rows, r.rows - done);
    // The piece's whole pages (the partial last page of the range came in through the cache).
    const std::int64_t needed = std::min(r.begin + (done + rows) * r.row_bytes, r.last_page);
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_changed.wait(lock, [&] { return !r.error.empty() || r.arrived >= needed; });
      if (!r.error.empty()) fail(r.where, r.error);
    }
    piece(r.first_row + done, rows, r.into + done * r.row_bytes);
  }
}

}  // namespace lather::checkpoint::Impl
