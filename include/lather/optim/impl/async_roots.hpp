#pragma once
// Shampoo's asynchronous inverse roots (Anil et al. 2020, section 5). At a preconditioning step
// the statistics a rank owns are copied to the host and their roots started on host threads;
// the steps of the next interval run meanwhile with the preconditioners already installed; at
// the next preconditioning step the roots are waited for and installed (the reference's
// acceptance rule applied: a rejected root keeps the previous preconditioner), and the next ones
// started. The preconditioners in use are therefore one interval stale.
//
// The host threads call only LAPACK and BLAS (linalg::eigh_inverse_pth_root_on_host), never
// Kokkos: they cannot race with the step's kernels on any backend, and on a GPU they run on host
// cores the training leaves idle. That is why asynchronous roots need root_method eigh.
//
// How many threads (async_root_threads): one where the step itself runs on the host cores (the
// roots take the core the training leaves; on 1 rank of the 2-core development machine that hid
// 71-75 % of the roots, benchmarks.md); on a device backend the rank's CPUs less the one that
// drives the device: on an H200's 16-core host one thread took the 492 transformer roots 4-6x
// longer than the synchronous phase's 16 threads, and the step waited for them (benchmarks.md).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/error.hpp>
#include <lather/core/host_blas_threads.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/linalg/inverse_root.hpp>
#include <lather/optim/impl/matrix_store.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/statistic_metrics.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <future>
#include <string>
#include <vector>

namespace lather::optim::Impl {

/// Host threads for the asynchronous roots: options.root.host_threads where it is set; else one
/// where `MemorySpace` is host memory (the step's kernels need the other cores), and on a device
/// backend `root_threads` (the rank's CPUs, host_threads().roots) less one, at least one.
template <class MemorySpace>
int async_root_threads(const ShampooOptions& options, int root_threads) {
  if (options.root.host_threads > 0) return options.root.host_threads;
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) return 1;
  return std::max(1, root_threads - 1);
}

template <class ExecutionSpace, class T>
class AsyncRoots {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Store = MatrixStore<ExecutionSpace, T>;
  using Flat = typename Store::Flat;

  /// `threads`: host threads taking the roots at once (async_root_threads).
  AsyncRoots(const ShampooOptions& options, int threads) : m_options(options), m_threads(std::max(1, threads)) {
    m_root_options = options.root;
    m_root_options.ridge_epsilon = options.matrix_epsilon;
    m_root_options.relative_ridge = options.relative_matrix_epsilon;
  }
  ~AsyncRoots() { discard(); }
  AsyncRoots(const AsyncRoots&) = delete;
  AsyncRoots& operator=(const AsyncRoots&) = delete;

  /// True between start() and install() (or discard()).
  bool pending() const { return m_pending; }
  std::int64_t workspace_bytes() const {
    return std::int64_t(m_stage.span() * sizeof(T) * 2 + m_input.capacity() * sizeof(double) * 2);
  }

  /// Copies the statistics `owned` (global ids; slot_of[s] their slot) to the host on `space` and
  /// starts their roots: on host threads, or here and now without async_roots_in_background.
  void start(const ExecutionSpace& space, const ShampooPlan& plan, const std::vector<int>& owned,
             const std::vector<int>& slot_of, const Store& statistics) {
    LATHER_REQUIRE(!m_pending, "Shampoo: asynchronous roots started twice without install");
    m_owned = owned;
    m_size.clear(), m_exponent.clear(), m_offset.clear();
    std::int64_t total = 0;
    m_list.clear();
    for (int s : owned) {
      const int n = plan.statistic_size[s];
      m_size.push_back(n);
      m_exponent.push_back(plan.statistic_exponent[s]);
      m_offset.push_back(total);
      m_list.add(slot_of[s], n, total, n);
      total += std::int64_t(n) * n;
    }
    if (std::int64_t(m_stage.extent(0)) < total) {
      m_stage = Flat(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Shampoo::async_root_stage"),
                     std::size_t(total));
      m_stage_host = Kokkos::create_mirror_view(m_stage);
    }
    if (total > 0) {
      m_list.upload(space);
      statistics.read(space, m_list, m_stage);
      Kokkos::deep_copy(space, m_stage_host, m_stage);
    }
    ::lather::Impl::fence(space, "Lather::Shampoo: statistics on the host for the root thread");
    m_input.assign(std::size_t(total), 0.0);
    for (std::int64_t k = 0; k < total; ++k) m_input[std::size_t(k)] = double(m_stage_host(k));
    m_output.assign(std::size_t(total), 0.0);
    m_outcome.assign(owned.size(), {});
    m_pending = true;
    if (m_options.async_roots_in_background)
      m_job = std::async(std::launch::async, [this] { return compute(); });
    else
      m_foreground_error = compute();
  }

  /// Waits for the roots started last, writes the accepted ones into `preconditioners` on
  /// `space` and records every outcome in metrics[s]. Returns the root thread's error ("" if
  /// none; then no preconditioner moves).
  std::string install(const ExecutionSpace& space, const std::vector<int>& slot_of, Store& preconditioners,
                      std::vector<StatisticMetrics>& metrics) {
    const std::string error = wait();
    m_pending = false;
    if (!error.empty()) return error;
    const double threshold = m_options.inverse_failure_threshold;
    m_list.clear();
    for (std::size_t k = 0; k < m_owned.size(); ++k) {
      const int s = m_owned[k];
      const auto& outcome = m_outcome[k];
      auto& mt = metrics[s];
      mt.error = outcome.error;
      mt.iterations = 0;
      const bool accepted =
          outcome.status != linalg::RootStatus::non_finite && std::isfinite(outcome.error) && outcome.error < threshold;
      if (!accepted) {
        ++mt.consecutive_failures;
        ++mt.failures;
        continue;
      }
      mt.consecutive_failures = 0;
      const std::int64_t nn = std::int64_t(m_size[k]) * m_size[k];
      for (std::int64_t e = 0; e < nn; ++e) m_stage_host(m_offset[k] + e) = T(m_output[std::size_t(m_offset[k] + e)]);
      m_list.add(slot_of[s], m_size[k], m_offset[k], m_size[k]);
    }
    if (m_list.count() > 0) {
      Kokkos::deep_copy(space, m_stage, m_stage_host);
      m_list.upload(space);
      preconditioners.write(space, m_list, m_stage);
    }
    // The staging buffers are refilled by the next start().
    ::lather::Impl::fence(space, "Lather::Shampoo: asynchronous roots installed");
    return "";
  }

  /// Drops the roots in flight (after a checkpoint restore, or on destruction).
  void discard() {
    wait();
    m_pending = false;
  }

 private:
  std::string wait() {
    if (m_job.valid()) return m_job.get();
    std::string error;
    std::swap(error, m_foreground_error);
    return error;
  }

  /// The root threads: every owned statistic, in the compute precision, a float root that fails
  /// retried in double as RootPhase does. Each thread takes the next statistic until none is left
  /// and writes only that statistic's outcome and output range, so with the BLAS on one thread
  /// the results do not depend on the number of threads. Touches only this object's host vectors.
  std::string compute() noexcept {
    try {
      ::lather::Impl::fault_point("shampoo.async_roots");
      const int threads = std::max(1, std::min(m_threads, int(m_owned.size())));
      // Several threads each call LAPACK on one BLAS thread, as the synchronous pool does (a
      // threaded BLAS under each would start more threads than the CPUs the pool was sized to);
      // one thread keeps the process's count. Only device backends run several by default, and
      // there the training makes no host BLAS call the count could slow (root_host_threads above
      // one on a host backend holds the step's BLAS calls to one thread while the roots run).
      const ScopedHostBlasThreads one_blas_thread(threads > 1 ? 1 : 0);
      std::vector<Scratch> scratch(static_cast<std::size_t>(threads));
      ::lather::Impl::for_each_on_host_threads(
          threads, m_owned.size(), [&](int thread, std::size_t k) { compute_one(k, scratch[std::size_t(thread)]); });
      return "";
    } catch (const std::exception& e) {
      return std::string("asynchronous inverse roots: ") + e.what();
    } catch (...) {
      return "asynchronous inverse roots: unknown exception";
    }
  }

  /// One root thread's buffers, kept from one statistic to the next.
  struct Scratch {
    std::vector<double> matrix, root;
    std::vector<float> matrix_f, root_f;
  };

  /// The root of owned statistic k into m_outcome[k] and its range of m_output.
  void compute_one(std::size_t k, Scratch& own) {
    auto& [matrix, root, matrix_f, root_f] = own;
    const double threshold = m_options.inverse_failure_threshold;
    const int n = m_size[k], p = m_exponent[k];
    const auto first = m_input.begin() + m_offset[k], last = first + std::int64_t(n) * n;
    linalg::HostRootOutcome outcome;
    bool have = false;
    if (m_root_options.compute_precision == linalg::Precision::float32) {
      matrix_f.assign(first, last);
      outcome = linalg::eigh_inverse_pth_root_on_host<float>(matrix_f, n, p, m_root_options, root_f);
      root.assign(root_f.begin(), root_f.end());
      const bool accepted =
          outcome.status != linalg::RootStatus::non_finite && std::isfinite(outcome.error) && outcome.error < threshold;
      have = accepted || !m_options.retry_failed_roots_in_double;
    }
    if (!have) {
      matrix.assign(first, last);
      outcome = linalg::eigh_inverse_pth_root_on_host<double>(matrix, n, p, m_root_options, root);
    }
    m_outcome[k] = outcome;
    if (outcome.status != linalg::RootStatus::non_finite)
      std::copy(root.begin(), root.end(), m_output.begin() + m_offset[k]);
  }

  ShampooOptions m_options;
  int m_threads = 1;
  linalg::InverseRootOptions m_root_options;
  bool m_pending = false;
  std::vector<int> m_owned, m_size, m_exponent;
  std::vector<std::int64_t> m_offset;
  std::vector<double> m_input, m_output;  // the root thread's own copies
  std::vector<linalg::HostRootOutcome> m_outcome;
  Flat m_stage;
  typename Flat::HostMirror m_stage_host;
  SlotList<memory_space> m_list;
  std::future<std::string> m_job;
  std::string m_foreground_error;
};

}  // namespace lather::optim::Impl
