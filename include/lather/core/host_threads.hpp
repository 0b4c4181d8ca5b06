#pragma once
// Host threads sharing out a list of independent items: Shampoo's eigh roots, taken at a
// preconditioning step (linalg's solve) or in the background (asynchronous roots), and its
// blocks' products on a host backend. Each thread takes the next item until none is left, so
// where an item's result goes is fixed by the item, not by the thread that took it.

#include <lather/core/kept_host_threads.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace lather::Impl {

/// Products shared out among host threads give each thread at least this many flops where the
/// count is chosen for them: 20 MFLOP take one BLAS thread about a tenth of a millisecond or more
/// at Shampoo's sizes, a few times the tens of microseconds it costs to start and join a thread
/// (the kept threads of a serial backend cost a few microseconds a call).
inline constexpr double flops_per_host_thread = 20e6;

/// How many host threads take a rank's host work (roots, products, refreshes): `asked` where it
/// is set (above 0); else the threads of `space` where it is a threaded host backend (OpenMP,
/// Threads: concurrency() above 1), which then run it; else `node_share`, the CPUs the rank has to
/// itself on its node (comm::NodeOccupancy::cpu_share).
template <class ExecutionSpace>
int host_threads_for(const ExecutionSpace& space, int asked, int node_share) {
  if (asked > 0) return asked;
  if constexpr (runs_on_host<ExecutionSpace>) {
    if (space.concurrency() > 1) return int(space.concurrency());
  }
  return node_share;
}

/// Element-wise passes shared out among host threads give each thread at least this many values
/// where the count is chosen for them: a pass over 2^16 values streams 0.5 to 2.4 MB (2 to 9
/// arrays), tens of microseconds on one thread, against a few microseconds a call for the kept
/// threads.
inline constexpr double values_per_host_thread = 65536;

/// The host threads that share out `items` pieces of `work` in all: `threads`, no more than the
/// items, and where `by_work` (a count chosen for them) no more than one per `work_per_thread`.
inline int host_threads_for_work(int threads, bool by_work, std::size_t items, double work, double work_per_thread) {
  int out = int(std::min<std::size_t>(std::size_t(std::max(1, threads)), std::max<std::size_t>(items, 1)));
  if (by_work) out = std::min(out, std::max(1, int(work / work_per_thread)));
  return out;
}

/// The host threads that share out `items` products of `flops` in all (host_threads_for_work).
inline int host_threads_for_products(int threads, bool by_work, std::size_t items, double flops) {
  return host_threads_for_work(threads, by_work, items, flops, flops_per_host_thread);
}

/// The items of one call shared out among threads: each thread takes the next item until none
/// is left; an exception stops the others after their current item and is kept for rethrow().
template <class Item>
class SharedItems {
 public:
  SharedItems(const Item& item, std::size_t count, int threads)
      : m_item(item), m_count(count), m_failures(static_cast<std::size_t>(threads)) {}
  void work(int thread) {
    try {
      for (std::size_t k = m_next++; k < m_count; k = m_next++) m_item(thread, k);
    } catch (...) {
      m_failures[static_cast<std::size_t>(thread)] = std::current_exception();
      m_next = m_count;  // the others stop after their current item
    }
  }
  /// Once every thread returned: the first thread's exception, where several threw.
  void rethrow() const {
    for (const auto& failure : m_failures)
      if (failure) std::rethrow_exception(failure);
  }

 private:
  const Item& m_item;
  const std::size_t m_count;
  std::atomic<std::size_t> m_next{0};
  std::vector<std::exception_ptr> m_failures;
};

/// Calls item(thread, k) for every k in [0, count) on `threads` host threads at once (this one is
/// thread 0; per-thread state indexed by `thread` needs `threads` entries) and returns once every
/// thread has: the process's kept threads (kept_host_threads.hpp), or threads started for the
/// call where those are at work for another caller. Where the system starts fewer threads, those
/// started and this one take every item. An exception stops the others after their current item
/// and is rethrown here after they all returned (the first thread's, where several threw).
/// `item` must make no Kokkos call.
template <class Item>
void for_each_on_host_threads(int threads, std::size_t count, const Item& item) {
  // No more threads than items: a kept thread would wait for the rest of the process's life.
  threads = int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(std::max(1, threads)), count)));
  SharedItems<Item> items(item, count, threads);
  if (!run_on_kept_host_threads(threads, [&items](int thread) { items.work(thread); })) {
    std::vector<std::thread> pool;
    try {
      for (int thread = 1; thread < threads; ++thread) pool.emplace_back([&items, thread] { items.work(thread); });
    } catch (const std::system_error&) {
      // Fewer threads than asked for: joined below like the others.
    }
    items.work(0);
    for (auto& thread : pool) thread.join();
  }
  items.rethrow();
}

/// The same, on the threads of `space` where it is a host execution space with several (OpenMP,
/// Threads: concurrency() above 1), which sit where the user placed and pinned them: one team of
/// one per thread (`threads` teams), each taking the next item until none is left. Elsewhere
/// (Serial, a device) on the kept threads or threads started for the call, as above. `item` runs
/// inside a Kokkos parallel region there: it must make no Kokkos call, as above.
template <class ExecutionSpace, class Item>
void for_each_on_host_threads(const ExecutionSpace& space, int threads, std::size_t count, const Item& item) {
  if constexpr (runs_on_host<ExecutionSpace>) {
    if (threads > 1 && count > 1 && space.concurrency() > 1) {
      using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
      SharedItems<Item> items(item, count, threads);
      Kokkos::parallel_for("Lather::host_threads", Policy(space, threads, 1),
                           [&](const typename Policy::member_type& team) { items.work(team.league_rank()); });
      fence(space, "Lather: host threads done");
      items.rethrow();
      return;
    }
  }
  for_each_on_host_threads(threads, count, item);
}

}  // namespace lather::Impl
