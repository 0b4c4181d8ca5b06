#pragma once
// The checkpoint directory on rank 0's view of the file system: names, listing, atomic publishing
// and pruning. Only complete checkpoints carry the final name `<prefix>-<step, 12 digits>.h5`.

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lather::checkpoint::Impl {

std::string final_name(const std::string& directory, const std::string& prefix, long step);
/// A name in the same directory that no reader takes for a checkpoint.
std::string temporary_name(const std::string& directory, const std::string& prefix, long step);
/// Final-named checkpoints, oldest (smallest step) first, with their steps.
std::vector<std::pair<long, std::string>> list_final(const std::string& directory, const std::string& prefix);
/// Removes leftovers of interrupted writes (temporary names of this prefix).
void remove_temporaries(const std::string& directory, const std::string& prefix);
/// fsync(file), rename(from, to), fsync(directory), each checked: a file whose fsync fails is
/// removed and never renamed, and a failed fsync of the directory after the rename is an error
/// too (throws lather::Error naming the file and the system's reason). Without `sync`, the rename.
void publish(const std::string& from, const std::string& to, bool sync);
/// The final-named checkpoints that keeping the newest `keep` checkpoints deletes, oldest first:
/// every file older than the oldest of the newest `keep` files for which `opens(file)` holds. A
/// file that does not open is never deleted when it is newer than that (it is evidence, and
/// resuming skips it with a warning), nor counted among the kept ones; with fewer than `keep`
/// files that open, nothing is deleted. `opens` is called newest first, until `keep` hold.
std::vector<std::string> files_to_prune(const std::string& directory, const std::string& prefix, int keep,
                                        const std::function<bool(const std::string&)>& opens);
/// Deletes `files`; a file that cannot be deleted is left for the next save's pruning.
void remove_files(const std::vector<std::string>& files);
void make_directories(const std::string& directory);

/// The temporary file of a save in progress, held by the rank that creates it: deleted when this
/// goes out of scope before published(), so that a failed save leaves no partial file behind (a
/// full disk gets its space back at once, not at the next save).
class PartialFile {
 public:
  explicit PartialFile(std::string path) : m_path(std::move(path)) {}
  ~PartialFile();
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  /// The file took its final name: nothing to delete.
  void published() { m_path.clear(); }

 private:
  std::string m_path;
};
/// Creates and deletes a file under a temporary name of `prefix` in `directory`; throws
/// lather::Error naming the directory and the system's reason when that fails.
void check_writable(const std::string& directory, const std::string& prefix);

}  // namespace lather::checkpoint::Impl
