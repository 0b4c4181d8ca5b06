#pragma once
// Lather's MPI collectives in one include (needs a build with LATHER_ENABLE_MPI):
// the mesh and its communicators, gradient reductions (sum, mean, token-weighted mean, Adasum),
// accumulation over micro-batches, replica consistency, and tensor-parallel layers.
// Semantics: docs/reference/collectives.md.

#include <lather/comm/accumulate.hpp>
#include <lather/comm/communicator.hpp>
#include <lather/comm/mesh.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/comm/replicas.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/comm/wire_precision.hpp>
