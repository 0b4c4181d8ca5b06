#pragma once
// The ranks that hold the same optimizer state (one data-parallel group) and share the work of
// computing inverse roots. Lather's optimizers see only this interface; comm::MpiWorkGroup
// implements it over an MPI communicator, so nothing in optim/ depends on MPI.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lather::optim {

class WorkGroup {
 public:
  virtual ~WorkGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// All-gather of byte buffers in host memory: rank r contributes counts[r] bytes; `received`
  /// holds sum(counts) bytes, rank 0's first. Every rank passes the same counts.
  virtual void allgatherv(const void* send, std::size_t bytes, void* received,
                          const std::vector<std::size_t>& counts) = 0;
  /// Element-wise maximum over the group, in place; used to agree before collectives.
  virtual void max_in_place(std::vector<std::int64_t>& values) = 0;
  /// Element-wise sum over the group, in place (e.g. squared norms of a tensor split over it).
  virtual void sum_in_place(std::vector<double>& values) = 0;
};

/// How statistics are assigned to the ranks of a group for their inverse roots.
enum class RootAssignment {
  even,     ///< the reference: the padded stack split into equal contiguous slices by count
  balanced  ///< greedy longest-processing-time on the root cost n^3
};

/// owner[s] for each statistic of the given sizes; cost of statistic s is size[s]^3.
std::vector<int> assign_statistics(const std::vector<int>& sizes, int ranks, RootAssignment how);
/// max over ranks of the summed n^3 cost, divided by the mean over ranks (1 is perfect balance).
double load_imbalance(const std::vector<int>& sizes, const std::vector<int>& owner, int ranks);

}  // namespace lather::optim
