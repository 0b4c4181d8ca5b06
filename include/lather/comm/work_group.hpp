#pragma once
// The optimizers' WorkGroup over an MPI communicator: the ranks of one data-parallel group share
// Shampoo's inverse-root work (and, in sharded mode, its state) through it.

#include <lather/optim/work_group.hpp>

#include <mpi.h>

#include <memory>

namespace lather::comm {

/// Collective over `group` (duplicates it). Host buffers only: Shampoo stages device data itself.
std::shared_ptr<optim::WorkGroup> make_work_group(MPI_Comm group);

}  // namespace lather::comm
