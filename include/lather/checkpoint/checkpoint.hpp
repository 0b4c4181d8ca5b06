#pragma once
// Crash-safe, self-describing checkpoints in one HDF5 file, laid out by rank 0 with HDF5 and filled
// by every rank in parallel at the datasets' offsets (src/checkpoint/placed_writes.hpp). Every
// array is stored with its global shape; each rank writes and reads only its part (a whole array,
// rows of its leading dimension, or a block), so a checkpoint written by N ranks is read back by
// any other number of ranks. docs/reference/checkpoint-format.md describes the file.
//
// Crash safety: a checkpoint is written under a temporary name in the target directory, flushed,
// closed and fsync'ed, then renamed to `<prefix>-<step>.h5` (atomic within one file system); the
// newest K are kept. A half-written file never carries the final name, so latest() never picks
// it. Integrity: arrays are stored contiguously (written and read at the disk's speed) beside
// per-chunk checksums that the ranks compute in parallel on what each writes, and check on what
// each reads; a corrupted, truncated or foreign file is refused on every rank with a message
// naming the file, the dataset and the rows.
//
// Pipeline stages: on a Mesh of several stages, each stage's ranks pass the arrays of their own
// stage (its parameters, its optimizer's state), and the file is still the one a single stage over
// the whole parameter list writes, so that any replicas x stages x shards layout resumes on any
// other. The stages' lists are merged into one (one exchange over mesh.pipeline()): an array of
// some stages only is selected by none of the other ranks; a stacked array (ArraySlice::stacked,
// Shampoo's statistics) is the stages' arrays one after the other in stage order, the same in
// every dimension but the first; any other array several stages hold (the step, the RNG words)
// must have one type and shape, is written by the first stage holding it and read by all of them.
// Anything else is a lather::Error on every rank naming the array and the stages.
//
//   lather::checkpoint::Checkpointer checkpointer(mesh, {"checkpoints"});
//   if (auto state = checkpointer.restore_latest(space, optimizer, params)) ...;  // resume
//   checkpointer.save(space, optimizer, params);                                  // periodically

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_CHECKPOINT)
#error "lather/checkpoint/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/mesh.hpp>
#include <lather/core/config.hpp>
#include <lather/optim/optimizer.hpp>

#include <cstdint>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lather::checkpoint {

using ::lather::DType;

/// The part of a global array that this rank holds, as one contiguous host buffer.
struct ArraySlice {
  enum class Selection {
    whole,  ///< the whole array (replicated); the ranks with writer = true, which must hold the same
            ///< bytes, each write a share of its rows
    rows,   ///< the listed rows of the leading dimension, in buffer order
    block,  ///< the box [offset, offset + count) per dimension, row-major in the buffer; ranks
            ///< selecting the same box (replicas: the same bytes) each write a share of its rows,
            ///< whatever their writer flag
  };
  std::string path;  ///< e.g. "parameters/dense_1/kernel" (relative to the file root)
  DType dtype = DType::float32;
  TensorShape shape;  ///< global shape
  Selection selection = Selection::whole;
  std::vector<std::int64_t> rows;
  std::vector<std::int64_t> offset, count;
  bool writer = true;
  /// The leading dimension counts items of the optimizer's own numbering (StateArray::stacked):
  /// with pipeline stages, each stage's items follow those of the stages before it.
  bool stacked = false;
  void* data = nullptr;  ///< host memory: written from on save, read into on load (saves write
                         ///< page-aligned memory, e.g. a PageAlignedVector, without a copy)

  std::int64_t elements() const;  ///< elements in this rank's selection
  std::size_t bytes() const { return std::size_t(elements()) * ::lather::size_of(dtype); }
};

/// Scalar metadata written as attributes of the root group (and read back).
struct Attributes {
  std::map<std::string, std::int64_t> integers;
  std::map<std::string, double> reals;
  std::map<std::string, std::string> strings;
};

/// What a training loop needs besides parameters and optimizer state to continue exactly.
struct TrainingState {
  long epoch = 0;
  long sample_offset = 0;          ///< samples of this epoch already consumed (global count)
  std::vector<std::uint64_t> rng;  ///< RNG state words, replicated on all ranks
  int world_size = 1;              ///< written by save; read back for information
  int weight_shards = 1;           ///< save: used unless the Checkpointer's Mesh has shards
  int pipeline_stages = 1;         ///< save: used unless the Checkpointer's Mesh has stages
  Attributes extra;                ///< anything else (written as root attributes)
  std::string file;                ///< restore: the checkpoint it was read from
};

/// Which copies of replicated data this rank writes, so that every byte is written exactly once:
/// unsplit parameters, and optimizer state shaped like them that the optimizer marks as written
/// by every rank, by the ranks of shard 0, a share of the rows each; other data held by every
/// rank (the step, the rest of the optimizer state) by the world root; data held by every replica
/// of one weight shard (split parameters, that shard's optimizer state) by its replicas, a share
/// each; rows tied to unsplit parameters by shard 0 only. A Checkpointer built on a Mesh knows its
/// roles.
struct WriterRoles {
  bool world_root = true;    ///< e.g. world rank 0; on a Mesh, rank 0 of this rank's stage_ranks()
  bool replica_root = true;  ///< e.g. rank 0 of this rank's data-parallel group (replica 0)
  int shard = 0;             ///< this rank's weight shard
  static WriterRoles single() { return {}; }
};

struct CheckpointOptions {
  std::string directory = "checkpoints";
  std::string prefix = "checkpoint";
  /// Checkpoints kept after a save, counting those that open as Lather checkpoints (latest()'s
  /// check); older files are deleted, in the background; damaged files newer than the oldest kept
  /// checkpoint are kept as well. >= 1
  int keep_last = 3;
  std::size_t chunk_bytes = std::size_t(1) << 20;  ///< rows of about this many bytes share a checksum
  bool fsync = true;                               ///< fsync the file and directory before and after the rename
  /// Write each rank's whole 4 KiB pages of the arrays with O_DIRECT, past the page cache, where
  /// the file system takes it (Linux; elsewhere, or when refused, plain writes), and read ranges
  /// of 8 MiB or more the cache does not hold the same way. Saves and loads then cost no
  /// page-cache allocation, which on virtual machines that hand freed memory back to the host
  /// can make large saves and first loads several times slower than the disk
  /// (checkpoint-format.md).
  bool direct_io = true;
  void validate() const;
};

/// The format this build writes; files of a newer major format are refused.
inline constexpr int format_version = 2;

/// One dataset of a checkpoint file.
struct DatasetSummary {
  std::string path;   ///< e.g. "parameters/dense/kernel"
  std::string type;   ///< float32, float64, int8, ... ("other" for a type Lather does not write)
  TensorShape shape;  ///< as stored ([1] for a scalar stored as one element)
  std::int64_t bytes = 0;
};
/// What a checkpoint file holds: its root attributes and every dataset.
struct CheckpointSummary {
  Attributes attributes;
  std::vector<DatasetSummary> datasets;
};
/// Reads a checkpoint's root attributes and dataset list on this process alone (no MPI, nothing
/// allocated from the file's claims). Throws lather::Error naming the file when it is not a
/// readable, complete Lather checkpoint.
CheckpointSummary describe_checkpoint(const std::string& file);
/// Reads every dataset of a checkpoint on this process alone and compares every chunk with its
/// stored checksum: "" when intact, else what is wrong and in which dataset (what Checkpointer::verify
/// answers on rank 0). `lather-checkpoint verify` runs it.
std::string verify_checkpoint(const std::string& file);

class Checkpointer {
 public:
  /// The ranks of the mesh save and load together (collective operations); each writes its part
  /// once, by the mesh's roles (WriterRoles).
  Checkpointer(const comm::Mesh& mesh, CheckpointOptions options);
  /// The ranks of `group` save and load together; rank 0 writes what they all hold.
  Checkpointer(const comm::Group& group, CheckpointOptions options);

  // ---- whole training states --------------------------------------------------------------------

  /// Writes the parameters, the optimizer's state and `state` as the checkpoint of the optimizer's
  /// step (collective); returns the file name. Device data is copied on `space`.
  template <class ExecutionSpace, class Scalar>
  std::string save(const ExecutionSpace& space, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                   const TensorList<Scalar, typename ExecutionSpace::memory_space>& values,
                   const TrainingState& state = TrainingState()) {
    return save(space, optimizer, values, state, m_roles);
  }
  /// With writer roles other than the Checkpointer's own (a Group whose ranks hold weight shards).
  template <class ExecutionSpace, class Scalar>
  std::string save(const ExecutionSpace& space, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                   const TensorList<Scalar, typename ExecutionSpace::memory_space>& values, const TrainingState& state,
                   const WriterRoles& roles);
  template <class ExecutionSpace, class Scalar>
  std::string save(const ExecutionSpace& space, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                   const ParameterList<Scalar, typename ExecutionSpace::memory_space>& parameters,
                   const TrainingState& state = TrainingState()) {
    return save(space, optimizer, parameters.values(), state);
  }
  /// Loads `file` into the parameters and the optimizer (which must have been built with the same
  /// parameters and options; its shapes are checked against the file) and returns the rest.
  template <class ExecutionSpace, class Scalar>
  TrainingState restore(const ExecutionSpace& space, const std::string& file,
                        optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                        const TensorList<Scalar, typename ExecutionSpace::memory_space>& values) const;
  /// restore() of the newest intact checkpoint (latest_intact: every dataset's checksum verified
  /// before anything is loaded, so a damaged file never leaves a half-loaded state); nothing when
  /// there is none (then the parameters and the optimizer are untouched). `skipped` receives a
  /// "file: reason" line for each newer checkpoint passed over.
  template <class ExecutionSpace, class Scalar>
  std::optional<TrainingState> restore_latest(const ExecutionSpace& space,
                                              optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                              const TensorList<Scalar, typename ExecutionSpace::memory_space>& values,
                                              std::vector<std::string>* skipped = nullptr) const {
    const std::string file = latest_intact(skipped);
    if (file.empty()) return std::nullopt;
    return restore(space, file, optimizer, values);
  }
  template <class ExecutionSpace, class Scalar>
  std::optional<TrainingState> restore_latest(
      const ExecutionSpace& space, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
      const ParameterList<Scalar, typename ExecutionSpace::memory_space>& parameters,
      std::vector<std::string>* skipped = nullptr) const {
    return restore_latest(space, optimizer, parameters.values(), skipped);
  }

  // ---- arrays -----------------------------------------------------------------------------------

  /// Writes one checkpoint for `step` (collective). Returns the final file name.
  std::string save(long step, const std::vector<ArraySlice>& arrays, const Attributes& attributes);
  /// The newest complete checkpoint in the directory, "" when there is none (collective: rank 0
  /// scans, everyone gets its answer). Files that fail to open as checkpoints are skipped; when
  /// `skipped` is given it receives one "file: reason" line per skipped file, so that a caller
  /// can say why it did not resume from a newer (damaged) checkpoint.
  std::string latest(std::vector<std::string>* skipped = nullptr) const;
  /// Reads every dataset of `file` and compares every chunk with its checksum (rank 0, serially;
  /// one read of the file): "" when it is an intact Lather checkpoint, else what is wrong and in
  /// which dataset. Collective: every rank gets rank 0's answer.
  std::string verify(const std::string& file) const;
  /// The newest complete checkpoint that passes verify(), "" when there is none; each newer one
  /// that does not, and each file latest() skips, adds a "file: reason" line to `skipped`.
  std::string latest_intact(std::vector<std::string>* skipped = nullptr) const;
  /// All complete checkpoints, oldest first (rank 0's view, broadcast); `skipped` as in latest().
  std::vector<std::string> list(std::vector<std::string>* skipped = nullptr) const;
  /// Reads each array's selection into its buffer and the root attributes into `attributes`
  /// (collective). Shapes and types in the file must match exactly; any problem on any rank
  /// throws lather::Error on every rank naming the file and the dataset.
  void load(const std::string& file, const std::vector<ArraySlice>& arrays, Attributes* attributes = nullptr) const;
  /// Root attributes only (collective).
  Attributes read_attributes(const std::string& file) const;
  /// Creates the directory where it is missing and checks that a file can be created in it
  /// (rank 0, collective): a run that will save calls it before its first step, so that an
  /// unwritable directory is an error on every rank at the start, not at the first save hours
  /// later. Throws lather::Error naming the directory and the system's reason.
  void check_directory() const;

  const CheckpointOptions& options() const { return m_options; }
  const comm::Group& group() const { return m_group; }
  const WriterRoles& roles() const { return m_roles; }

 private:
  comm::Group m_group;
  WriterRoles m_roles;
  int m_weight_shards = 1;
  CheckpointOptions m_options;
  /// The mesh's pipeline group (one process on its own without stages) and stage count: with
  /// more than one stage, save and load first merge the stages' arrays into one list.
  comm::Group m_pipeline;
  int m_pipeline_stages = 1;
  /// Rank 0 deletes the checkpoints beyond keep_last on a helper thread once the new one is
  /// published (deleting a large file can take a tenth of a second or more); the next save,
  /// list() and the destructor wait for it, so the directory is never seen half pruned.
  mutable std::shared_future<void> m_pruning;
  void finish_pruning() const;
};

}  // namespace lather::checkpoint
