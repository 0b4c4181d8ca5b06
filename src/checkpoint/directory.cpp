#include "directory.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fcntl.h>
#include <unistd.h>

namespace lather::checkpoint::Impl {

namespace fs = std::filesystem;

std::string final_name(const std::string& directory, const std::string& prefix, long step) {
  char name[64];
  std::snprintf(name, sizeof name, "-%012ld.h5", step);
  return (fs::path(directory) / (prefix + name)).string();
}

std::string temporary_name(const std::string& directory, const std::string& prefix, long step) {
  char name[64];
  std::snprintf(name, sizeof name, "-%012ld.h5.partial-%ld", step, long(::getpid()));
  return (fs::path(directory) / ("." + prefix + name)).string();
}

std::vector<std::pair<long, std::string>> list_final(const std::string& directory, const std::string& prefix) {
  std::vector<std::pair<long, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) return found;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string head = prefix + "-";
    if (name.size() != head.size() + 12 + 3 || name.compare(0, head.size(), head) != 0) continue;
    if (name.compare(name.size() - 3, 3, ".h5") != 0) continue;
    const std::string digits = name.substr(head.size(), 12);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    found.push_back({std::stol(digits), entry.path().string()});
  }
  std::sort(found.begin(), found.end());
  return found;
}

void remove_temporaries(const std::string& directory, const std::string& prefix) {
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) return;
  const std::string head = "." + prefix + "-";
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, head.size(), head) == 0 && name.find(".h5.partial-") != std::string::npos)
      fs::remove(entry.path(), ec);
  }
}

namespace {
/// fsync of a file or directory; "" when it reached the disk, else what failed. O_NONBLOCK, which
/// regular files and directories ignore, keeps a FIFO left under the name from blocking the open.
std::string sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) {
    // Renaming into a directory needs write and search permission, not read: one that may not be
    // opened cannot be synced by this process, which is not a failure of the disk.
    if (directory && errno == EACCES) return {};
    return ::lather::Impl::concat("cannot open '", path, "' to fsync it: ", std::strerror(errno));
  }
  int result = 0;
  do {
    result = ::fsync(fd);
  } while (result != 0 && errno == EINTR);
  int sync_errno = errno;
  // Tests make a file's fsync fail as a disk would (EIO), on the rank that publishes.
  if (!directory && ::lather::Impl::fault_injected("checkpoint.fsync")) {
    result = -1;
    sync_errno = EIO;
  }
  const int closed = ::close(fd);
  if (result != 0) {
    // Some file systems do not sync directories at all (EINVAL; EBADF on systems that want them
    // opened for writing): their renames are as durable as they can make them.
    if (directory && (sync_errno == EINVAL || sync_errno == EBADF)) return {};
    return ::lather::Impl::concat("fsync of '", path, "' failed: ", std::strerror(sync_errno));
  }
  if (closed != 0 && !directory)
    return ::lather::Impl::concat("closing '", path, "' after its fsync: ", std::strerror(errno));
  return {};
}
}  // namespace

void publish(const std::string& from, const std::string& to, bool sync) {
  // A file whose bytes may not be on the disk never takes the final name: after an fsync error
  // the kernel may already have dropped the pages that failed, so no retry can be trusted either.
  if (sync) {
    const std::string failed = sync_path(from, false);
    if (!failed.empty()) {
      std::error_code ignored;
      fs::remove(from, ignored);
      LATHER_FAIL("checkpoint '", to, "' was not published: ", failed);
    }
  }
  if (std::rename(from.c_str(), to.c_str()) != 0)
    LATHER_FAIL("cannot rename checkpoint '", from, "' to '", to, "': ", std::strerror(errno));
  if (sync) {
    const std::string failed = sync_path(fs::path(to).parent_path().string(), true);
    // The file is complete under its final name, but its name may not survive a crash: an error,
    // so that the run stops before pruning the checkpoints that would.
    if (!failed.empty())
      LATHER_FAIL("checkpoint '", to, "' is complete, but its rename may not survive a crash: ", failed);
  }
}

std::vector<std::string> files_to_prune(const std::string& directory, const std::string& prefix, int keep,
                                        const std::function<bool(const std::string&)>& opens) {
  const auto files = list_final(directory, prefix);
  int kept = 0;
  std::size_t oldest_kept = files.size();
  for (std::size_t k = files.size(); k-- > 0 && kept < keep;)
    if (opens(files[k].second)) {
      ++kept;
      oldest_kept = k;
    }
  std::vector<std::string> doomed;
  if (kept < keep) return doomed;
  for (std::size_t k = 0; k < oldest_kept; ++k) doomed.push_back(files[k].second);
  return doomed;
}

void remove_files(const std::vector<std::string>& files) {
  std::error_code ec;
  for (const auto& file : files) fs::remove(file, ec);
}

void make_directories(const std::string& directory) {
  std::error_code ec;
  fs::create_directories(directory, ec);
  LATHER_REQUIRE(!ec && fs::is_directory(directory), "cannot create checkpoint directory '", directory,
                 "': ", ec ? ec.message() : std::string("not a directory"));
}

PartialFile::~PartialFile() {
  if (m_path.empty()) return;
  std::error_code ignored;  // a save already failing: its own error is the one to report
  fs::remove(m_path, ignored);
}

void check_writable(const std::string& directory, const std::string& prefix) {
  // A temporary name, which readers never take for a checkpoint and the next save deletes should
  // this process die between the two calls.
  const std::string probe = temporary_name(directory, prefix, 0) + "-probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) LATHER_FAIL("cannot create files in checkpoint directory '", directory, "': ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace lather::checkpoint::Impl
