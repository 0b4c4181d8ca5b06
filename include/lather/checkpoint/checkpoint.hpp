#pragma once
// Crash-safe, self-describing checkpoints in one HDF5 file, written collectively with parallel
// HDF5 (MPI-IO). Every array is stored with its global shape; each rank writes and reads only its
// part (a whole array, rows of its leading dimension, or a block), so a checkpoint written by N
// ranks is read back by any other number of ranks. docs/reference/checkpoint-format.md describes
// the file.
//
// Crash safety: a checkpoint is written under a temporary name in the target directory, flushed,
// closed and fsync'ed, then renamed to `<prefix>-<step>.h5` (atomic within one file system); the
// newest K are kept. A half-written file never carries the final name, so latest() never picks
// it. Integrity: every dataset is chunked with HDF5's Fletcher32 checksum filter; a corrupted,
// truncated or foreign file is refused on every rank with a message naming the file and dataset.

#include <lather/core/config.hpp>
#include <lather/optim/optimizer.hpp>

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lather::checkpoint {

using optim::DType;

/// The part of a global array that this rank holds, as one contiguous host buffer.
struct ArraySlice {
  enum class Selection {
    whole,  ///< the whole array (replicated); only ranks with writer = true write it
    rows,   ///< the listed rows of the leading dimension, in buffer order
    block,  ///< the box [offset, offset + count) per dimension, row-major in the buffer
  };
  std::string path;  ///< e.g. "parameters/dense_1/kernel" (relative to the file root)
  DType dtype = DType::float32;
  TensorShape shape;  ///< global shape
  Selection selection = Selection::whole;
  std::vector<std::int64_t> rows;
  std::vector<std::int64_t> offset, count;
  bool writer = true;
  void* data = nullptr;  ///< host memory: written from on save, read into on load

  std::int64_t elements() const;  ///< elements in this rank's selection
  std::size_t bytes() const { return std::size_t(elements()) * optim::size_of(dtype); }
};

/// Scalar metadata written as attributes of the root group (and read back).
struct Attributes {
  std::map<std::string, std::int64_t> integers;
  std::map<std::string, double> reals;
  std::map<std::string, std::string> strings;
};

struct CheckpointOptions {
  std::string directory = "checkpoints";
  std::string prefix = "checkpoint";
  int keep_last = 3;  ///< checkpoints kept after a save (older ones are deleted); >= 1
  std::size_t chunk_bytes = std::size_t(1) << 20;  ///< target HDF5 chunk size
  bool fsync = true;  ///< fsync the file and directory before and after the rename
  void validate() const;
};

/// The format this build writes; files of a newer major format are refused.
inline constexpr int format_version = 1;

class Checkpointer {
 public:
  /// `comm`: the ranks that save and load together (collective operations); duplicated inside.
  Checkpointer(MPI_Comm comm, CheckpointOptions options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Writes one checkpoint for `step` (collective). Returns the final file name.
  std::string save(long step, const std::vector<ArraySlice>& arrays, const Attributes& attributes);
  /// The newest complete checkpoint in the directory, "" when there is none (collective: rank 0
  /// scans, everyone gets its answer). Files that fail to open as checkpoints are skipped; when
  /// `skipped` is given it receives one "file: reason" line per skipped file, so that a caller
  /// can say why it did not resume from a newer (damaged) checkpoint.
  std::string latest(std::vector<std::string>* skipped = nullptr) const;
  /// All complete checkpoints, oldest first (rank 0's view, broadcast); `skipped` as in latest().
  std::vector<std::string> list(std::vector<std::string>* skipped = nullptr) const;
  /// Reads each array's selection into its buffer and the root attributes into `attributes`
  /// (collective). Shapes and types in the file must match exactly; any problem on any rank
  /// throws lather::Error on every rank naming the file and the dataset.
  void load(const std::string& file, const std::vector<ArraySlice>& arrays, Attributes* attributes = nullptr) const;
  /// Root attributes only (collective).
  Attributes read_attributes(const std::string& file) const;

  const CheckpointOptions& options() const { return m_options; }
  MPI_Comm communicator() const { return m_comm; }

 private:
  MPI_Comm m_comm = MPI_COMM_NULL;
  int m_rank = 0, m_size = 1;
  CheckpointOptions m_options;
};

}  // namespace lather::checkpoint
