#pragma once
// Keeping the replicas of a data-parallel group identical: broadcast or average parameters and
// optimizer state (lists of Views), one seed for the whole group, and a divergence check that
// compares CRC-32 checksums of the replicated state and names the ranks that differ.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/mesh.hpp>
#include <lather/comm/reduce.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lather::comm {

/// t := root's t over `group` (parameters at start-up, optimizer state after a restart).
template <class ExecutionSpace, class Scalar>
void broadcast_tensors(const ExecutionSpace& space, const Group& group,
                       const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors, int root = 0,
                       const ReduceOptions& options = {}) {
  GradientReducer<ExecutionSpace, Scalar>(group, options).broadcast(space, tensors, root);
}

/// t := mean over `group` of t (re-synchronising replicas that drifted, e.g. after local steps).
template <class ExecutionSpace, class Scalar>
void average_tensors(const ExecutionSpace& space, const Group& group,
                     const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors,
                     const ReduceOptions& options = {}) {
  ReduceOptions native = options;
  native.wire_precision = WirePrecision::native;  // replicated state is never rounded on the wire
  native.shared_memory = false;                   // one call: a window would not pay (reduce.hpp)
  GradientReducer<ExecutionSpace, Scalar>(group, native).mean(space, tensors);
}

/// The seed of `root` on every rank of `group` (one MPI_Bcast): replicas of a group draw the same
/// random numbers (dropout masks, data order) from it.
std::uint64_t agree_seed(const Group& group, std::uint64_t seed, int root = 0);
/// The seed of replica 0 on every rank of this rank's data-parallel group.
std::uint64_t agree_seed(const Mesh& mesh, std::uint64_t seed);

/// CRC-32 (zlib) of the tensors' bytes on the host, in list order: equal lists of equal bits give
/// equal checksums (so 0.0 and -0.0 differ, as do NaNs with different payloads).
template <class ExecutionSpace, class Scalar>
std::uint32_t checksum(const ExecutionSpace& space,
                       const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors);

/// What check_replicas found; identical on every rank of the group.
struct ReplicaReport {
  int group_size = 0;
  std::vector<int> world_ranks;                             ///< world rank of each group rank
  std::vector<std::uint32_t> checksums;                     ///< per group rank
  std::vector<std::int64_t> tensor_counts, element_counts;  ///< per group rank
  int reference_rank = 0;  ///< group rank whose state the majority holds (lowest on ties)
  std::vector<int> divergent_group_ranks;
  std::vector<int> divergent_world_ranks;
  /// Tensors whose bytes differ on some rank (computed when the layouts agree).
  std::vector<int> divergent_tensors;

  bool consistent() const { return divergent_group_ranks.empty(); }
  /// "replicas consistent (4 ranks, crc32 <8 hex digits>)" or which ranks and tensors differ.
  std::string describe() const;
};

/// Collective over `group`: one all-gather of (tensor count, element count, size hash, checksum)
/// per rank, and one more of the per-tensor checksums when some rank diverges with the same
/// layout. The reference is the state most ranks hold; world ranks are those of `world` (the
/// group itself when not given). A rank that fails to compute its checksums says so in the same
/// all-gather: every rank then throws its error, "check_replicas: <message> (on group rank k of n)".
template <class ExecutionSpace, class Scalar>
ReplicaReport check_replicas(const ExecutionSpace& space, const Group& group,
                             const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors,
                             const Group* world = nullptr);

/// Over the mesh's data-parallel group, world ranks numbered in mesh.world().
template <class ExecutionSpace, class Scalar>
ReplicaReport check_replicas(const ExecutionSpace& space, const Mesh& mesh,
                             const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors) {
  return check_replicas(space, mesh.data_parallel(), tensors, &mesh.world());
}

/// check_replicas, throwing lather::Error with describe() (on every rank) when they diverge.
template <class ExecutionSpace, class Scalar>
void require_consistent_replicas(const ExecutionSpace& space, const Group& group,
                                 const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors,
                                 const Group* world = nullptr);

}  // namespace lather::comm
