#pragma once
// Lather's collectives in one include: the groups of ranks and the mesh, gradient reductions
// (sum, mean, token-weighted mean, Adasum), accumulation over micro-batches, replica consistency,
// and tensor-parallel layers. Without MPI (LATHER_ENABLE_MPI=OFF) every group is one process.
// Semantics: docs/reference/collectives.md.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/accumulate.hpp>
#include <lather/comm/group.hpp>
#include <lather/comm/mesh.hpp>
#include <lather/comm/mpi_session.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/comm/replicas.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/comm/wire_precision.hpp>
