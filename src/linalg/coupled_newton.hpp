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
#include <tuple>
#include <utility>
#include <vector>

namespace lather::linalg::Impl {

template <class ExecutionSpace, class C>
class CoupledNewton {
  using memory_space = typename ExecutionSpace::memory_space;
  using Stack = Stack3<C, memory_space>;
  using ConstStack = Stack3<const C, memory_space>;
  using List = Array1<int, memory_space>;

 public:
  /// `team_power_iteration`: the power iteration as one team per matrix (a device's way) even
  /// where the memory is the host's, whose own way is BLAS gemv one matrix at a time.
  CoupledNewton(const ExecutionSpace& space, int capacity, int n, const InverseRootOptions& options,
                bool team_power_iteration = !host_accessible<typename ExecutionSpace::memory_space>)
      : m_space(space), m_capacity(capacity), m_n(n), m_options(options), m_team_power_iteration(team_power_iteration) {
    const auto alloc = [&](const std::string& label) {
      return Stack(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label), capacity, n, n);
    };
    m_m = {alloc("Lather::CoupledNewton::m_a"), alloc("Lather::CoupledNewton::m_b")};
    m_h = {alloc("Lather::CoupledNewton::h_a"), alloc("Lather::CoupledNewton::h_b")};
    m_scratch = {alloc("Lather::CoupledNewton::t"), alloc("Lather::CoupledNewton::power_a"),
                 alloc("Lather::CoupledNewton::power_b")};
    m_v = Array2<C, memory_space>("Lather::CoupledNewton::v", capacity, n);
    m_av = Array2<C, memory_space>("Lather::CoupledNewton::av", capacity, n);
    // The per-slot lists and scalars live as long as the solver: an allocation on a device is a
    // synchronising call, and the iteration would otherwise make several per step.
    const auto list = [&](const std::string& label) {
      List view(Kokkos::view_alloc(space, label), capacity);
      return std::make_pair(view, Kokkos::create_mirror_view(view));
    };
    std::tie(m_matrix_of, m_matrix_of_host) = list("Lather::CoupledNewton::matrix_of");
    std::tie(m_good, m_good_host) = list("Lather::CoupledNewton::good");
    std::tie(m_active, m_active_host) = list("Lather::CoupledNewton::active");
    for (int b = 0; b < 2; ++b) std::tie(m_finished[b], m_finished_host[b]) = list("Lather::CoupledNewton::finished");
    std::tie(m_nonfinite, m_nonfinite_host) = list("Lather::CoupledNewton::nonfinite");
    std::tie(m_power_iterations, m_power_iterations_host) = list("Lather::CoupledNewton::power_iterations");
    m_lambda =
        Array1<C, memory_space>(Kokkos::view_alloc(space, std::string("Lather::CoupledNewton::lambda")), capacity);
    m_ridge = Array1<C, memory_space>(Kokkos::view_alloc(space, std::string("Lather::CoupledNewton::ridge")), capacity);
    m_error = Array1<C, memory_space>(Kokkos::view_alloc(space, std::string("Lather::CoupledNewton::error")), capacity);
    m_lambda_host = Kokkos::create_mirror_view(m_lambda);
    m_ridge_host = Kokkos::create_mirror_view(m_ridge);
    m_error_host = Kokkos::create_mirror_view(m_error);
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
  ///
  /// The host waits on the space once to learn which inputs are finite, once for the start's
  /// errors (with lambda_max), and once per Newton step for its errors, which decide which slots go
  /// on; nothing else in the loop waits or allocates. The roots are written once, at the end, from
  /// whichever of the two H buffers holds each slot's answer (a finished slot's buffer is no longer
  /// written: the products touch only the active slots).
  template <class S>
  void solve(const Stack3<const S, memory_space>& input, const Stack3<S, memory_space>& output,
             const std::vector<RootTask>& tasks, const std::vector<int>& positions, int p, InverseRootResult& result,
             GemmCount& count) {
    const int slots = int(positions.size());
    LATHER_REQUIRE(slots <= m_capacity, "CoupledNewton::solve: ", slots, " matrices for a capacity of ", m_capacity);
    const int n = m_n;
    const auto& opt = m_options;

    for (int s = 0; s < slots; ++s) m_matrix_of_host(s) = tasks[positions[s]].index;
    Kokkos::deep_copy(m_space, m_matrix_of, m_matrix_of_host);

    // Load and check the input.
    load_matrices<ExecutionSpace, S, C, memory_space>(m_space, input, m_matrix_of, slots, n, m_m[0], m_nonfinite);
    Kokkos::deep_copy(m_space, m_nonfinite_host, m_nonfinite);
    fence(m_space, "Lather::CoupledNewton: finite inputs known");
    std::vector<int> good;
    for (int s = 0; s < slots; ++s) {
      const int t = positions[s];
      result.iterations[t] = 0;
      if (m_nonfinite_host(s) != 0) {
        result.status[t] = RootStatus::non_finite;
        result.error[t] = std::numeric_limits<double>::infinity();
        result.lambda_max[t] = std::numeric_limits<double>::quiet_NaN();
        result.ridge[t] = std::numeric_limits<double>::quiet_NaN();
      } else {
        good.push_back(s);
      }
    }
    if (good.empty()) return;
    const int count_good = int(good.size());
    upload(good, m_good, m_good_host);

    // Ridge scaled by the largest eigenvalue (power iteration), as the reference does; the ridge
    // is formed on the space, so no wait comes between the power iteration and the start.
    if (opt.relative_ridge) {
      if (m_team_power_iteration) {
        power_iteration<ExecutionSpace, C, memory_space>(
            m_space, m_m[0], m_good, count_good, n, m_start, m_v, m_av, opt.power_iteration_max_iterations,
            C(opt.power_iteration_tolerance), m_lambda, m_power_iterations);
      } else if constexpr (host_accessible<memory_space>) {
        fence(m_space, "Lather::CoupledNewton: matrices loaded");
        power_iteration_host<C, memory_space>(m_m[0], good, n, m_start, m_v, m_av, opt.power_iteration_max_iterations,
                                              C(opt.power_iteration_tolerance), m_lambda, m_power_iterations);
      }
    }
    ridge_from_lambda<ExecutionSpace, C, memory_space>(m_space, m_good, count_good, opt.ridge_epsilon,
                                                       opt.relative_ridge, m_lambda, m_ridge);

    // T lives in scratch 0 from here on: each error pass writes the next step's T.
    newton_start<ExecutionSpace, C, memory_space>(m_space, m_m[0], m_h[0], m_scratch[0], m_good, count_good, n, p,
                                                  m_ridge, m_error);
    Kokkos::deep_copy(m_space, m_error_host, m_error);
    Kokkos::deep_copy(m_space, m_ridge_host, m_ridge);
    if (opt.relative_ridge) {
      Kokkos::deep_copy(m_space, m_lambda_host, m_lambda);
      Kokkos::deep_copy(m_space, m_power_iterations_host, m_power_iterations);
    }
    fence(m_space, "Lather::CoupledNewton: start errors on the host");

    // answer[s]: the H buffer that holds slot s's root once it stops.
    std::vector<int> answer(slots, -1);
    std::vector<double> previous_error(slots);
    std::vector<int> active;
    for (int s : good) {
      const int t = positions[s];
      if (opt.relative_ridge) {
        result.power_iterations[t] = m_power_iterations_host(s);
        result.lambda_max[t] = double(m_lambda_host(s));
      } else {
        result.lambda_max[t] = std::nan("");
      }
      result.ridge[t] = double(m_ridge_host(s));
      previous_error[s] = double(m_error_host(s));
      if (!(previous_error[s] > opt.tolerance) || opt.max_iterations == 0)
        answer[s] = 0;  // already converged (or no steps allowed): H0 is the answer
      else
        active.push_back(s);
      result.error[t] = previous_error[s];
      result.status[t] = previous_error[s] > opt.tolerance ? RootStatus::max_iterations : RootStatus::converged;
    }

    int current = 0;
    bool active_changed = true;
    while (!active.empty()) {
      // The list on the space changes only when a slot stops; the host mirror is rewritten only
      // after the last step's wait, so the copy before it has completed.
      if (active_changed) upload(active, m_active, m_active_host);
      const int count_active = int(active.size());
      const int next = 1 - current;
      const Stack& t_matrix = m_scratch[0];
      // H <- H T before T is consumed by the power.
      gemm_slots<ExecutionSpace, C, memory_space>(m_space, active, m_active, m_h[current], t_matrix, m_h[next], n,
                                                  m_batched_max, count);
      const Stack power = matrix_power(active, m_active, p, count);
      gemm_slots<ExecutionSpace, C, memory_space>(m_space, active, m_active, power, m_m[current], m_m[next], n,
                                                  m_batched_max, count);
      newton_error_and_step<ExecutionSpace, C, memory_space>(m_space, m_m[next], m_scratch[0], m_active, count_active,
                                                             n, p, m_error);
      Kokkos::deep_copy(m_space, m_error_host, m_error);
      fence(m_space, "Lather::CoupledNewton: errors on the host");

      std::vector<int> still_active;
      for (int s : active) {
        const int t = positions[s];
        const double e = double(m_error_host(s));
        result.iterations[t] += 1;
        const double ratio = e / previous_error[s];
        if (!(ratio < opt.max_error_ratio)) {
          // Grew too much, or NaN: the previous H is returned and, as in the reference, the
          // error reported is that of the last iterate, so a diverging root reads as failed.
          result.status[t] = RootStatus::diverged;
          result.error[t] = e;
          answer[s] = current;
        } else if (!(e > opt.tolerance)) {
          result.status[t] = RootStatus::converged;
          result.error[t] = e;
          answer[s] = next;
        } else if (result.iterations[t] >= opt.max_iterations) {
          result.status[t] = RootStatus::max_iterations;
          result.error[t] = e;
          answer[s] = next;
        } else {
          previous_error[s] = e;
          still_active.push_back(s);
        }
      }
      active_changed = still_active.size() != active.size();
      active.swap(still_active);
      // Active slots continue from the new iterates: swap the roles of the ping-pong buffers.
      current = next;
    }

    for (int b = 0; b < 2; ++b) {
      std::vector<int> finished;
      for (int s : good)
        if (answer[s] == b) finished.push_back(s);
      if (finished.empty()) continue;
      upload(finished, m_finished[b], m_finished_host[b]);
      store_roots<ExecutionSpace, S, C, memory_space>(m_space, m_h[b], m_finished[b], int(finished.size()), m_matrix_of,
                                                      n, output);
    }
    // The mirrors are rewritten by the next solve: its copies must not overtake this one's.
    fence(m_space, "Lather::CoupledNewton: roots stored");
  }

 private:
  /// values -> the leading entries of `view`, through its host mirror, ordered on the space.
  void upload(const std::vector<int>& values, const List& view, const typename List::HostMirror& host) const {
    for (std::size_t k = 0; k < values.size(); ++k) host(k) = values[k];
    Kokkos::deep_copy(m_space, Kokkos::subview(view, std::make_pair(std::size_t(0), values.size())),
                      Kokkos::subview(host, std::make_pair(std::size_t(0), values.size())));
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
  bool m_team_power_iteration;
  int m_batched_max = 0;
  List m_matrix_of, m_good, m_active, m_nonfinite, m_power_iterations;
  std::array<List, 2> m_finished;
  typename List::HostMirror m_matrix_of_host, m_good_host, m_active_host, m_nonfinite_host, m_power_iterations_host;
  std::array<typename List::HostMirror, 2> m_finished_host;
  Array1<C, memory_space> m_lambda, m_ridge, m_error;
  typename Array1<C, memory_space>::HostMirror m_lambda_host, m_ridge_host, m_error_host;
  std::array<Stack, 2> m_m, m_h;
  std::array<Stack, 3> m_scratch;
  Array2<C, memory_space> m_v, m_av;
  Array1<C, memory_space> m_start;
};

}  // namespace lather::linalg::Impl
