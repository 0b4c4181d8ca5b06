#pragma once
// What the collectives share besides the Group: the Kokkos helpers they use by their short names
// and the hash that compares size lists across ranks.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/core/hash.hpp>

#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

namespace lather::comm::Impl {

using ::lather::Impl::fence;
using ::lather::Impl::Fnv1a;
using ::lather::Impl::host_accessible;
using ::lather::Impl::runs_on_host;
using ::lather::Impl::ScopedRegion;

}  // namespace lather::comm::Impl
