#pragma once
// How much memory a rank may still take, so that a run whose estimate exceeds it is refused
// before it allocates (the node's OOM killer, not Lather, would otherwise end it, and might take
// a neighbour's process instead), and the estimate printed beside it.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_CORE)
#error "lather/core/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <cstdint>
#include <string>

namespace lather {

/// Bytes the node can still give without swapping (Linux: MemAvailable of /proc/meminfo; else
/// the physical pages not in use), or -1 where the system does not say.
std::int64_t host_memory_available();

/// Bytes free on the device the default execution space runs on (cudaMemGetInfo,
/// hipMemGetInfo), or -1 where the default execution space runs on the host.
std::int64_t device_memory_available();

/// What one rank of `ranks_on_node` may take in the default execution space's memory: the free
/// device memory on a GPU backend, else an equal share of the node's available memory; -1 where
/// neither is known. `where` receives how the figure came about, for messages.
std::int64_t rank_memory_limit(int ranks_on_node, std::string* where = nullptr);

/// "" when `bytes` fits what one rank of `ranks_on_node` may take (rank_memory_limit; also when
/// the limit is not known), else "more than the <limit> this rank can have (<how>)", for the
/// message that refuses the run.
std::string beyond_rank_memory(std::int64_t bytes, int ranks_on_node);

/// "1.25 GiB", "12.0 MiB": a byte count for people.
std::string format_bytes(std::int64_t bytes);

}  // namespace lather
