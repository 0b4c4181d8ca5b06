#pragma once
// Sums through a node-shared window (GradientReducer with ReduceOptions::shared_memory): every
// rank's bucket sits in its slot of the window, each rank sums its share of the elements over
// every slot and writes the result into every slot, with a barrier before and after. Host
// memory only: the reducer takes this path for host execution spaces alone.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/group.hpp>
#include <lather/comm/impl/layout.hpp>
#include <lather/comm/node_window.hpp>
#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace lather::comm::Impl {

/// Elements [begin, end) of every rank's slot of a node-shared window (`slots`: `ranks` addresses)
/// become factor * (slot_0 + slot_1 + ... + slot_{ranks-1}), summed in rank order: one rank
/// computes each element, so every rank's slot holds the same bits. Host memory only.
template <class ExecutionSpace, class S>
void sum_slots(const ExecutionSpace& space, S* const* slots, int ranks, std::int64_t begin, std::int64_t end,
               double factor) {
  constexpr std::int64_t run = 2048;
  const S f = S(factor);
  const bool plain = factor == 1.0;
  ::lather::Impl::parallel_for_runs("Lather::comm::sum_slots", space, end - begin,
                                    [=](std::int64_t first, std::int64_t last) {
                                      S total[run];
                                      const std::int64_t count = last - first, at = begin + first;
                                      for (std::int64_t done = 0; done < count; done += run) {
                                        const std::int64_t n = std::min(run, count - done);
                                        const S* KOKKOS_RESTRICT x0 = slots[0] + at + done;
                                        for (std::int64_t i = 0; i < n; ++i) total[i] = x0[i];
                                        for (int r = 1; r < ranks; ++r) {
                                          const S* KOKKOS_RESTRICT x = slots[r] + at + done;
                                          for (std::int64_t i = 0; i < n; ++i) total[i] += x[i];
                                        }
                                        if (!plain)
                                          for (std::int64_t i = 0; i < n; ++i) total[i] *= f;
                                        for (int r = 0; r < ranks; ++r) {
                                          S* KOKKOS_RESTRICT x = slots[r] + at + done;
                                          for (std::int64_t i = 0; i < n; ++i) x[i] = total[i];
                                        }
                                      }
                                    });
}

/// Whether `tensors` lie in `rank`'s slot of `window` one after the other from its start (a list
/// placed there by GradientReducer::shared_gradient_storage).
template <class S, class MemorySpace>
bool lies_in_slot(const NodeWindow& window, int rank, const TensorList<S, MemorySpace>& tensors) {
  if (!window.available() || tensors.empty()) return false;
  const S* mine = static_cast<const S*>(window.slot(rank));
  std::int64_t at = 0;
  for (const auto& tensor : tensors) {
    const std::int64_t n = std::int64_t(tensor.extent(0));
    if (n > 0 && tensor.data() != mine + at) return false;
    at += n;
  }
  return std::size_t(at) * sizeof(S) <= window.bytes();
}

/// Copies one bucket of `tensors` (sizes: the list's tensor sizes) into this rank's slot at
/// element `first` (`in`), or back out of it, skipping tensors that lie there already.
template <class ExecutionSpace, class S>
void move_bucket_through_slot(const ExecutionSpace& space, const NodeWindow& window, int rank,
                              const TensorList<S, typename ExecutionSpace::memory_space>& tensors,
                              const std::vector<std::int64_t>& sizes, const Bucket& bucket, std::int64_t first,
                              bool in) {
  using M = typename ExecutionSpace::memory_space;
  S* const mine = static_cast<S*>(window.slot(rank));
  std::int64_t at = first;
  for (std::size_t t = bucket.first; t < bucket.last; at += sizes[t++]) {
    const std::int64_t n = sizes[t];
    if (n == 0 || tensors[t].data() == mine + at) continue;
    const Kokkos::View<S*, M> place(mine + at, std::size_t(n));
    if (in)
      Kokkos::deep_copy(space, place, tensors[t]);
    else
      Kokkos::deep_copy(space, tensors[t], place);
  }
}

/// This rank's share of a bucket at element `first` of every slot: summed over the slots (times
/// `factor`) into every slot. Every rank's bucket must be in its slot (a barrier before).
template <class ExecutionSpace, class S>
void sum_share_of_bucket(const ExecutionSpace& space, const NodeWindow& window, int rank, int size,
                         const Bucket& bucket, std::int64_t first, double factor) {
  std::vector<S*> slots(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) slots[std::size_t(r)] = static_cast<S*>(window.slot(r));
  const std::int64_t begin = bucket.elements * rank / size, end = bucket.elements * (rank + 1) / size;
  sum_slots(space, slots.data(), size, first + begin, first + end, factor);
}

/// One bucket of `tensors` (sizes: the list's tensor sizes): into this rank's slot at element
/// `first` (its offset in a placed list, else 0) unless it lies there, a barrier, this rank's
/// share of the elements summed over every slot (times `factor`) into every slot, a barrier, back
/// out of the slot. Collective over the window's group.
template <class ExecutionSpace, class S>
void sum_bucket_through_window(const ExecutionSpace& space, const NodeWindow& window, int rank, int size,
                               const TensorList<S, typename ExecutionSpace::memory_space>& tensors,
                               const std::vector<std::int64_t>& sizes, const Bucket& bucket, std::int64_t first,
                               double factor) {
  move_bucket_through_slot(space, window, rank, tensors, sizes, bucket, first, true);
  ::lather::Impl::fence(space, "Lather::GradientReducer: bucket in the shared window");
  window.synchronize();
  sum_share_of_bucket<ExecutionSpace, S>(space, window, rank, size, bucket, first, factor);
  ::lather::Impl::fence(space, "Lather::GradientReducer: share summed");
  window.synchronize();
  move_bucket_through_slot(space, window, rank, tensors, sizes, bucket, first, false);
}

/// The gradient reducer's node-shared path (ReduceOptions::shared_memory): its window, whether the
/// group sits on one node, and which buckets go through the window. Host memory only.
template <class ExecutionSpace, class S>
class WindowSums {
 public:
  using M = typename ExecutionSpace::memory_space;
  using tensor_list = TensorList<S, M>;
  static constexpr bool capable =
      ::lather::Impl::runs_on_host<ExecutionSpace> && std::is_same<M, Kokkos::HostSpace>::value;
  /// Buckets of at most this many bytes are copied through the window when they do not lie in it:
  /// in cache, the two copies cost less than MPI's; a larger bucket that must be copied goes
  /// through MPI, whose transfer costs less than two copies that miss the cache (see
  /// docs/reference/collectives.md).
  static constexpr std::int64_t copy_bytes = std::int64_t(4) << 20;

  /// Whether sums over `group` go through the window, where `wanted` (shared_memory, native wire):
  /// the group must sit on one node. Collective the first time (every rank reaches it after the
  /// agreement on the options).
  bool active(const Group& group, bool wanted) {
    if (!capable || !wanted || group.size() == 1) return false;
    if (m_on_one_node < 0) m_on_one_node = group.ranks_on_node() == group.size() ? 1 : 0;
    return m_on_one_node == 1;
  }

  /// Whether `tensors` lie in group rank `rank`'s slot (placed by storage()).
  bool placed(int rank, const tensor_list& tensors) const { return lies_in_slot(m_window, rank, tensors); }

  /// Before the buckets of an active call (collective, the same `layout` on every rank): room for
  /// the buckets it copies. A window handed out by storage() is never reallocated (lists live in
  /// it): buckets it cannot hold go through MPI. The window's size is the same on every rank.
  void prepare(const Group& group, const Layout& layout) {
    m_copy_limit = copy_bytes;
    if (m_handed_out) {
      m_copy_limit = std::min<std::int64_t>(copy_bytes, std::int64_t(m_window.bytes()));
      return;
    }
    std::int64_t need = 0;
    for (const auto& bucket : layout.buckets)
      if (bucket.elements * std::int64_t(sizeof(S)) <= copy_bytes) need = std::max(need, bucket.elements);
    if (need > 0) m_window.reserve(group, std::size_t(need) * sizeof(S));
  }

  /// Whether `bucket` goes through the window (after prepare): every bucket of a placed list, the
  /// others up to the copy limit.
  bool takes(const Bucket& bucket, bool placed) const {
    return placed || bucket.elements * std::int64_t(sizeof(S)) <= m_copy_limit;
  }

  /// sum_bucket_through_window over `group`.
  void sum(const ExecutionSpace& space, const Group& group, const tensor_list& tensors,
           const std::vector<std::int64_t>& sizes, const Bucket& bucket, std::int64_t first, double factor) {
    if constexpr (capable)
      sum_bucket_through_window(space, m_window, group.rank(), group.size(), tensors, sizes, bucket, first, factor);
  }

  /// The window (for the overlapped reduction, which runs sum()'s parts one by one).
  const NodeWindow& window() const { return m_window; }

  /// GradientReducer::shared_gradient_storage: this rank's slot of a window of the group's largest
  /// `elements`, or an empty View where the path is not active. Collective.
  FlatTensor<S, M> storage(const Group& group, bool wanted, std::int64_t elements) {
    if (!active(group, wanted)) return {};
    const std::int64_t mine = std::max<std::int64_t>(elements, 0);
    const std::int64_t most = group.allreduce(mine, Combine::max);
    // Lists placed in the window before live in it: it can be handed out, not reallocated.
    LATHER_REQUIRE(!m_handed_out || std::size_t(most) * sizeof(S) <= m_window.bytes(),
                   "GradientReducer::shared_gradient_storage: ", most,
                   " elements asked for on some rank, but this "
                   "reducer's window, already handed out, holds ",
                   m_window.bytes() / sizeof(S), "; use one reducer per list, or ask for the largest first");
    m_window.reserve(group, std::size_t(most) * sizeof(S));
    m_handed_out = true;
    return FlatTensor<S, M>(static_cast<S*>(m_window.slot(group.rank())), std::size_t(mine));
  }

 private:
  NodeWindow m_window;
  int m_on_one_node = -1;  ///< unknown until the first call that could use the window
  bool m_handed_out = false;
  std::int64_t m_copy_limit = copy_bytes;
};

}  // namespace lather::comm::Impl
