#pragma once
// Ownership of MPI communicators (RAII, freed once) and the few communicator queries every
// collective needs. Nothing else in Lather calls MPI_Comm_free.

#include <mpi.h>

#include <utility>
#include <vector>

namespace lather::comm {

/// Owns one communicator made by MPI_Comm_dup / MPI_Comm_split; MPI_Comm_free runs once, in the
/// destructor or reset(). Movable, not copyable; MPI_COMM_NULL is the empty state. A communicator
/// still held after MPI_Finalize is not freed (MPI forbids the call then).
class Communicator {
 public:
  Communicator() = default;
  /// Takes ownership of `owned`, which must not be MPI_COMM_WORLD or MPI_COMM_SELF.
  explicit Communicator(MPI_Comm owned) noexcept : m_comm(owned) {}
  ~Communicator() { reset(); }
  Communicator(Communicator&& other) noexcept
      : m_comm(std::exchange(other.m_comm, MPI_COMM_NULL)) {}
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      reset();
      m_comm = std::exchange(other.m_comm, MPI_COMM_NULL);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// MPI_Comm_dup(comm): collective over `comm`.
  static Communicator duplicate(MPI_Comm comm);
  /// MPI_Comm_split(comm, color, key): collective over `comm`; MPI_UNDEFINED gives an empty one.
  static Communicator split(MPI_Comm comm, int color, int key);

  MPI_Comm get() const noexcept { return m_comm; }
  explicit operator bool() const noexcept { return m_comm != MPI_COMM_NULL; }
  /// Frees the communicator now (if any).
  void reset() noexcept;

 private:
  MPI_Comm m_comm = MPI_COMM_NULL;
};

/// MPI_Comm_size / MPI_Comm_rank, throwing lather::Error for MPI_COMM_NULL.
int comm_size(MPI_Comm comm);
int comm_rank(MPI_Comm comm);

/// The rank in `world` of every rank of `group` (MPI_UNDEFINED where a rank is not in `world`).
/// Local: no communication.
std::vector<int> world_ranks(MPI_Comm group, MPI_Comm world = MPI_COMM_WORLD);

}  // namespace lather::comm
