#pragma once
// How many ranks of a group share a node, and the CPUs they may run on: what decides how a rank
// waits for MPI (src/comm/waiting.hpp) and how many threads its BLAS and host loops take.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <algorithm>

namespace lather::comm {

/// The ranks of a group that share a node (memory) and the CPUs their affinity masks allow: under
/// Slurm or `mpiexec -bind-to` each rank's own CPUs, unbound every CPU of the node.
struct NodeOccupancy {
  int ranks = 1;     ///< ranks of the group on this rank's node
  int cpus = 1;      ///< CPUs in the union of their affinity masks
  int own_cpus = 1;  ///< CPUs this rank's own mask allows
  /// More ranks than CPUs: a rank that spins in a wait keeps the CPU from the rank it waits for.
  bool oversubscribed() const { return ranks > cpus; }
  /// A helper thread of this rank would find a CPU that no rank of the group occupies.
  bool spare_cpu() const { return ranks < cpus && own_cpus > 1; }
  /// The CPUs this rank has to itself: the node's CPUs shared among its ranks, at most its own
  /// mask's, at least 1 (the BLAS's threads, Shampoo's eigh root threads).
  int cpu_share() const { return std::max(1, std::min(own_cpus, cpus / std::max(1, ranks))); }
};

}  // namespace lather::comm
