#pragma once
// Each rank's share of its node's CPUs for the host BLAS (core/host_blas_threads.hpp says why).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>

namespace lather::comm {

/// Sets the host BLAS's threads to the CPUs this rank has to itself on its node: those of the
/// node's ranks of `group` over their number, at most its own affinity mask's (1 on 2 ranks of a
/// 2-core node, 2 on 1 rank of it). Left as it is where the environment fixes the count
/// (host_blas_threads_from_environment: the user's choice) or the BLAS does not let a program set
/// it. Returns the count the BLAS runs with afterwards (0 where it does not say). Collective over
/// `group` (the node occupancy is counted once per group).
int fit_host_blas_threads(const Group& group);

}  // namespace lather::comm
