#pragma once
// This process's CPU affinity, as both counts of a node's CPUs read it: Group::node_occupancy for
// one process (group.cpp) and across the node's ranks (waiting.cpp).

#include <algorithm>
#include <thread>

#ifdef __linux__
#include <sched.h>
#endif

namespace lather::comm::Impl {

/// Every CPU of the node: the count where an affinity mask is unknown.
inline int node_cpus() { return std::max(1, int(std::thread::hardware_concurrency())); }

#ifdef __linux__
/// Reads this process's affinity mask into `mask` (left empty where it cannot be read) and returns
/// its CPUs, or node_cpus() for an empty mask.
inline int own_cpus(cpu_set_t& mask) {
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) CPU_ZERO(&mask);
  return CPU_COUNT(&mask) > 0 ? CPU_COUNT(&mask) : node_cpus();
}
#endif

}  // namespace lather::comm::Impl
