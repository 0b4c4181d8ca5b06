#include <lather/comm/node_window.hpp>

#include <lather/core/error.hpp>

#if LATHER_ENABLE_MPI
#include "mpi_check.hpp"

#include <mpi.h>
#endif

#include <algorithm>
#include <vector>

namespace lather::comm {

#if LATHER_ENABLE_MPI
using Impl::check_mpi;
#endif

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

auto NodeWindow::open(const Group& group, std::size_t bytes, std::vector<std::size_t>& sizes)
    -> std::unique_ptr<State> {
  auto state = std::make_unique<State>();
#if LATHER_ENABLE_MPI
  state->group = group;
  void* mine = nullptr;
  // MPI places the ranks' segments one after the other unless told otherwise (the info key
  // alloc_shared_noncontig).
  check_mpi(MPI_Win_allocate_shared(MPI_Aint(bytes), 1, MPI_INFO_NULL, group.native(), &mine, &state->window),
            "MPI_Win_allocate_shared");
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, state->window), "MPI_Win_lock_all");
  state->bytes = bytes;
  state->slots.resize(std::size_t(group.size()));
  sizes.assign(std::size_t(group.size()), 0);
  for (int r = 0; r < group.size(); ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    check_mpi(MPI_Win_shared_query(state->window, r, &size, &unit, &state->slots[std::size_t(r)]),
              "MPI_Win_shared_query");
    sizes[std::size_t(r)] = std::size_t(size);
  }
#else
  (void)group;
  (void)bytes;
  (void)sizes;
  LATHER_FAIL("NodeWindow: needs MPI");
#endif
  return state;
}

void NodeWindow::reserve(const Group& group, std::size_t bytes) {
  if (m_state && m_state->bytes >= bytes) return;
  m_state.reset();  // collective: the old window first
  std::vector<std::size_t> sizes;
  m_state = open(group, (std::max<std::size_t>(bytes, 64) + 63) / 64 * 64, sizes);
}

bool NodeWindow::allocate_contiguous(const Group& group, std::size_t bytes) {
#if LATHER_ENABLE_MPI
  m_state.reset();  // collective: the old window first
  std::vector<std::size_t> sizes;
  auto state = open(group, bytes, sizes);
  // Each slot with bytes must start where the previous ones end.
  const char* end = static_cast<const char*>(state->slots[0]) + sizes[0];
  for (int r = 1; r < group.size(); ++r) {
    if (sizes[std::size_t(r)] == 0) continue;
    if (static_cast<const char*>(state->slots[std::size_t(r)]) != end) return false;  // freed, on every rank alike
    end += sizes[std::size_t(r)];
  }
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

void NodeWindow::sync_memory() const {
#if LATHER_ENABLE_MPI
  check_mpi(MPI_Win_sync(m_state->window), "MPI_Win_sync");
#endif
}

Request NodeWindow::start_barrier() const {
#if LATHER_ENABLE_MPI
  return m_state->group.start_barrier();
#else
  return Request();
#endif
}

}  // namespace lather::comm
