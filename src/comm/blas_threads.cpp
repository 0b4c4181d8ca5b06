#include <lather/comm/blas_threads.hpp>

#include <lather/core/host_blas_threads.hpp>

namespace lather::comm {

int fit_host_blas_threads(const Group& group) {
  const NodeOccupancy node = group.node_occupancy();  // collective: before any rank returns early
  if (!host_blas_threads_from_environment()) set_host_blas_threads(node.cpu_share());
  return host_blas_threads();
}

}  // namespace lather::comm
