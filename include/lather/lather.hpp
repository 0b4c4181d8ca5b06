#pragma once
// Lather's public API in one include.

#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/linalg/inverse_root.hpp>
