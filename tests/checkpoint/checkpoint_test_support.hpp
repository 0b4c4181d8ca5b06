#pragma once
// Shared pieces of the checkpoint tests: a small model with every kind of optimizer state, and
// deterministic gradients, so runs can be repeated and compared bit for bit.

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/shampoo.hpp>

#include "common/host_copies.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace lather::test {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

inline std::vector<optim::ParameterSpec> model_specs() {
  return {
      {"scale", {}}, {"dense/bias", {6}}, {"dense/kernel", {10, 6}}, {"conv/kernel", {3, 3, 2, 4}}, {"embed", {50, 3}}};
}

template <class Scalar>
TensorList<Scalar, Mem> make_params(const std::vector<optim::ParameterSpec>& specs) {
  TensorList<Scalar, Mem> params;
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const auto n = element_count(specs[p].shape);
    FlatTensor<Scalar, Mem> v("param", n);
    auto h = Kokkos::create_mirror_view(v);
    for (std::int64_t k = 0; k < n; ++k) h(k) = Scalar(std::cos(0.31 * (k + 1) + 0.5 * p));
    Kokkos::deep_copy(v, h);
    params.push_back(v);
  }
  return params;
}

/// g = 0.05 p + sin(...): depends on the parameters, so any drift would compound.
template <class Scalar>
void fill_gradients(const TensorList<Scalar, Mem>& params, const TensorList<Scalar, Mem>& grads, long step) {
  for (std::size_t p = 0; p < params.size(); ++p) {
    auto hp = Kokkos::create_mirror_view(params[p]);
    auto hg = Kokkos::create_mirror_view(grads[p]);
    Kokkos::deep_copy(hp, params[p]);
    for (std::size_t k = 0; k < hp.size(); ++k)
      hg(k) = Scalar(0.05 * double(hp(k)) + std::sin(0.37 * (k + 1) + 1.1 * (step + 1) + 0.61 * p));
    Kokkos::deep_copy(grads[p], hg);
  }
}

template <class Scalar>
TensorList<Scalar, Mem> make_like(const TensorList<Scalar, Mem>& params) {
  TensorList<Scalar, Mem> out;
  for (const auto& p : params) out.push_back(FlatTensor<Scalar, Mem>("grad", p.size()));
  return out;
}

/// The optimizer kinds the round trip covers.
enum class Kind { shampoo_float, shampoo_double_statistics, shampoo_quantized, adam };
inline const char* name(Kind k) {
  switch (k) {
    case Kind::shampoo_float:
      return "shampoo_float";
    case Kind::shampoo_double_statistics:
      return "shampoo_double_statistics";
    case Kind::shampoo_quantized:
      return "shampoo_quantized";
    case Kind::adam:
      return "adam";
  }
  return "?";
}

template <class Scalar>
std::unique_ptr<optim::Optimizer<Space, Scalar>> make_optimizer(Kind kind, const comm::Group& group = comm::Group(),
                                                                optim::StepMode mode = optim::StepMode::automatic) {
  if (kind == Kind::adam) {
    optim::AdamOptions o;
    o.learning_rate = optim::LearningRateSchedule::constant(0.01);
    return std::make_unique<optim::FirstOrder<Space, Scalar>>(Space(), model_specs(), o);
  }
  optim::ShampooOptions o;
  o.learning_rate = optim::LearningRateSchedule::constant(0.02);
  o.block_size = 4;
  o.merge_small_dims_block_size = 8;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;
  o.graft_type = optim::GraftType::adagrad;
  o.skip_preconditioning_dim_size_gt = 40;  // "embed" [50, 3] takes the graft path
  o.step_mode = mode;
  if (kind == Kind::shampoo_double_statistics) o.statistics_precision = linalg::Precision::float64;
  if (kind == Kind::shampoo_quantized) o.best_effort_memory_usage_reduction = true;
  return std::make_unique<optim::Shampoo<Space, Scalar>>(Space(), model_specs(), o, group);
}

}  // namespace lather::test
