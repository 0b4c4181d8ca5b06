#include <lather/core/memory_budget.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#elif defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime_api.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace lather {

std::int64_t host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    std::int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return std::int64_t(pages) * page;
#endif
  return -1;
}

std::int64_t device_memory_available() {
  std::size_t free = 0, total = 0;
#if defined(KOKKOS_ENABLE_CUDA)
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) return std::int64_t(free);
#elif defined(KOKKOS_ENABLE_HIP)
  if (hipMemGetInfo(&free, &total) == hipSuccess) return std::int64_t(free);
#endif
  (void)free, (void)total;
  return -1;
}

std::int64_t rank_memory_limit(int ranks_on_node, std::string* where) {
  const std::int64_t device = device_memory_available();
  if (device >= 0) {
    if (where) *where = format_bytes(device) + " free on the device";
    return device;
  }
  const std::int64_t host = host_memory_available();
  if (host < 0) return -1;
  const int ranks = ranks_on_node > 0 ? ranks_on_node : 1;
  if (where)
    *where = ranks == 1 ? format_bytes(host) + " available on the node"
                        : format_bytes(host) + " available on the node / " + std::to_string(ranks) + " ranks";
  return host / ranks;
}

std::string beyond_rank_memory(std::int64_t bytes, int ranks_on_node) {
  std::string where;
  const std::int64_t limit = rank_memory_limit(ranks_on_node, &where);
  if (limit < 0 || bytes <= limit) return {};
  return "more than the " + format_bytes(limit) + " this rank can have (" + where + ")";
}

std::string format_bytes(std::int64_t bytes) {
  char text[48];
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.1f TiB", b / (1024.0 * 1024 * 1024 * 1024));
  else if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(text, sizeof text, "%.1f MiB", b / (1024.0 * 1024));
  return text;
}

}  // namespace lather
