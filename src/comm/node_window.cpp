#include <lather/comm/impl/node_window.hpp>

#include <lather/core/error.hpp>

#if LATHER_ENABLE_MPI
#include "mpi_check.hpp"

#include <mpi.h>
#endif

#include <algorithm>
#include <vector>

namespace lather::comm::Impl {

struct NodeWindow::State {
#if LATHER_ENABLE_MPI
  Group group;
  MPI_Win window = MPI_WIN_NULL;
  std::size_t bytes = 0;
  std::vector<void*> slots;

  ~State() {
    if (window == MPI_WIN_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // nothing to report from a destructor
    MPI_Win_unlock_all(window);
    MPI_Win_free(&window);
  }
#endif
};

NodeWindow::NodeWindow() = default;
NodeWindow::~NodeWindow() = default;
NodeWindow::NodeWindow(NodeWindow&&) noexcept = default;
NodeWindow& NodeWindow::operator=(NodeWindow&&) noexcept = default;

bool NodeWindow::group_on_one_node(const Group& group) {
#if LATHER_ENABLE_MPI
  if (group.size() == 1) return false;
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(group.native(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  int on_node = 0;
  const int status = MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  check_mpi(status, "MPI_Comm_size");
  // Every rank must reach the same answer: a group split over nodes has some rank with fewer.
  return group.allreduce(on_node, Combine::min) == group.size();
#else
  (void)group;
  return false;
#endif
}

void NodeWindow::reserve(const Group& group, std::size_t bytes) {
#if LATHER_ENABLE_MPI
  if (m_state && m_state->bytes >= bytes) return;
  const std::size_t rounded = (std::max<std::size_t>(bytes, 64) + 63) / 64 * 64;
  m_state.reset();  // collective: the old window first
  auto state = std::make_unique<State>();
  state->group = group;
  void* mine = nullptr;
  MPI_Info info = MPI_INFO_NULL;
  check_mpi(MPI_Win_allocate_shared(MPI_Aint(rounded), 1, info, group.native(), &mine, &state->window),
            "MPI_Win_allocate_shared");
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, state->window), "MPI_Win_lock_all");
  state->bytes = rounded;
  state->slots.resize(std::size_t(group.size()));
  for (int r = 0; r < group.size(); ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    check_mpi(MPI_Win_shared_query(state->window, r, &size, &unit, &state->slots[std::size_t(r)]),
              "MPI_Win_shared_query");
  }
  m_state = std::move(state);
#else
  (void)group;
  (void)bytes;
  LATHER_FAIL("NodeWindow: needs MPI");
#endif
}

bool NodeWindow::allocate_contiguous(const Group& group, std::size_t bytes) {
#if LATHER_ENABLE_MPI
  m_state.reset();  // collective: the old window first
  auto state = std::make_unique<State>();
  state->group = group;
  void* mine = nullptr;
  // MPI places the ranks' segments one after the other unless told otherwise (the info key
  // alloc_shared_noncontig): checked below.
  check_mpi(MPI_Win_allocate_shared(MPI_Aint(bytes), 1, MPI_INFO_NULL, group.native(), &mine, &state->window),
            "MPI_Win_allocate_shared");
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, state->window), "MPI_Win_lock_all");
  state->bytes = bytes;
  state->slots.resize(std::size_t(group.size()));
  bool contiguous = true;
  char* expected = nullptr;
  for (int r = 0; r < group.size(); ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    check_mpi(MPI_Win_shared_query(state->window, r, &size, &unit, &state->slots[std::size_t(r)]),
              "MPI_Win_shared_query");
    char* at = static_cast<char*>(state->slots[std::size_t(r)]);
    if (r > 0 && size > 0 && at != expected) contiguous = false;
    if (size > 0 || r == 0) expected = (r == 0 ? at : expected) + size;
  }
  if (!contiguous) return false;  // the State's destructor frees the window, on every rank alike
  m_state = std::move(state);
  return true;
#else
  (void)group;
  (void)bytes;
  return false;
#endif
}

std::size_t NodeWindow::bytes() const {
#if LATHER_ENABLE_MPI
  return m_state ? m_state->bytes : 0;
#else
  return 0;
#endif
}

void* NodeWindow::slot(int r) const {
#if LATHER_ENABLE_MPI
  return m_state->slots.at(std::size_t(r));
#else
  (void)r;
  return nullptr;
#endif
}

void NodeWindow::synchronize() const {
#if LATHER_ENABLE_MPI
  check_mpi(MPI_Win_sync(m_state->window), "MPI_Win_sync");
  m_state->group.barrier();
  check_mpi(MPI_Win_sync(m_state->window), "MPI_Win_sync");
#endif
}

}  // namespace lather::comm::Impl
