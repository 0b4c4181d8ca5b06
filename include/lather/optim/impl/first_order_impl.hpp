#pragma once
// The implementation of FirstOrder, for explicit instantiation: src/optim/first_order.cpp
// instantiates it for lather::DefaultExecutionSpace (and the host space on device builds); a
// program that needs another execution space includes this header and uses the class as usual.

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/first_order.hpp>

#include <cmath>
#include <sstream>

namespace lather::optim {

namespace Impl {
inline std::string to_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
FirstOrder<ExecutionSpace, Scalar>::FirstOrder(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                               SgdOptions options)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters)), m_rule(Rule::sgd), m_sgd(options) {
  m_sgd.validate();
  allocate(space, {"momentum"}, 0.0);
}
template <class ExecutionSpace, class Scalar>
FirstOrder<ExecutionSpace, Scalar>::FirstOrder(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                               AdagradOptions options)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters)), m_rule(Rule::adagrad), m_adagrad(options) {
  m_adagrad.validate();
  allocate(space, {"sum_of_squares"}, m_adagrad.initial_accumulator_value);
}
template <class ExecutionSpace, class Scalar>
FirstOrder<ExecutionSpace, Scalar>::FirstOrder(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                               AdamOptions options)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters)), m_rule(Rule::adam), m_adam(options) {
  m_adam.validate();
  allocate(space, {"mu", "nu"}, 0.0);
}
template <class ExecutionSpace, class Scalar>
FirstOrder<ExecutionSpace, Scalar>::~FirstOrder() = default;

template <class ExecutionSpace, class Scalar>
void FirstOrder<ExecutionSpace, Scalar>::allocate(const ExecutionSpace& space, const std::vector<std::string>& slots,
                                                  double initial) {
  m_slot_names = slots;
  m_state.resize(slots.size());
  for (std::size_t s = 0; s < slots.size(); ++s)
    for (const auto& spec : this->m_parameters) {
      FlatTensor<Scalar, memory_space> v(Kokkos::view_alloc(space, "Lather::" + name() + "::" + spec.name + "::" + slots[s]),
                                         element_count(spec.shape));
      if (initial != 0) Kokkos::deep_copy(space, v, Scalar(initial));
      m_state[s].push_back(v);
    }
}

template <class ExecutionSpace, class Scalar>
std::string FirstOrder<ExecutionSpace, Scalar>::name() const {
  switch (m_rule) {
    case Rule::sgd: return "sgd";
    case Rule::adagrad: return "adagrad";
    case Rule::adam: return m_adam.decoupled_weight_decay ? "adamw" : "adam";
  }
  return "sgd";
}

template <class ExecutionSpace, class Scalar>
void FirstOrder<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& params,
                                                 const Tensors& grads) {
  ::lather::Impl::ScopedRegion region("Lather::" + name() + "::step");
  const long t = m_step;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto x = params[p];
    const auto g = grads[p];
    const auto policy = Kokkos::RangePolicy<ExecutionSpace>(space, 0, x.extent(0));
    if (m_rule == Rule::sgd) {
      const Scalar lr = Scalar(m_sgd.learning_rate(t)), mu = Scalar(m_sgd.momentum), wd = Scalar(m_sgd.weight_decay);
      const bool nesterov = m_sgd.nesterov;
      const auto m = m_state[0][p];
      Kokkos::parallel_for("Lather::sgd::update", policy, KOKKOS_LAMBDA(std::int64_t k) {
        const Scalar gk = g(k) + wd * x(k);
        const Scalar mk = gk + mu * m(k);
        m(k) = mk;
        x(k) -= lr * (nesterov ? gk + mu * mk : mk);
      });
    } else if (m_rule == Rule::adagrad) {
      const Scalar lr = Scalar(m_adagrad.learning_rate(t)), eps = Scalar(m_adagrad.epsilon),
                   wd = Scalar(m_adagrad.weight_decay);
      const auto acc = m_state[0][p];
      Kokkos::parallel_for("Lather::adagrad::update", policy, KOKKOS_LAMBDA(std::int64_t k) {
        const Scalar gk = g(k) + wd * x(k);
        const Scalar a = acc(k) + gk * gk;
        acc(k) = a;
        x(k) -= lr * gk / ::lather::Impl::kmath::sqrt(a + eps);
      });
    } else {
      const auto& o = m_adam;
      const Scalar lr = Scalar(o.learning_rate(t)), b1 = Scalar(o.beta1), b2 = Scalar(o.beta2), eps = Scalar(o.epsilon),
                   wd = Scalar(o.weight_decay);
      // optax.scale_by_adam's bias correction with the count after this update.
      const Scalar c1 = Scalar(1 - std::pow(o.beta1, double(t + 1))), c2 = Scalar(1 - std::pow(o.beta2, double(t + 1)));
      const bool decoupled = o.decoupled_weight_decay;
      const auto mu = m_state[0][p], nu = m_state[1][p];
      Kokkos::parallel_for("Lather::adam::update", policy, KOKKOS_LAMBDA(std::int64_t k) {
        const Scalar gk = decoupled ? g(k) : g(k) + wd * x(k);
        const Scalar m = b1 * mu(k) + (1 - b1) * gk;
        const Scalar v = b2 * nu(k) + (1 - b2) * gk * gk;
        mu(k) = m;
        nu(k) = v;
        Scalar u = (m / c1) / (::lather::Impl::kmath::sqrt(v / c2) + eps);
        if (decoupled) u += wd * x(k);
        x(k) -= lr * u;
      });
    }
  }
  ++m_step;
}

template <class ExecutionSpace, class Scalar>
StateMemoryReport FirstOrder<ExecutionSpace, Scalar>::memory_report() const {
  StateMemoryReport r;
  for (const auto& slot : m_state)
    for (const auto& v : slot) r.local_bytes += std::int64_t(v.size() * sizeof(Scalar));
  return r;
}

template <class ExecutionSpace, class Scalar>
auto FirstOrder<ExecutionSpace, Scalar>::state_arrays() -> std::vector<StateArray<memory_space>> {
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  StateArray<memory_space> step;
  step.name = "step";
  step.dtype = DType::int64;
  step.host_bytes = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      reinterpret_cast<char*>(&m_step_host), sizeof m_step_host);
  arrays.push_back(step);
  for (std::size_t s = 0; s < m_state.size(); ++s)
    for (std::size_t p = 0; p < m_state[s].size(); ++p) {
      StateArray<memory_space> a;
      a.name = "local/" + this->m_parameters[p].name + "/" + m_slot_names[s];
      a.dtype = dtype_of<Scalar>();
      a.shape = this->m_parameters[p].shape;
      a.parameter = int(p);
      a.device_bytes = as_bytes<memory_space>(m_state[s][p], m_state[s][p].size());
      arrays.push_back(a);
    }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> FirstOrder<ExecutionSpace, Scalar>::describe() const {
  switch (m_rule) {
    case Rule::sgd:
      return {{"optimizer", "sgd"}, {"learning_rate", m_sgd.learning_rate.describe()},
              {"momentum", Impl::to_text(m_sgd.momentum)}, {"nesterov", m_sgd.nesterov ? "true" : "false"},
              {"weight_decay", Impl::to_text(m_sgd.weight_decay)}};
    case Rule::adagrad:
      return {{"optimizer", "adagrad"}, {"learning_rate", m_adagrad.learning_rate.describe()},
              {"initial_accumulator_value", Impl::to_text(m_adagrad.initial_accumulator_value)},
              {"epsilon", Impl::to_text(m_adagrad.epsilon)}, {"weight_decay", Impl::to_text(m_adagrad.weight_decay)}};
    case Rule::adam:
      return {{"optimizer", name()}, {"learning_rate", m_adam.learning_rate.describe()},
              {"beta1", Impl::to_text(m_adam.beta1)}, {"beta2", Impl::to_text(m_adam.beta2)}, {"epsilon", Impl::to_text(m_adam.epsilon)},
              {"weight_decay", Impl::to_text(m_adam.weight_decay)}};
  }
  return {};
}

}  // namespace lather::optim
