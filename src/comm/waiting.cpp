#include "waiting.hpp"

#include "affinity.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sched.h>

namespace lather::comm::Impl {
namespace {

enum class WaitMode { automatic, spin, yield };

WaitMode requested_mode() {
  const char* value = std::getenv("LATHER_COLLECTIVE_WAIT");
  if (!value || !*value || std::strcmp(value, "auto") == 0) return WaitMode::automatic;
  if (std::strcmp(value, "spin") == 0) return WaitMode::spin;
  if (std::strcmp(value, "yield") == 0) return WaitMode::yield;
  LATHER_FAIL("LATHER_COLLECTIVE_WAIT is '", value, "'; it takes auto, spin or yield");
}

std::atomic<bool> g_oversubscribed{false};

}  // namespace

NodeOccupancy node_occupancy(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  NodeOccupancy out;
  int status = MPI_Comm_size(node, &out.ranks);
  // Unknown masks count as every CPU of the node.
  out.cpus = out.own_cpus = node_cpus();
#ifdef __linux__
  cpu_set_t mine, used;
  CPU_ZERO(&used);
  out.own_cpus = own_cpus(mine);  // an unreadable mask stays empty: then the others' masks count
  std::vector<cpu_set_t> all(static_cast<std::size_t>(out.ranks));
  if (status == MPI_SUCCESS)
    status = MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, node);
  for (auto& set : all) CPU_OR(&used, &used, &set);
  if (CPU_COUNT(&used) > 0) out.cpus = CPU_COUNT(&used);
#endif
  MPI_Comm_free(&node);
  check_mpi(status, "counting the ranks and CPUs of the node");
  return out;
}

std::optional<NodeOccupancy> note_node_occupancy(MPI_Comm comm) {
  if (requested_mode() != WaitMode::automatic || g_oversubscribed.load(std::memory_order_relaxed)) return std::nullopt;
  const NodeOccupancy counted = node_occupancy(comm);
  if (counted.oversubscribed()) g_oversubscribed.store(true, std::memory_order_relaxed);
  return counted;
}

bool yield_while_waiting() {
  static const WaitMode mode = requested_mode();
  if (mode != WaitMode::automatic) return mode == WaitMode::yield;
  return g_oversubscribed.load(std::memory_order_relaxed);
}

void wait_yielding(MPI_Request* requests, int count, const char* call) {
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), call);
    if (done) return;
    sched_yield();
  }
}

}  // namespace lather::comm::Impl
