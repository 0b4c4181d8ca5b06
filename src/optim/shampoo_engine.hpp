#pragma once
// The Shampoo state and step, templated on the statistics precision T (float or double); the
// public Shampoo class picks T at run time from ShampooOptions::statistics_precision.

#include "shampoo_kernels.hpp"
#include "shampoo_plan.hpp"

#include <lather/linalg/inverse_root.hpp>
#include <lather/optim/quantization.hpp>
#include <lather/optim/shampoo.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <KokkosKernels_config.h>

#include <memory>
#include <string>
#include <vector>

namespace lather::optim::Impl {

template <class ExecutionSpace, class Scalar>
class ShampooEngineBase {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Tensors = TensorList<Scalar, memory_space>;
  virtual ~ShampooEngineBase() = default;
  virtual void step(const Tensors& params, const Tensors& grads) = 0;
  virtual long step_count() const = 0;
  virtual StateMemoryReport memory_report() const = 0;
  virtual std::vector<StateArray<memory_space>> state_arrays() = 0;
  virtual void state_restored(long step_count) = 0;
  virtual const ShampooOptions& options() const = 0;
  virtual const ShampooPlan& plan() const = 0;
  virtual std::vector<StatisticMetrics> metrics() const = 0;
  virtual double root_load_imbalance() const = 0;
  virtual std::vector<double> statistic(int s) const = 0;
  virtual std::vector<double> preconditioner(int s) const = 0;
};

template <class ExecutionSpace, class Scalar, class T>
std::unique_ptr<ShampooEngineBase<ExecutionSpace, Scalar>> make_shampoo_engine(
    const ExecutionSpace& space, const std::vector<ParameterSpec>& parameters,
    const ShampooOptions& options, std::shared_ptr<WorkGroup> group, std::shared_ptr<WorkGroup> shards);

}  // namespace lather::optim::Impl
