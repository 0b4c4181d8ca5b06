#pragma once
// Memory that every rank of a group can address, where the whole group sits on one node: an MPI
// shared-memory window (MPI_Win_allocate_shared), one slot per rank. The gradient reducer sums
// through it: each rank copies its bucket into its slot, and after a barrier sums its share of
// the elements over every slot, with no message in between (GradientReducer, `shared_memory`).
// The group must sit on one node (Group::ranks_on_node() == size()); without MPI there is no
// window (available() is false).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace lather::comm {

class NodeWindow {
 public:
  NodeWindow();
  ~NodeWindow();
  NodeWindow(NodeWindow&&) noexcept;
  NodeWindow& operator=(NodeWindow&&) noexcept;
  NodeWindow(const NodeWindow&) = delete;
  NodeWindow& operator=(const NodeWindow&) = delete;

  /// Collective over `group` (on one node), with `bytes` the same on every rank: a window of at
  /// least `bytes` per rank, kept when the current one is large enough. An MPI error is thrown
  /// where MPI reports it. Freeing the window (here and in the destructor) is collective too:
  /// every rank of the group drops its reducer at the same point of the program.
  void reserve(const Group& group, std::size_t bytes);
  /// Collective over `group` (on one node): a window of `bytes` on this rank (they may differ
  /// between ranks) whose slots lie one after the other, so that slot(0) starts one array holding
  /// every rank's part in rank order (an all-gather's buffer). False, and no window, where MPI did
  /// not place them so (the same answer on every rank).
  bool allocate_contiguous(const Group& group, std::size_t bytes);
  bool available() const { return m_state != nullptr; }
  /// Bytes of this rank's slot (0 without a window).
  std::size_t bytes() const;
  /// Slot of group rank `r` (reserve()d bytes, aligned to 64 bytes).
  void* slot(int r) const;
  /// Collective: every rank's stores into the window before it are seen by every rank after it
  /// (MPI_Win_sync, barrier, MPI_Win_sync).
  void synchronize() const;
  /// synchronize() in three parts, for a rank that computes while it waits: sync_memory() (this
  /// rank's stores seen, others' loaded: MPI_Win_sync), start_barrier() on the window's group,
  /// and sync_memory() again once the barrier's Request completes.
  void sync_memory() const;
  Request start_barrier() const;

 private:
  struct State;
  /// Collective: a window of `bytes` on this rank, locked for the ranks' loads and stores, with
  /// every rank's slot; `sizes` receives every slot's bytes.
  static std::unique_ptr<State> open(const Group& group, std::size_t bytes, std::vector<std::size_t>& sizes);
  std::unique_ptr<State> m_state;
};

}  // namespace lather::comm
