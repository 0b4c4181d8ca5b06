#pragma once
// The functions of Lather 0.1 for whole training states, kept for existing programs: use
// Checkpointer::save and Checkpointer::restore, which take the execution space and know the
// writer roles of their Mesh.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_CHECKPOINT)
#error "lather/checkpoint/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/optim/optimizer.hpp>

#include <string>

namespace lather::checkpoint {

template <class ExecutionSpace, class Scalar>
[[deprecated("use Checkpointer::save(space, optimizer, values, state)")]] std::string save_training_state(
    Checkpointer& checkpointer, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
    const TensorList<Scalar, typename ExecutionSpace::memory_space>& params, const TrainingState& state,
    const WriterRoles& roles) {
  return checkpointer.save(ExecutionSpace(), optimizer, params, state, roles);
}

template <class ExecutionSpace, class Scalar>
[[deprecated("use Checkpointer::restore(space, file, optimizer, values)")]] TrainingState load_training_state(
    const Checkpointer& checkpointer, const std::string& file, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
    const TensorList<Scalar, typename ExecutionSpace::memory_space>& params) {
  return checkpointer.restore(ExecutionSpace(), file, optimizer, params);
}

}  // namespace lather::checkpoint
