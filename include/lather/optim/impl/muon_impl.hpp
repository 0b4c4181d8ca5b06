#pragma once
// The implementation of Muon, for explicit instantiation: src/optim/muon.cpp instantiates it for
// lather::DefaultExecutionSpace (and the host space on device builds); a program that needs
// another execution space includes this header. The Newton-Schulz orthogonalization is here too
// (Impl::newton_schulz), for tests and for other optimizers built on it.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/gemm.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/optim/impl/finite_gradients.hpp>
#include <lather/optim/impl/group_agreement.hpp>
#include <lather/optim/muon.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace lather::optim::Impl {

template <class Scalar, class MemorySpace>
using MuonMatrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Scratch of the Newton-Schulz iteration for matrices up to r x c (r <= c): the iterate and
/// the next one (r c each), the Gram matrix A = X X^T and the polynomial b A + c A A (r r each);
/// at a reduced `precision`, where the backend does not round the products' inputs itself, their
/// rounded copies (r r + r c: B and X of B X).
template <class ExecutionSpace, class Scalar>
struct NewtonSchulzWorkspace {
  using memory_space = typename ExecutionSpace::memory_space;
  Kokkos::View<Scalar*, memory_space> x, y, a, b, rounded;
  Kokkos::View<double, memory_space> sum_of_squares;  // stays on the device: no host round trip

  void reserve(const ExecutionSpace& space, std::int64_t wide_elements, std::int64_t gram_elements,
               ProductPrecision precision = ProductPrecision::float32) {
    const auto grow = [&](auto& view, std::int64_t n, const char* what) {
      if (std::int64_t(view.extent(0)) >= n) return;
      view = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("Lather::Muon::newton_schulz::") + what),
          std::size_t(n));
    };
    grow(x, wide_elements, "iterate");
    grow(y, wide_elements, "next_iterate");
    grow(a, gram_elements, "gram");
    grow(b, gram_elements, "polynomial");
    if (precision != ProductPrecision::float32 && !::lather::Impl::rounds_inputs_itself<ExecutionSpace, Scalar>())
      grow(rounded, wide_elements + gram_elements, "rounded_inputs");
    if (!sum_of_squares.data())
      sum_of_squares = Kokkos::View<double, memory_space>(Kokkos::view_alloc(space, "Lather::Muon::sum_of_squares"));
  }
  std::int64_t bytes() const {
    return std::int64_t((x.size() + y.size() + a.size() + b.size() + rounded.size()) * sizeof(Scalar));
  }
};

/// Throws lather::Error unless MuonOptions::newton_schulz_precision applies to Scalar (reduced
/// precisions round float products).
template <class Scalar>
void require_newton_schulz_precision(const MuonOptions& options) {
  LATHER_REQUIRE((std::is_same<Scalar, float>::value || options.newton_schulz_precision == ProductPrecision::float32),
                 "MuonOptions::newton_schulz_precision ", to_string(options.newton_schulz_precision),
                 " rounds float products; this Muon computes in double (use float32)");
}

/// Orthogonalizes the r x c matrix (r <= c) that the caller wrote to ws.x, as optax's
/// orthogonalize_via_newton_schulz after its transposition: X /= ||X||_F + eps, then `steps`
/// times X <- a X + (b A + c A A) X with A = X X^T, three GEMMs per step, their inputs rounded
/// to `precision` (the terms b A and a X are added in float32). Returns the View (in ws.x or
/// ws.y) that holds the result.
template <class ExecutionSpace, class Scalar>
MuonMatrix<Scalar, typename ExecutionSpace::memory_space> orthogonalize_wide(
    const ExecutionSpace& space, NewtonSchulzWorkspace<ExecutionSpace, Scalar>& ws, std::int64_t r, std::int64_t c,
    const std::array<double, 3>& coefficients, int steps, double epsilon,
    ProductPrecision precision = ProductPrecision::float32) {
  using memory_space = typename ExecutionSpace::memory_space;
  using Matrix = MuonMatrix<Scalar, memory_space>;
  LATHER_REQUIRE(r <= c && std::int64_t(ws.x.extent(0)) >= r * c && std::int64_t(ws.a.extent(0)) >= r * r,
                 "Muon::newton_schulz: workspace too small for ", r, " x ", c);
  const std::int64_t n = r * c;
  Scalar* x = ws.x.data();
  Scalar* y = ws.y.data();
  {
    // Frobenius normalisation, the sum accumulated in double (the reference sums in float32: its
    // relative error, ~1e-7 here, is far below what the comparison allows).
    const auto sum = ws.sum_of_squares;
    const Scalar* xc = x;
    Kokkos::parallel_reduce(
        "Lather::Muon::frobenius_norm", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n),
        KOKKOS_LAMBDA(std::int64_t k, double& s) { s += double(xc[k]) * double(xc[k]); }, sum);
    const Scalar eps = Scalar(epsilon);
    Kokkos::parallel_for(
        "Lather::Muon::normalize", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n), KOKKOS_LAMBDA(std::int64_t k) {
          // As the reference: the norm rounded to Scalar, plus eps, then one division.
          x[k] = x[k] / (Scalar(::lather::Impl::kmath::sqrt(sum())) + eps);
        });
  }
  const Scalar ca = Scalar(coefficients[0]), cb = Scalar(coefficients[1]), cc = Scalar(coefficients[2]);
  const Matrix a(ws.a.data(), r, r), b(ws.b.data(), r, r);
  const auto flat = [](Scalar* p, std::int64_t count) {
    return Kokkos::View<Scalar*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(p, std::size_t(count));
  };
  for (int step = 0; step < steps; ++step) {
    const Matrix xm(x, r, c), ym(y, r, c);
    ::lather::Impl::gemm(space, precision, ws.rounded, "N", "T", Scalar(1), xm, xm, Scalar(0), a);  // A = X X^T
    Kokkos::deep_copy(space, flat(b.data(), r * r), flat(a.data(), r * r));
    ::lather::Impl::gemm(space, precision, ws.rounded, "N", "N", cc, a, a, cb, b);  // B = c A A + b A
    Kokkos::deep_copy(space, flat(y, n), flat(x, n));
    ::lather::Impl::gemm(space, precision, ws.rounded, "N", "N", Scalar(1), b, xm, ca, ym);  // Y = B X + a X
    std::swap(x, y);
  }
  return Matrix(x, r, c);
}

/// out := the Newton-Schulz orthogonalization of `in` (m x n, row-major, both in the execution
/// space's memory; they may be the same View), transposed to m <= n for the iteration and back,
/// as optax.contrib's orthogonalize_via_newton_schulz (Frobenius preconditioning); the products'
/// inputs rounded to `precision`.
template <class ExecutionSpace, class Scalar>
void newton_schulz(const ExecutionSpace& space,
                   const MuonMatrix<const Scalar, typename ExecutionSpace::memory_space>& in,
                   const MuonMatrix<Scalar, typename ExecutionSpace::memory_space>& out,
                   const std::array<double, 3>& coefficients, int steps, double epsilon,
                   NewtonSchulzWorkspace<ExecutionSpace, Scalar>& ws,
                   ProductPrecision precision = ProductPrecision::float32) {
  const std::int64_t m = std::int64_t(in.extent(0)), n = std::int64_t(in.extent(1));
  LATHER_REQUIRE(std::int64_t(out.extent(0)) == m && std::int64_t(out.extent(1)) == n,
                 "Muon::newton_schulz: output is ", out.extent(0), " x ", out.extent(1), ", input ", m, " x ", n);
  const bool transposed = m > n;
  const std::int64_t r = std::min(m, n), c = std::max(m, n);
  ws.reserve(space, r * c, r * r, precision);
  Scalar* x = ws.x.data();
  Kokkos::parallel_for(
      "Lather::Muon::newton_schulz_in", Kokkos::RangePolicy<ExecutionSpace>(space, 0, m * n),
      KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t i = k / n, j = k % n;
        x[transposed ? j * m + i : k] = in(i, j);
      });
  const auto result = orthogonalize_wide(space, ws, r, c, coefficients, steps, epsilon, precision);
  Kokkos::parallel_for(
      "Lather::Muon::newton_schulz_out", Kokkos::RangePolicy<ExecutionSpace>(space, 0, m * n),
      KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t i = k / n, j = k % n;
        out(i, j) = transposed ? result(j, i) : result(i, j);
      });
}

/// optax.adamw (optax.scale_by_adam, Nesterov optional, then decoupled weight decay and -lr) on
/// one parameter, element by element; the moments are updated in place.
template <class ExecutionSpace, class Scalar>
struct AdamWStep {
  Scalar b1, b2, one_b1, one_b2, eps, eps_root, wd, lr;
  Scalar c1, c1_next, c2;  // 1 - b1^t, 1 - b1^(t+1), 1 - b2^t for update t (1-based)
  bool nesterov;
  void operator()(const ExecutionSpace& space, Scalar* x, const Scalar* g, Scalar* mu, Scalar* nu,
                  std::int64_t n) const {
    const AdamWStep s = *this;
    Kokkos::parallel_for(
        "Lather::Muon::adamw", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n), KOKKOS_LAMBDA(std::int64_t k) {
          const Scalar gk = g[k], xk = x[k];
          const Scalar m = s.one_b1 * gk + s.b1 * mu[k];
          const Scalar v = s.one_b2 * (gk * gk) + s.b2 * nu[k];
          mu[k] = m;
          nu[k] = v;
          const Scalar m_hat = s.nesterov ? s.b1 * (m / s.c1_next) + s.one_b1 * (gk / s.c1) : m / s.c1;
          const Scalar u = m_hat / (::lather::Impl::kmath::sqrt(v / s.c2 + s.eps_root) + s.eps) + s.wd * xk;
          x[k] = xk - s.lr * u;
        });
  }
};

/// optax's bias correction 1 - beta^count, computed as it does: in Scalar from Scalar(beta) (for
/// beta2 = 0.999 the float32 and the double value differ by 1e-5 relative).
template <class Scalar>
Scalar bias_correction(double beta, long count) {
  return Scalar(1) - std::pow(Scalar(beta), Scalar(count));
}

/// Muon's AdamW of update t + 1 (t updates done) at learning rate lr.
template <class ExecutionSpace, class Scalar>
AdamWStep<ExecutionSpace, Scalar> muon_adamw_step(const MuonOptions& o, Scalar lr, long t) {
  return {Scalar(o.adam_beta1),
          Scalar(o.adam_beta2),
          Scalar(1 - o.adam_beta1),
          Scalar(1 - o.adam_beta2),
          Scalar(o.adam_epsilon),
          Scalar(o.adam_epsilon_root),
          Scalar(o.adam_weight_decay),
          lr,
          bias_correction<Scalar>(o.adam_beta1, t + 1),
          bias_correction<Scalar>(o.adam_beta1, t + 2),
          bias_correction<Scalar>(o.adam_beta2, t + 1),
          o.nesterov};
}

/// The Muon momentum of rows x cols elements (row-major) and its bias-corrected (Nesterov)
/// estimate, written to `wide` transposed when `transposed` (the iterate of a whole m x n matrix
/// in the orientation the iteration needs: m > n), else as they lie (a band of rows).
template <class ExecutionSpace, class Scalar>
void muon_momentum(const ExecutionSpace& space, const Scalar* g, Scalar* mu, Scalar* wide, std::int64_t rows,
                   std::int64_t cols, Scalar beta, Scalar one_beta, Scalar c, Scalar c_next, bool nesterov,
                   bool transposed) {
  Kokkos::parallel_for(
      "Lather::Muon::momentum", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * cols),
      KOKKOS_LAMBDA(std::int64_t k) {
        const Scalar gk = g[k];
        const Scalar m = one_beta * gk + beta * mu[k];
        mu[k] = m;
        const Scalar hat = nesterov ? beta * (m / c_next) + one_beta * (gk / c) : m / c;
        wide[transposed ? (k % cols) * rows + k / cols : k] = hat;
      });
}

/// x := x - lr (scale O + wd x) for rows x cols values and the orthogonalized O in `result`:
/// transposed (the wide orientation of a whole m x n matrix, m > n) when `transposed`, else as x
/// lies (a band of rows); the new values also to `copy` when not null (this rank's part of the
/// all-gather).
template <class ExecutionSpace, class Scalar>
void muon_update(const ExecutionSpace& space, Scalar* x, Scalar* copy,
                 const MuonMatrix<Scalar, typename ExecutionSpace::memory_space>& result, std::int64_t rows,
                 std::int64_t cols, Scalar lr, Scalar scale, Scalar wd, bool transposed) {
  Kokkos::parallel_for(
      "Lather::Muon::update", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows * cols),
      KOKKOS_LAMBDA(std::int64_t k) {
        const std::int64_t i = k / cols, j = k % cols;
        const Scalar ok = transposed ? result(j, i) : result(i, j);
        const Scalar xk = x[k];
        // optax: updates = scale O + wd p; p + (-lr) updates, which rounds as p - lr updates.
        const Scalar updated = xk - lr * (scale * ok + wd * xk);
        x[k] = updated;
        if (copy) copy[k] = updated;
      });
}

/// optax.contrib.scale_by_shape's width scaling sqrt(max(1, fan_out / fan_in)) of a rows x cols
/// matrix: fan_in the rows (reduction axis 0), fan_out the product of the other dimensions.
template <class Scalar>
Scalar muon_scale(std::int64_t rows, std::int64_t cols) {
  return Scalar(std::sqrt(std::max(1.0, double(cols) / double(rows))));
}

/// Muon's update t + 1 (t updates done) of one whole rows x cols matrix: its momentum into the
/// iterate, the Newton-Schulz iteration in `ws`, the new values (also to `copy` when not null).
template <class ExecutionSpace, class Scalar>
void muon_matrix_step(const ExecutionSpace& space, const MuonOptions& o,
                      NewtonSchulzWorkspace<ExecutionSpace, Scalar>& ws, const Scalar* g, Scalar* mu, Scalar* x,
                      Scalar* copy, std::int64_t rows, std::int64_t cols, long t, Scalar lr) {
  const bool transposed = rows > cols;
  muon_momentum(space, g, mu, ws.x.data(), rows, cols, Scalar(o.beta), Scalar(1 - o.beta),
                bias_correction<Scalar>(o.beta, t + 1), bias_correction<Scalar>(o.beta, t + 2), o.nesterov, transposed);
  const auto result = orthogonalize_wide(space, ws, std::min(rows, cols), std::max(rows, cols), o.ns_coefficients,
                                         o.ns_steps, o.epsilon, o.newton_schulz_precision);
  muon_update(space, x, copy, result, rows, cols, lr, muon_scale<Scalar>(rows, cols), Scalar(o.weight_decay),
              transposed);
}

/// What one rank keeps besides the options: momentum of its own matrices, AdamW moments of every
/// AdamW parameter, the Newton-Schulz scratch and (distributed) the all-gather buffer.
template <class ExecutionSpace, class Scalar>
struct MuonState {
  using memory_space = typename ExecutionSpace::memory_space;
  using Flat = Kokkos::View<Scalar*, memory_space>;
  std::vector<Flat> momentum;          // [parameter]: own matrices only
  std::vector<Flat> adam_mu, adam_nu;  // [parameter]: AdamW parameters only
  NewtonSchulzWorkspace<ExecutionSpace, Scalar> ws;
  // Distributed: the exchange buffer holds, in rank r's segment, its matrices' new values in
  // parameter order; `offset[p]` is where matrix p lies in it. state_gathered: the same layout,
  // for the momentum that state_arrays() gathers.
  Flat state_gathered;
  std::vector<std::int64_t> offset;
};

}  // namespace lather::optim::Impl

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
Muon<ExecutionSpace, Scalar>::Muon(const ExecutionSpace& space, std::vector<ParameterSpec> parameters,
                                   MuonOptions options, const comm::Group& group)
    : Optimizer<ExecutionSpace, Scalar>(std::move(parameters),
                                        typename Optimizer<ExecutionSpace, Scalar>::ValidateLater()),
      m_options(std::move(options)),
      m_group(group),
      m_distributor(make_distributor<ExecutionSpace, Scalar>(Placement::distributed, group)),
      m_state(std::make_unique<Impl::MuonState<ExecutionSpace, Scalar>>()) {
  const int ranks = m_distributor->parts(), rank = m_distributor->part();
  auto& st = *m_state;
  const std::size_t count = this->m_parameters.size();
  // Options, plan and allocations may fail on one rank only (a rank given other options or
  // parameters, memory): the ranks agree on it, with the check that they hold the same
  // parameters and options, before any of them can reach a step's collective.
  const std::string local_error = ::lather::Impl::local_failure("muon.construct", [&] {
    this->validate_parameters();
    m_options.validate();
    Impl::require_newton_schulz_precision<Scalar>(m_options);
    // The owners of the matrices: the distributor's assignment by Newton-Schulz cost.
    m_plan = plan_muon(this->m_parameters, m_options,
                       [this](const std::vector<double>& costs) { return m_distributor->assign(costs); });
    st.momentum.resize(count);
    st.adam_mu.resize(count);
    st.adam_nu.resize(count);
    st.offset.assign(count, -1);
    std::vector<std::int64_t> part_elements(std::size_t(ranks), 0);
    std::int64_t wide = 0, gram = 0;
    for (std::size_t p = 0; p < count; ++p) {
      const auto& plan = m_plan[p];
      const auto& name = this->m_parameters[p].name;
      const std::size_t n = std::size_t(element_count(this->m_parameters[p].shape));
      if (!plan.matrix) {
        st.adam_mu[p] = typename Impl::MuonState<ExecutionSpace, Scalar>::Flat(
            Kokkos::view_alloc(space, "Lather::Muon::adam_mu::" + name), n);
        st.adam_nu[p] = typename Impl::MuonState<ExecutionSpace, Scalar>::Flat(
            Kokkos::view_alloc(space, "Lather::Muon::adam_nu::" + name), n);
        continue;
      }
      part_elements[std::size_t(plan.owner)] += std::int64_t(n);
      if (plan.owner != rank) continue;
      st.momentum[p] = typename Impl::MuonState<ExecutionSpace, Scalar>::Flat(
          Kokkos::view_alloc(space, "Lather::Muon::momentum::" + name), n);
      const std::int64_t r = std::min(plan.rows, plan.columns);
      wide = std::max(wide, plan.rows * plan.columns);
      gram = std::max(gram, r * r);
    }
    st.ws.reserve(space, wide, gram, m_options.newton_schulz_precision);
    // Each part's matrices lie in parameter order (the exchange by layers takes ranges of them).
    std::vector<std::vector<std::int64_t>> starts(std::size_t(ranks), std::vector<std::int64_t>(1, 0));
    for (std::size_t p = 0; p < count; ++p)
      for (int r = 0; r < ranks; ++r)
        starts[std::size_t(r)].push_back(starts[std::size_t(r)].back() + (m_plan[p].matrix && m_plan[p].owner == r
                                                                              ? m_plan[p].rows * m_plan[p].columns
                                                                              : 0));
    m_distributor->lay_out(space, part_elements, "Lather::Muon::gathered", std::move(starts));
    if (!distributed()) return;
    std::vector<std::int64_t> next;
    for (int r = 0; r < ranks; ++r) next.push_back(m_distributor->offset(r));
    for (std::size_t p = 0; p < count; ++p)
      if (m_plan[p].matrix) {
        st.offset[p] = next[std::size_t(m_plan[p].owner)];
        next[std::size_t(m_plan[p].owner)] += m_plan[p].rows * m_plan[p].columns;
      }
  });
  if (ranks == 1) {
    if (!local_error.empty()) throw Error(local_error, nullptr, 0);
    return;
  }
  Impl::agree_on_construction(m_group, "Muon", this->m_parameters, describe(), local_error);
}

template <class ExecutionSpace, class Scalar>
Muon<ExecutionSpace, Scalar>::~Muon() = default;

template <class ExecutionSpace, class Scalar>
void Muon<ExecutionSpace, Scalar>::do_step(const ExecutionSpace& space, const Tensors& values, const Tensors& grads) {
  ::lather::Impl::ScopedRegion region("Lather::Muon::step");
  auto& st = *m_state;
  const auto& o = m_options;
  const long t = m_step;  // updates done so far; this is update t + 1
  const Scalar lr = Scalar(o.learning_rate(t));
  values_needed(space);  // the last step's exchange by layers, where the forward left any

  // A NaN or Inf in any rank's gradient, before AdamW's moments or the momentum move: a rank's
  // share reads only its own matrices, so every rank scans its whole gradient and the group agrees
  // (distributed: one agreement, a collective of its own, since AdamW changes state before any
  // other).
  const int bad = Impl::first_non_finite(space, grads);
  m_distributor->agree(
      "Muon::step " + std::to_string(t),
      bad < 0 ? std::string() : Impl::non_finite_gradient_message(this->m_parameters[std::size_t(bad)].name));

  // AdamW parameters: updated on every rank alike.
  const auto adamw = Impl::muon_adamw_step<ExecutionSpace, Scalar>(o, lr, t);
  for (std::size_t p = 0; p < values.size(); ++p)
    if (!m_plan[p].matrix)
      adamw(space, values[p].data(), grads[p].data(), st.adam_mu[p].data(), st.adam_nu[p].data(),
            std::int64_t(values[p].extent(0)));

  // Muon matrices: this rank's own (all of them on one rank).
  const int rank = m_group.rank();
  const auto own_share = [&] {
    ::lather::Impl::fault_point("muon.distributed_step");
    for (std::size_t p = 0; p < values.size(); ++p) {
      const auto& plan = m_plan[p];
      if (!plan.matrix || plan.owner != rank) continue;
      // Distributed, the new values also go to this rank's segment of the exchange.
      Scalar* copy = distributed() ? m_distributor->buffer().data() + st.offset[p] : nullptr;
      Impl::muon_matrix_step(space, o, st.ws, grads[p].data(), st.momentum[p].data(), values[p].data(), copy, plan.rows,
                             plan.columns, t, lr);
    }
  };
  if (!distributed()) {
    own_share();
    ++m_step;
    return;
  }
  const std::string local_error = m_distributor->run_share(nullptr, own_share);
  m_exchanged = values;
  const bool in_flight = m_distributor->start_exchange(space, local_error, "Muon::step " + std::to_string(t));
  ++m_step;
  if (!in_flight) values_needed(space);
}

template <class ExecutionSpace, class Scalar>
void Muon<ExecutionSpace, Scalar>::unpack_matrices(const ExecutionSpace& space, const Tensors& values,
                                                   std::size_t first, std::size_t last) {
  const auto& st = *m_state;
  for (std::size_t p = first; p < last; ++p) {
    if (!m_plan[p].matrix || m_plan[p].owner == m_group.rank()) continue;
    const auto at = std::size_t(st.offset[p]);
    Kokkos::deep_copy(space, values[p],
                      Kokkos::subview(m_distributor->buffer(), std::make_pair(at, at + values[p].extent(0))));
  }
}

template <class ExecutionSpace, class Scalar>
bool Muon<ExecutionSpace, Scalar>::overlap_exchange(const ExecutionSpace&,
                                                    std::vector<std::pair<std::size_t, std::size_t>> layers) {
  return m_distributor->set_layers(std::move(layers), this->m_parameters.size());
}

template <class ExecutionSpace, class Scalar>
void Muon<ExecutionSpace, Scalar>::values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) {
  m_distributor->complete(first, last,
                          [&](std::size_t begin, std::size_t end) { unpack_matrices(space, m_exchanged, begin, end); });
}

template <class ExecutionSpace, class Scalar>
StateMemoryReport Muon<ExecutionSpace, Scalar>::memory_report() const {
  const auto& st = *m_state;
  StateMemoryReport r;
  for (std::size_t p = 0; p < m_plan.size(); ++p)
    r.local_bytes +=
        std::int64_t((st.momentum[p].size() + st.adam_mu[p].size() + st.adam_nu[p].size()) * sizeof(Scalar));
  r.workspace_bytes =
      st.ws.bytes() + std::int64_t((m_distributor->buffer().size() + st.state_gathered.size()) * sizeof(Scalar));
  return r;
}

template <class ExecutionSpace, class Scalar>
auto Muon<ExecutionSpace, Scalar>::state_arrays(const ExecutionSpace& space) -> std::vector<StateArray<memory_space>> {
  auto& st = *m_state;
  const int rank = m_group.rank();
  values_needed(space);  // the step buffer is free again
  if (distributed()) {
    // Every matrix's momentum to every rank: each rank packs its own into its segment of a buffer
    // laid out as the step's exchange, then one exchange (with the failure flag).
    const std::string local_error = ::lather::Impl::local_failure("muon.state_gather", [&] {
      if (!st.state_gathered.data())
        st.state_gathered = m_distributor->make_buffer(space, "Lather::Muon::state_gathered");
      for (std::size_t p = 0; p < m_plan.size(); ++p)
        if (m_plan[p].matrix && m_plan[p].owner == rank) Kokkos::deep_copy(space, state_view(p), st.momentum[p]);
    });
    if (!st.state_gathered.data()) {  // this rank failed to allocate: take part with the step buffer
      m_distributor->exchange(space, local_error, "Muon::state_arrays");
    } else {
      m_distributor->exchange(space, local_error, "Muon::state_arrays", st.state_gathered);
    }
  }
  std::vector<StateArray<memory_space>> arrays;
  m_step_host = m_step;
  arrays.push_back(step_array<memory_space>(m_step_host, rank == 0));
  for (std::size_t p = 0; p < m_plan.size(); ++p) {
    const auto& spec = this->m_parameters[p];
    const auto add = [&](const std::string& slot, const Kokkos::View<Scalar*, memory_space>& view) {
      StateArray<memory_space> a;
      a.name = "local/" + spec.name + "/" + slot;
      a.dtype = dtype_of<Scalar>();
      a.shape = spec.shape;
      a.parameter = int(p);
      a.writer = true;  // the same on every rank of the group: each writes a share of it
      a.device_bytes = as_bytes<memory_space>(view, view.size());
      arrays.push_back(a);
    };
    if (!m_plan[p].matrix) {
      add("adam_mu", st.adam_mu[p]);
      add("adam_nu", st.adam_nu[p]);
    } else {
      add("momentum", distributed() ? state_view(p) : st.momentum[p]);
    }
  }
  return arrays;
}

template <class ExecutionSpace, class Scalar>
auto Muon<ExecutionSpace, Scalar>::state_view(std::size_t p) const -> Kokkos::View<Scalar*, memory_space> {
  const auto& st = *m_state;
  const auto first = std::size_t(st.offset[p]);
  return Kokkos::subview(st.state_gathered,
                         std::make_pair(first, first + std::size_t(m_plan[p].rows * m_plan[p].columns)));
}

template <class ExecutionSpace, class Scalar>
void Muon<ExecutionSpace, Scalar>::state_restored(const ExecutionSpace& space, long step_count) {
  m_step = step_count;
  auto& st = *m_state;
  if (distributed() && st.state_gathered.data()) {
    // The filled arrays back into this rank's own momentum.
    for (std::size_t p = 0; p < m_plan.size(); ++p)
      if (m_plan[p].matrix && m_plan[p].owner == m_group.rank())
        Kokkos::deep_copy(space, st.momentum[p], state_view(p));
    ::lather::Impl::fence(space, "Lather::Muon: state restored");
  }
  state_released();
}

template <class ExecutionSpace, class Scalar>
void Muon<ExecutionSpace, Scalar>::state_released() {
  m_state->state_gathered = Kokkos::View<Scalar*, memory_space>();
}

template <class ExecutionSpace, class Scalar>
std::vector<std::pair<std::string, std::string>> Muon<ExecutionSpace, Scalar>::describe() const {
  return describe_muon(m_options);
}

}  // namespace lather::optim
