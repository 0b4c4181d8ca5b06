#pragma once
// The implementation of FirstOrder, for explicit instantiation: src/optim/first_order.cpp
// instantiates it for lather::DefaultExecutionSpace (and the host space on device builds); a
// program that needs another execution space includes this header and uses the class as usual.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/first_order.hpp>

#include <cmath>
#include <sstream>

namespace lather::optim {

namespace Impl {

/// The three update rules over one run [begin, end) of contiguous elements, term by term as
/// optax defines them. The scalars are copied into locals and the arrays reached through restrict
/// pointers: stores to the float arrays then cannot alias the scalars, and the loop vectorises.
template <class Scalar, int Rule>  // Rule: 0 sgd, 1 adagrad, 2 adam
struct FirstOrderUpdate {
  Scalar lr = 0, b1 = 0, b2 = 0, eps = 0, wd = 0, c1 = 1, c2 = 1;
  bool nesterov = false, decoupled = false;
  Scalar* x = nullptr;
  const Scalar* g = nullptr;
  Scalar *s0 = nullptr, *s1 = nullptr;

  FirstOrderUpdate() = default;
  template <int Other>
  explicit FirstOrderUpdate(const FirstOrderUpdate<Scalar, Other>& o)
      : lr(o.lr),
        b1(o.b1),
        b2(o.b2),
        eps(o.eps),
        wd(o.wd),
        c1(o.c1),
        c2(o.c2),
        nesterov(o.nesterov),
        decoupled(o.decoupled),
        x(o.x),
        g(o.g),
        s0(o.s0),
        s1(o.s1) {}

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t begin, std::int64_t end) const {
    const Scalar lr_ = lr, b1_ = b1, b2_ = b2, eps_ = eps, wd_ = wd, c1_ = c1, c2_ = c2;
    Scalar* KOKKOS_RESTRICT x_ = x + begin;
    const Scalar* KOKKOS_RESTRICT g_ = g + begin;
    Scalar* KOKKOS_RESTRICT m_ = s0 + begin;
    const std::int64_t n = end - begin;
    if constexpr (Rule == 0) {  // SGD with momentum: m = g + mu m
      const bool nesterov_ = nesterov;
      for (std::int64_t k = 0; k < n; ++k) {
        const Scalar gk = g_[k] + wd_ * x_[k];
        const Scalar mk = gk + b1_ * m_[k];
        m_[k] = mk;
        x_[k] -= lr_ * (nesterov_ ? gk + b1_ * mk : mk);
      }
    } else if constexpr (Rule == 1) {  // AdaGrad
      for (std::int64_t k = 0; k < n; ++k) {
        const Scalar gk = g_[k] + wd_ * x_[k];
        const Scalar a = m_[k] + gk * gk;
        m_[k] = a;
        x_[k] -= lr_ * gk / ::lather::Impl::kmath::sqrt(a + eps_);
      }
    } else {  // Adam / AdamW
      Scalar* KOKKOS_RESTRICT v_ = s1 + begin;
      // Decoupled: weight decay joins the update; coupled: the gradient (wd 0: neither).
      const Scalar coupled = decoupled ? Scalar(0) : wd_, added = decoupled ? wd_ : Scalar(0);
      for (std::int64_t k = 0; k < n; ++k) {
        const Scalar xk = x_[k];
        const Scalar gk = g_[k] + coupled * xk;
        const Scalar m = b1_ * m_[k] + (1 - b1_) * gk;
        const Scalar v = b2_ * v_[k] + (1 - b2_) * gk * gk;
        m_[k] = m;
        v_[k] = v;
        const Scalar u = (m / c1_) / (::lather::Impl::kmath::sqrt(v / c2_) + eps_) + added * xk;
        x_[k] = xk - lr_ * u;
      }
    }
  }
};

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
  // Each slot of state is one buffer over all parameters, in parameter order: a step over
  // parameters whose values and gradients are contiguous too is one kernel.
  m_slot_names = slots;
  m_state.resize(slots.size());
  std::int64_t total = 0;
  for (const auto& spec : this->m_parameters) total += element_count(spec.shape);
  for (std::size_t s = 0; s < slots.size(); ++s) {
    const FlatTensor<Scalar, memory_space> buffer(Kokkos::view_alloc(space, "Lather::" + name() + "::" + slots[s]),
                                                  std::size_t(total));
    if (initial != 0) Kokkos::deep_copy(space, buffer, Scalar(initial));
    std::size_t offset = 0;
    for (const auto& spec : this->m_parameters) {
      const auto n = std::size_t(element_count(spec.shape));
      m_state[s].push_back(Kokkos::subview(buffer, std::make_pair(offset, offset + n)));
      offset += n;
    }
  }
}

template <class ExecutionSpace, class Scalar>
std::string FirstOrder<ExecutionSpace, Scalar>::name() const {
  switch (m_rule) {
    case Rule::sgd:
      return "sgd";
    case Rule::adagrad:
      return "adagrad";
    case Rule::adam:
      return m_adam.decoupled_weight_decay ? "adamw" : "adam";
  }
  return "sgd";
}

template <class ExecutionSpace, class Scalar>
void FirstOrder<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& params,
                                                 const Tensors& grads) {
  ::lather::Impl::ScopedRegion region("Lather::" + name() + "::step");
  const long t = m_step;
  Impl::FirstOrderUpdate<Scalar, 0> u;  // the scalars; the rule is chosen at the launch
  if (m_rule == Rule::sgd) {
    u.lr = Scalar(m_sgd.learning_rate(t)), u.b1 = Scalar(m_sgd.momentum), u.wd = Scalar(m_sgd.weight_decay);
    u.nesterov = m_sgd.nesterov;
  } else if (m_rule == Rule::adagrad) {
    u.lr = Scalar(m_adagrad.learning_rate(t)), u.eps = Scalar(m_adagrad.epsilon);
    u.wd = Scalar(m_adagrad.weight_decay);
  } else {
    const auto& o = m_adam;
    u.lr = Scalar(o.learning_rate(t)), u.b1 = Scalar(o.beta1), u.b2 = Scalar(o.beta2), u.eps = Scalar(o.epsilon);
    u.wd = Scalar(o.weight_decay);
    // optax.scale_by_adam's bias correction with the count after this update.
    u.c1 = Scalar(1 - std::pow(o.beta1, double(t + 1)));
    u.c2 = Scalar(1 - std::pow(o.beta2, double(t + 1)));
    u.decoupled = o.decoupled_weight_decay;
  }
  // One kernel per run of parameters whose values and gradients each lie one after the other in
  // memory (a ParameterList's buffers: the whole model in one pass), the state being contiguous.
  const auto follows = [](const auto& list, std::size_t p) {
    return list[p].data() == list[p - 1].data() + list[p - 1].extent(0);
  };
  for (std::size_t first = 0, end = 0; first < params.size(); first = end) {
    std::size_t elements = params[first].extent(0);
    for (end = first + 1; end < params.size() && follows(params, end) && follows(grads, end); ++end)
      elements += params[end].extent(0);
    u.x = params[first].data();
    u.g = grads[first].data();
    u.s0 = m_state[0][first].data();
    u.s1 = m_state.size() > 1 ? m_state[1][first].data() : nullptr;
    using ::lather::Impl::parallel_for_runs;
    if (m_rule == Rule::sgd)
      parallel_for_runs("Lather::sgd::update", space, std::int64_t(elements), u);
    else if (m_rule == Rule::adagrad)
      parallel_for_runs("Lather::adagrad::update", space, std::int64_t(elements), Impl::FirstOrderUpdate<Scalar, 1>(u));
    else
      parallel_for_runs("Lather::adam::update", space, std::int64_t(elements), Impl::FirstOrderUpdate<Scalar, 2>(u));
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
auto FirstOrder<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace&) -> std::vector<StateArray<memory_space>> {
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  arrays.push_back(step_array<memory_space>(m_step_host));
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
      return {{"optimizer", "sgd"},
              {"learning_rate", m_sgd.learning_rate.describe()},
              {"momentum", ::lather::Impl::concat(m_sgd.momentum)},
              {"nesterov", m_sgd.nesterov ? "true" : "false"},
              {"weight_decay", ::lather::Impl::concat(m_sgd.weight_decay)}};
    case Rule::adagrad:
      return {{"optimizer", "adagrad"},
              {"learning_rate", m_adagrad.learning_rate.describe()},
              {"initial_accumulator_value", ::lather::Impl::concat(m_adagrad.initial_accumulator_value)},
              {"epsilon", ::lather::Impl::concat(m_adagrad.epsilon)},
              {"weight_decay", ::lather::Impl::concat(m_adagrad.weight_decay)}};
    case Rule::adam:
      return {{"optimizer", name()},
              {"learning_rate", m_adam.learning_rate.describe()},
              {"beta1", ::lather::Impl::concat(m_adam.beta1)},
              {"beta2", ::lather::Impl::concat(m_adam.beta2)},
              {"epsilon", ::lather::Impl::concat(m_adam.epsilon)},
              {"weight_decay", ::lather::Impl::concat(m_adam.weight_decay)}};
  }
  return {};
}

}  // namespace lather::optim
