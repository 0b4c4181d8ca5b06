#include "placed_writes.hpp"

#include "attributes.hpp"
#include "file_format.hpp"
#include "file_pages.hpp"
#include "selection.hpp"

#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace lather::checkpoint::Impl {

std::vector<std::int64_t> lay_out(const std::string& file, const std::vector<ArraySlice>& arrays,
                                  const Attributes& root_attributes) {
  PropertyList fapl(check(H5Pcreate(H5P_FILE_ACCESS), "creating a file access list"));
  // The HDF5 1.8 object formats or newer, whose metadata carries checksums (superblock version 2
  // and later); datasets of 1 MiB or more aligned to 1 MiB (the stripe size of common parallel
  // file systems, and whole pages for the ranks' writes).
  check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "setting the object formats");
  check(H5Pset_alignment(fapl.get(), hsize_t(1) << 20, hsize_t(1) << 20), "setting the alignment");
  File f(check(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), "creating checkpoint '" + file + "'"));
  PropertyList lcpl(check(H5Pcreate(H5P_LINK_CREATE), "creating a link list"));
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), "enabling intermediate groups");
  std::vector<std::int64_t> offsets(arrays.size(), -1);
  for (std::size_t k = 0; k < arrays.size(); ++k) {
    const auto& a = arrays[k];
    const std::string where = "checkpoint '" + file + "' dataset '" + a.path + "'";
    const auto dims = stored_dims(a.shape);
    Dataspace space(check(H5Screate_simple(int(dims.size()), dims.data(), nullptr), where));
    PropertyList dcpl(check(H5Pcreate(H5P_DATASET_CREATE), where));
    // Contiguous and unfiltered, allocated at creation (its offset is where the ranks write) and
    // never filled, since every byte is written.
    check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), where + ": layout");
    check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), where + ": allocation time");
    check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), where + ": fill time");
    Dataset dataset(check(
        H5Dcreate2(f.get(), a.path.c_str(), native_type(a.dtype), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
        where + ": create"));
    if (a.shape.empty()) write_integer_attribute(dataset.get(), "scalar", 1);
    if (element_count(a.shape) == 0) continue;
    const haddr_t at = H5Dget_offset(dataset.get());
    LATHER_REQUIRE(at != HADDR_UNDEF, where, ": HDF5 gave no offset for its bytes");
    offsets[k] = std::int64_t(at);
  }
  // Root attributes: identification first; "complete" comes last, once the data is in.
  write_string_attribute(f.get(), "format", format_name);
  write_integer_attribute(f.get(), "format_version", format_version);
  write_string_attribute(f.get(), "library_version", LATHER_VERSION_STRING);
  const std::time_t now = std::time(nullptr);
  char created[32];
  std::strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  write_string_attribute(f.get(), "created", created);
  for (const auto& [name, value] : root_attributes.integers) write_integer_attribute(f.get(), name, value);
  for (const auto& [name, value] : root_attributes.reals) write_real_attribute(f.get(), name, value);
  for (const auto& [name, value] : root_attributes.strings) write_string_attribute(f.get(), name, value);
  check(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), "flushing checkpoint '" + file + "'");
  f.reset();
#ifdef __linux__
  // The datasets' bytes are holes until the ranks write them. Allocating them here, in one call,
  // spares the file system allocating blocks for several writers of one file at once (which
  // slows ext4's write-back); where the file system cannot (EOPNOTSUPP), they stay holes.
  const int fd = ::open(file.c_str(), O_WRONLY);
  if (fd >= 0) {
    const off_t size = ::lseek(fd, 0, SEEK_END);
    if (size > 0) (void)::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, size);
    ::close(fd);
  }
#endif
  return offsets;
}

namespace {

// O_DIRECT transfers from a staging buffer of this size where the caller's bytes are not aligned
// to the disk's sectors (the largest piece the checkpointer writes at once).
constexpr std::size_t bounce_bytes = std::size_t(1) << 20;

}  // namespace

PlacedWriter::PlacedWriter(const std::string& file, bool durable, bool direct) : m_file(file), m_durable(durable) {
  m_fd = ::open(file.c_str(), O_WRONLY);
  if (m_fd < 0) {
    const int error = errno;
    m_error = "cannot open checkpoint '" + file + "' for writing: " + std::strerror(error);
    // Rank 0 has just created the file: where another rank cannot find it, the directory is on a
    // node-local file system (a job's /tmp), which a checkpoint of several nodes cannot use.
    if (error == ENOENT) m_error += " (is the checkpoint directory on a file system every rank shares?)";
  }
#ifdef O_DIRECT
  // Refused (tmpfs, some FUSE file systems): every byte goes through the page cache.
  if (direct && m_fd >= 0) m_direct_fd = ::open(file.c_str(), O_WRONLY | O_DIRECT);
#else
  (void)direct;
#endif
}

PlacedWriter::~PlacedWriter() {
  if (m_thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_stopping = true;
    }
    m_changed.notify_all();
    m_thread.join();  // after the queue is empty
  }
  if (m_fd >= 0) ::close(m_fd);
  if (m_direct_fd >= 0) ::close(m_direct_fd);
}

bool PlacedWriter::write_all(int fd, const char* data, std::size_t bytes, std::int64_t offset, const std::string& where,
                             std::string& error) const {
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t n = -1;
    if (!::lather::Impl::fault_injected("checkpoint.write"))
      n = ::pwrite(fd, data + done, bytes - done, off_t(offset) + off_t(done));
    else
      errno = ENOSPC;  // tests: the disk is full
    if (n < 0 && errno == EINTR) continue;
    // O_DIRECT refused for this file or buffer: the caller writes these bytes through the cache.
    if (n < 0 && errno == EINVAL && fd == m_direct_fd && done == 0) return false;
    if (n <= 0) {
      error = "checkpoint '" + m_file + "' " + where + ": write of " + std::to_string(bytes - done) +
              " bytes at offset " + std::to_string(offset + std::int64_t(done)) +
              " failed: " + (n < 0 ? std::strerror(errno) : "nothing written");
      return true;
    }
    done += std::size_t(n);
  }
  return true;
}

void PlacedWriter::write_cached(const char* data, std::size_t bytes, std::int64_t offset, const std::string& where) {
  if (!m_error.empty() || bytes == 0) return;
  write_all(m_fd, data, bytes, offset, where, m_error);
  m_first = m_first < 0 ? offset : std::min(m_first, offset);
  m_last = std::max(m_last, offset + std::int64_t(bytes));
#ifdef __linux__
  // Start the write-back at once, without waiting: the disk works while this rank goes on.
  if (m_durable) ::sync_file_range(m_fd, off_t(offset), off_t(bytes), SYNC_FILE_RANGE_WRITE);
#endif
}

bool PlacedWriter::helper_running() {
  if (m_thread.joinable()) return true;
  try {
    ::lather::Impl::fault_point("checkpoint.writer_thread");
    m_thread = std::thread([this] { write_queued(); });
  } catch (const std::system_error&) {  // no thread to be had: this one writes
    return false;
  }
  return true;
}

void PlacedWriter::queue(const char* data, std::size_t bytes, std::int64_t offset, const std::string& where) {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_queue.push_back({data, bytes, offset, where});
  }
  m_changed.notify_all();
}

void PlacedWriter::write_queued() {
  // Writes that continue each other, in memory and in the file, go as one request of up to this
  // many bytes: the disk gets requests as large as one write of the whole share would make.
  constexpr std::size_t request_bytes = std::size_t(64) << 20;
  std::unique_lock<std::mutex> lock(m_mutex);
  for (;;) {
    m_changed.wait(lock, [&] { return m_stopping || !m_queue.empty(); });
    if (m_queue.empty()) return;
    QueuedWrite next = std::move(m_queue.front());
    m_queue.pop_front();
    while (!m_queue.empty() && next.bytes < request_bytes && m_queue.front().data == next.data + next.bytes &&
           m_queue.front().offset == next.offset + std::int64_t(next.bytes)) {
      next.bytes += m_queue.front().bytes;
      m_queue.pop_front();
    }
    m_writing = true;
    const bool failed = !m_queue_error.empty();  // after a failure the rest is not written
    lock.unlock();
    std::string error;
    if (!failed && !write_all(m_direct_fd, next.data, next.bytes, next.offset, next.where, error))
      error = "checkpoint '" + m_file + "' " + next.where + ": O_DIRECT refused after earlier writes took it";
    lock.lock();
    if (m_queue_error.empty()) m_queue_error = error;
    m_writing = false;
    m_changed.notify_all();
  }
}

void PlacedWriter::wait() {
  if (!m_thread.joinable()) return;
  std::unique_lock<std::mutex> lock(m_mutex);
  m_changed.wait(lock, [&] { return m_queue.empty() && !m_writing; });
  if (m_error.empty()) m_error = m_queue_error;
}

bool PlacedWriter::write_direct(const char* data, std::size_t bytes, std::int64_t offset, const std::string& where) {
  // O_DIRECT wants the memory aligned too (to the disk's sector; some file systems, older Lustre
  // among them, want whole pages): sources on a page boundary go straight from the caller's
  // memory, on the helper thread once the file has taken one such write (the first is written
  // here, so that a refusal falls back to the cache); other sources are staged.
  if (reinterpret_cast<std::uintptr_t>(data) % std::uintptr_t(page) == 0) {
    if (m_direct_taken && helper_running()) {
      queue(data, bytes, offset, where);
    } else {
      if (!write_all(m_direct_fd, data, bytes, offset, where, m_error)) return false;
      m_direct_taken = m_error.empty();
    }
  } else {
    if (!m_bounce) m_bounce.reset(static_cast<char*>(allocate_page_aligned(bounce_bytes)));
    if (!m_bounce) return false;  // through the cache then
    for (std::size_t done = 0; done < bytes && m_error.empty(); done += bounce_bytes) {
      const std::size_t n = std::min(bounce_bytes, bytes - done);
      std::memcpy(m_bounce.get(), data + done, n);
      if (!write_all(m_direct_fd, m_bounce.get(), n, offset + std::int64_t(done), where, m_error)) {
        if (done == 0) return false;
        m_error = "checkpoint '" + m_file + "' " + where + ": O_DIRECT refused in the middle of a write";
      }
    }
  }
  m_direct_bytes += std::int64_t(bytes);
  return true;
}

void PlacedWriter::write(const void* data, std::size_t bytes, std::int64_t offset, const std::string& where) {
  if (!m_error.empty() || bytes == 0) return;
  const char* from = static_cast<const char*>(data);
  const std::int64_t end = offset + std::int64_t(bytes);
  // The whole pages inside [offset, end) go directly; the partial pages at either end, which
  // another rank may be writing the rest of, through the cache.
  const auto [first_page, last_page] = whole_pages(offset, end);
  if (m_direct_fd >= 0 && last_page > first_page) {
    write_cached(from, std::size_t(first_page - offset), offset, where);
    if (write_direct(from + (first_page - offset), std::size_t(last_page - first_page), first_page, where)) {
      write_cached(from + (last_page - offset), std::size_t(end - last_page), last_page, where);
      return;
    }
    wait();  // the helper thread may still be writing with it
    ::close(m_direct_fd);
    m_direct_fd = -1;
    write_cached(from + (first_page - offset), std::size_t(end - first_page), first_page, where);
    return;
  }
  write_cached(from, bytes, offset, where);
}

void PlacedWriter::write_box(const void* data, const std::vector<hsize_t>& dims, const std::vector<hsize_t>& start,
                             const std::vector<hsize_t>& count, std::size_t element_bytes, std::int64_t base,
                             const std::string& where) {
  const std::size_t rank = dims.size();
  for (auto c : count)
    if (c == 0) return;
  // The innermost dimension q whose inner dimensions the box spans whole: each run of
  // count[q] * (elements of the inner dimensions) elements is contiguous in the file.
  std::size_t q = rank - 1;
  while (q > 0 && start[q] == 0 && count[q] == dims[q]) --q;
  std::int64_t inner = 1;
  for (std::size_t d = q + 1; d < rank; ++d) inner *= std::int64_t(dims[d]);
  const std::size_t run_bytes = std::size_t(count[q]) * std::size_t(inner) * element_bytes;
  std::vector<hsize_t> index(q, 0);  // the box's index in dimensions 0 .. q-1
  const char* from = static_cast<const char*>(data);
  for (;;) {
    std::int64_t element = 0;  // the run's first element, row-major in the array
    for (std::size_t d = 0; d <= q; ++d)
      element = element * std::int64_t(dims[d]) + std::int64_t(start[d] + (d < q ? index[d] : 0));
    element *= inner;
    write(from, run_bytes, base + element * std::int64_t(element_bytes), where);
    from += run_bytes;
    std::size_t d = q;
    while (d > 0 && ++index[d - 1] == count[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

void PlacedWriter::flush() {
  wait();
#ifdef __linux__
  if (!m_durable || !m_error.empty() || m_fd < 0 || m_last <= m_first) return;
  if (::sync_file_range(m_fd, off_t(m_first), off_t(m_last - m_first),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0)
    m_error = "checkpoint '" + m_file + "': write-back failed: " + std::strerror(errno);
#endif
}

}  // namespace lather::checkpoint::Impl
