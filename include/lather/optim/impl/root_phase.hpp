#pragma once
// The inverse-root phase of a Shampoo step: the statistics a rank owns are read (dequantized) into
// a compact stack in chunks that fit the root workspace, their inverse p-th roots computed, roots
// computed in float that fail retried once in double, the reference's acceptance rule applied
// (a rejected root keeps the previous preconditioner) and the metrics recorded; the failure rule
// (max_consecutive_root_failures) is checked after the metrics have been shared.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/linalg/inverse_root.hpp>
#include <lather/optim/impl/matrix_store.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/statistic_metrics.hpp>

#include <algorithm>
#include <vector>

namespace lather::optim::Impl {

template <class ExecutionSpace, class T>
class RootPhase {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Stack = Kokkos::View<T***, Kokkos::LayoutRight, memory_space>;
  using Store = MatrixStore<ExecutionSpace, T>;

  /// Scratch for at most `owned` roots at once, within the options' root workspace; eigh roots
  /// taken by `host_threads` host threads at once.
  RootPhase(const ExecutionSpace& space, const ShampooOptions& options, int max_size, int owned, int host_threads)
      : m_options(options) {
    m_root_options = options.root;
    m_root_options.host_threads = host_threads;
    m_root_options.ridge_epsilon = options.matrix_epsilon;
    m_root_options.relative_ridge = options.relative_matrix_epsilon;
    // Input and output of a chunk together stay within workspace_bytes (at least one matrix).
    const std::size_t per_matrix = 2 * std::size_t(max_size) * max_size * sizeof(T);
    m_chunk = int(
        std::max<std::size_t>(1, std::min<std::size_t>(std::max(owned, 1), options.root.workspace_bytes / per_matrix)));
    m_in = Stack(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Shampoo::root_in"), m_chunk, max_size,
                 max_size);
    m_out = Stack(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Shampoo::root_out"), m_chunk,
                  max_size, max_size);
  }

  std::int64_t workspace_bytes() const { return std::int64_t((m_in.span() + m_out.span()) * sizeof(T)); }
  /// GEMM calls the solver made so far (retries included).
  long gemm_calls() const { return m_gemm_calls; }

  /// Roots of the statistics `owned` (global ids; slot_of[s] their slot in both stores) from
  /// `statistics` into `preconditioners`; metrics[s] records each outcome.
  void compute(const ExecutionSpace& space, const ShampooPlan& plan, const std::vector<int>& owned,
               const std::vector<int>& slot_of, const Store& statistics, Store& preconditioners,
               std::vector<StatisticMetrics>& metrics) {
    for (std::size_t begin = 0; begin < owned.size(); begin += std::size_t(m_chunk)) {
      const std::size_t end = std::min(owned.size(), begin + std::size_t(m_chunk));
      solve_chunk(space, plan, std::vector<int>(owned.begin() + begin, owned.begin() + end), slot_of, statistics,
                  preconditioners, metrics);
    }
  }

  /// Throws, naming the parameter, once a statistic of `local` failed max_consecutive_root_failures
  /// times in a row (never when that option is 0).
  void check_failures(const ShampooPlan& plan, const std::vector<int>& local,
                      const std::vector<StatisticMetrics>& metrics, long step) const {
    if (m_options.max_consecutive_root_failures <= 0) return;
    for (int s : local) {
      const auto& mt = metrics[s];
      LATHER_REQUIRE(mt.consecutive_failures < m_options.max_consecutive_root_failures, "Shampoo step ", step,
                     ": statistic ", s - plan.parameters[mt.parameter].first_statistic, " of '",
                     plan.parameters[mt.parameter].spec.name, "': inverse root failed ", mt.consecutive_failures,
                     " times in a row (last error ", mt.error, " >= inverse_failure_threshold ",
                     m_options.inverse_failure_threshold,
                     "); raise matrix_epsilon, use root.compute_precision=float64 or method=eigh");
    }
  }

 private:
  void solve_chunk(const ExecutionSpace& space, const ShampooPlan& plan, const std::vector<int>& chunk,
                   const std::vector<int>& slot_of, const Store& statistics, Store& preconditioners,
                   std::vector<StatisticMetrics>& metrics) {
    const int count = int(chunk.size());
    const int m = int(m_in.extent(1));
    m_list.clear();
    std::vector<linalg::RootTask> tasks(count);
    for (int c = 0; c < count; ++c) {
      const int s = chunk[c];
      m_list.add(slot_of[s], plan.statistic_size[s], std::int64_t(c) * m * m, m);
      tasks[c] = {c, plan.statistic_size[s], plan.statistic_exponent[s]};
    }
    m_list.upload(space);
    statistics.read(space, m_list, flat(m_in));

    const double threshold = m_options.inverse_failure_threshold;
    linalg::InverseRootResult result = linalg::inverse_pth_root(space, m_in, m_out, tasks, m_root_options);
    m_gemm_calls += result.gemm_calls;
    if (m_options.retry_failed_roots_in_double && m_root_options.compute_precision == linalg::Precision::float32) {
      std::vector<linalg::RootTask> retry;
      std::vector<int> where;
      for (int c = 0; c < count; ++c)
        if (!result.accepted(c, threshold)) retry.push_back(tasks[c]), where.push_back(c);
      if (!retry.empty()) {
        auto options = m_root_options;
        options.compute_precision = linalg::Precision::float64;
        const auto again = linalg::inverse_pth_root(space, m_in, m_out, retry, options);
        m_gemm_calls += again.gemm_calls;
        for (std::size_t k = 0; k < retry.size(); ++k) {
          const int c = where[k];
          result.error[c] = again.error[k];
          result.iterations[c] = again.iterations[k];
          result.power_iterations[c] = again.power_iterations[k];
          result.status[c] = again.status[k];
        }
      }
    }
    // Accepted roots become preconditioners; a rejected one keeps the previous preconditioner.
    m_list.clear();
    for (int c = 0; c < count; ++c) {
      const int s = chunk[c];
      auto& mt = metrics[s];
      mt.error = result.error[c];
      mt.iterations = result.iterations[c];
      if (!result.accepted(c, threshold)) {
        ++mt.consecutive_failures;
        ++mt.failures;
        continue;
      }
      mt.consecutive_failures = 0;
      m_list.add(slot_of[s], plan.statistic_size[s], std::int64_t(c) * m * m, m);
    }
    m_list.upload(space);
    preconditioners.write(space, m_list, flat(m_out));
  }

  static typename Store::Flat flat(const Stack& stack) { return typename Store::Flat(stack.data(), stack.span()); }

  ShampooOptions m_options;
  linalg::InverseRootOptions m_root_options;
  int m_chunk = 1;
  long m_gemm_calls = 0;
  Stack m_in, m_out;
  SlotList<memory_space> m_list;
};

}  // namespace lather::optim::Impl
