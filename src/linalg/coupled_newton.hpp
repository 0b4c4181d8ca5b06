#pragma once
// The coupled Newton iteration for (A + ridge I)^(-1/p), batched over matrices of one size n and
// one exponent p, each matrix stopping on its own. Follows the JAX reference
// `matrix_inverse_pth_root` step for step:
//   alpha = -1/p, z = (1+p) / (2 ||A + ridge I||_F), M0 = z (A + ridge I), H0 = z^(1/p) I,
//   T = (1 - alpha) I + alpha M,  M <- T^p M,  H <- H T,  error = max |M - I|,
// stopping at the tolerance, at max_iterations, or when the error grows by max_error_ratio, in
// which case the previous H is returned with the error of the last iterate (the reference's rule).

#include "batched_gemm.hpp"
#include "root_kernels.hpp"

#include <lather/linalg/inverse_root.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace lather::linalg::Impl {

template <class ExecutionSpace, class C>
class CoupledNewton {
  using memory_space = typename ExecutionSpace::memory_space;
  using Stack = Stack3<C, memory_space>;
  using ConstStack = Stack3<const C, memory_space>;

 public:
  CoupledNewton(const ExecutionSpace& space, int capacity, int n, const InverseRootOptions& options)
      : m_space(space), m_capacity(capacity), m_n(n), m_options(options) {
    const auto alloc = [&](const std::string& label) {
      return Stack(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label), capacity, n, n);
    };
    m_m = {alloc("Lather::CoupledNewton::m_a"), alloc("Lather::CoupledNewton::m_b")};
    m_h = {alloc("Lather::CoupledNewton::h_a"), alloc("Lather::CoupledNewton::h_b")};
    m_scratch = {alloc("Lather::CoupledNewton::t"), alloc("Lather::CoupledNewton::power_a"),
                 alloc("Lather::CoupledNewton::power_b")};
    m_v = Array2<C, memory_space>("Lather::CoupledNewton::v", capacity, n);
    m_av = Array2<C, memory_space>("Lather::CoupledNewton::av", capacity, n);
    m_batched_max = options.batched_gemm_max_size >= 0 ? options.batched_gemm_max_size
                                                       : default_batched_gemm_max_size<ExecutionSpace>();
    const auto start = power_iteration_start_vector(n);
    m_start = Array1<C, memory_space>("Lather::CoupledNewton::start_vector", n);
    auto start_host = Kokkos::create_mirror_view(m_start);
    for (int i = 0; i < n; ++i) start_host(i) = C(start[i]);
    Kokkos::deep_copy(m_space, m_start, start_host);
    fence(m_space, "Lather::CoupledNewton: start vector uploaded");
  }

  /// Bytes of scratch one matrix of size n needs.
  static std::size_t bytes_per_matrix(int n) { return (7 * std::size_t(n) * n + 2 * n) * sizeof(C); }

  /// Solves tasks[positions[k]] for k in [0, positions.size()) (at most capacity at once); all have
  /// size n and exponent p. Fills the result entries at those positions.
  template <class S>
  void solve(const Stack3<const S, memory_space>& input, const Stack3<S, memory_space>& output,
             const std::vector<RootTask>& tasks, const std::vector<int>& positions, int p, InverseRootResult& result,
             GemmCount& count) {
    const int slots = int(positions.size());
    const int n = m_n;
    const auto& opt = m_options;

    std::vector<int> matrix_host(slots);
    for (int s = 0; s < slots; ++s) matrix_host[s] = tasks[positions[s]].index;
    const auto matrix_of = to_device("Lather::CoupledNewton::matrix_of", matrix_host);

    // Load and check the input.
    Array1<int, memory_space> nonfinite("Lather::CoupledNewton::nonfinite", slots);
    load_matrices<ExecutionSpace, S, C, memory_space>(m_space, input, matrix_of, slots, n, m_m[0], nonfinite);
    const auto nonfinite_host = to_host(nonfinite);
    std::vector<int> good;
    for (int s = 0; s < slots; ++s) {
      const int t = positions[s];
      result.iterations[t] = 0;
      if (nonfinite_host(s) != 0) {
        result.status[t] = RootStatus::non_finite;
        result.error[t] = std::numeric_limits<double>::infinity();
        result.lambda_max[t] = std::numeric_limits<double>::quiet_NaN();
        result.ridge[t] = std::numeric_limits<double>::quiet_NaN();
      } else {
        good.push_back(s);
      }
    }
    if (good.empty()) return;
    auto good_dev = to_device("Lather::CoupledNewton::good", good);

    // Ridge scaled by the largest eigenvalue (power iteration), as the reference does.
    Array1<C, memory_space> lambda("Lather::CoupledNewton::lambda", slots);
    if (opt.relative_ridge) {
      Array1<int, memory_space> power_iterations("Lather::CoupledNewton::power_iterations", slots);
      if constexpr (host_accessible<memory_space>) {
        fence(m_space, "Lather::CoupledNewton: matrices loaded");
        power_iteration_host<C, memory_space>(m_m[0], good, n, m_start, m_v, m_av, opt.power_iteration_max_iterations,
                                              C(opt.power_iteration_tolerance), lambda, power_iterations);
      } else {
        power_iteration<ExecutionSpace, C, memory_space>(m_space, m_m[0], good_dev, int(good.size()), n, m_start, m_v,
                                                         m_av, opt.power_iteration_max_iterations,
                                                         C(opt.power_iteration_tolerance), lambda, power_iterations);
      }
      const auto steps = to_host(power_iterations);
      for (int s : good) result.power_iterations[positions[s]] = steps(s);
    }
    const auto lambda_host = to_host(lambda);
    auto ridge_host = Kokkos::create_mirror_view(lambda);
    for (int s : good) {
      const double lambda_max = double(lambda_host(s));
      const double ridge = opt.relative_ridge ? opt.ridge_epsilon * std::max(lambda_max, 1e-6) : opt.ridge_epsilon;
      ridge_host(s) = C(ridge);
      result.lambda_max[positions[s]] = opt.relative_ridge ? lambda_max : std::nan("");
      result.ridge[positions[s]] = double(C(ridge));
    }
    Array1<C, memory_space> ridge("Lather::CoupledNewton::ridge", slots);
    Kokkos::deep_copy(m_space, ridge, ridge_host);

    Array1<C, memory_space> error("Lather::CoupledNewton::error", slots);
    // T lives in scratch 0 from here on: each error pass writes the next step's T.
    newton_start<ExecutionSpace, C, memory_space>(m_space, m_m[0], m_h[0], m_scratch[0], good_dev, int(good.size()), n,
                                                  p, ridge, error);
    auto error_host = to_host(error);
    std::vector<double> previous_error(slots);
    std::vector<int> active, done_new, done_old;
    for (int s : good) {
      previous_error[s] = double(error_host(s));
      if (!(previous_error[s] > opt.tolerance) || opt.max_iterations == 0)
        done_old.push_back(s);  // already converged (or no steps allowed): H0 is the answer
      else
        active.push_back(s);
      const int t = positions[s];
      result.error[t] = previous_error[s];
      result.status[t] = previous_error[s] > opt.tolerance ? RootStatus::max_iterations : RootStatus::converged;
    }
    int current = 0;
    store(done_old, m_h[current], matrix_of, output);

    while (!active.empty()) {
      const auto active_dev = to_device("Lather::CoupledNewton::active", active);
      const int count_active = int(active.size());
      const int next = 1 - current;
      const Stack& t_matrix = m_scratch[0];
      // H <- H T before T is consumed by the power.
      gemm_slots<ExecutionSpace, C, memory_space>(m_space, active, active_dev, m_h[current], t_matrix, m_h[next], n,
                                                  m_batched_max, count);
      const Stack power = matrix_power(active, active_dev, p, count);
      gemm_slots<ExecutionSpace, C, memory_space>(m_space, active, active_dev, power, m_m[current], m_m[next], n,
                                                  m_batched_max, count);
      newton_error_and_step<ExecutionSpace, C, memory_space>(m_space, m_m[next], m_scratch[0], active_dev, count_active,
                                                             n, p, error);
      Kokkos::deep_copy(m_space, error_host, error);
      fence(m_space, "Lather::CoupledNewton: errors on the host");

      std::vector<int> still_active;
      done_new.clear();
      done_old.clear();
      for (int s : active) {
        const int t = positions[s];
        const double e = double(error_host(s));
        result.iterations[t] += 1;
        const double ratio = e / previous_error[s];
        if (!(ratio < opt.max_error_ratio)) {
          // Grew too much, or NaN: the previous H is returned and, as in the reference, the
          // error reported is that of the last iterate, so a diverging root reads as failed.
          result.status[t] = RootStatus::diverged;
          result.error[t] = e;
          done_old.push_back(s);
        } else if (!(e > opt.tolerance)) {
          result.status[t] = RootStatus::converged;
          result.error[t] = e;
          done_new.push_back(s);
        } else if (result.iterations[t] >= opt.max_iterations) {
          result.status[t] = RootStatus::max_iterations;
          result.error[t] = e;
          done_new.push_back(s);
        } else {
          previous_error[s] = e;
          still_active.push_back(s);
        }
      }
      store(done_new, m_h[next], matrix_of, output);
      store(done_old, m_h[current], matrix_of, output);
      active.swap(still_active);
      // Active slots continue from the new iterates: swap the roles of the ping-pong buffers.
      current = next;
    }
  }

 private:
  Array1<const int, memory_space> to_device(const std::string& label, const std::vector<int>& values) const {
    Array1<int, memory_space> view(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), values.size());
    auto host = Kokkos::create_mirror_view(view);
    for (std::size_t k = 0; k < values.size(); ++k) host(k) = values[k];
    Kokkos::deep_copy(m_space, view, host);
    fence(m_space, "Lather::CoupledNewton: list uploaded");
    return view;
  }

  template <class View>
  typename View::HostMirror to_host(const View& view) const {
    auto host = Kokkos::create_mirror_view(view);
    Kokkos::deep_copy(m_space, host, view);
    fence(m_space, "Lather::CoupledNewton: values on the host");
    return host;
  }

  template <class S>
  void store(const std::vector<int>& slots, const Stack& h, const Array1<const int, memory_space>& matrix_of,
             const Stack3<S, memory_space>& output) const {
    if (slots.empty()) return;
    const auto slots_dev = to_device("Lather::CoupledNewton::finished", slots);
    store_roots<ExecutionSpace, S, C, memory_space>(m_space, h, slots_dev, int(slots.size()), matrix_of, m_n, output);
  }

  /// T^p by repeated squaring over the scratch buffers (T itself is consumed). Multiplications by
  /// the identity are skipped, so p = 2^k costs k GEMMs.
  Stack matrix_power(const std::vector<int>& slots_host, const Array1<const int, memory_space>& slots, int p,
                     GemmCount& count) {
    int base = 0, result = -1;
    const auto free_buffer = [&](int a, int b) {
      for (int k = 0; k < 3; ++k)
        if (k != a && k != b) return k;
      return -1;
    };
    for (;;) {
      if (p & 1) {
        if (result < 0) {
          result = base;
        } else {
          const int out = free_buffer(result, base);
          gemm_slots<ExecutionSpace, C, memory_space>(m_space, slots_host, slots, m_scratch[result], m_scratch[base],
                                                      m_scratch[out], m_n, m_batched_max, count);
          result = out;
        }
      }
      p >>= 1;
      if (p == 0) break;
      const int out = free_buffer(result, base);
      gemm_slots<ExecutionSpace, C, memory_space>(m_space, slots_host, slots, m_scratch[base], m_scratch[base],
                                                  m_scratch[out], m_n, m_batched_max, count);
      base = out;
    }
    return m_scratch[result];
  }

  ExecutionSpace m_space;
  int m_capacity;
  int m_n;
  InverseRootOptions m_options;
  int m_batched_max = 0;
  std::array<Stack, 2> m_m, m_h;
  std::array<Stack, 3> m_scratch;
  Array2<C, memory_space> m_v, m_av;
  Array1<C, memory_space> m_start;
};

}  // namespace lather::linalg::Impl
