#pragma once
// The distribution strategy of a matrix optimizer's step (Shampoo, SOAP, Muon) over the ranks of
// its data-parallel group: which rank updates each block, and how every rank gets every block's
// new values. The optimizer keeps the mathematics; it asks its Distributor where a block goes,
// runs its share of the step through it, and hands it the results to exchange.
//
// Terms used here and by the optimizers:
//  * a *block* is what one rank updates whole: a Shampoo block (or a range of a tensor on the
//    graft path), a SOAP block, a Muon matrix;
//  * the blocks are split into *parts*, one per rank that takes a share of the step (one part
//    when the step is replicated); a rank's *share* is the work on the blocks of its part;
//  * the *exchange* gives every rank every part's new values: the buffer holds one *segment* per
//    part, in part order, each the part's values followed by one failure flag; a rank writes its
//    part's values into its own segment, and the exchange fills in the others.
//
// Strategies: ReplicatedStep (every rank updates every block; nothing to exchange) and
// DistributedStep (the blocks are split over the group by their cost, each rank keeps the state of
// its own part only, and one all-gather exchanges the segments; the flags make a failure of any
// rank's share the same error on every rank without another collective).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>
#include <lather/comm/node_window.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lather::optim {

/// Greedy longest-processing-time: the items by descending cost (ties: the lower index first),
/// each to the least loaded of `parts` parts (ties: the lower part). Returns each item's part; the
/// same on every rank.
std::vector<int> longest_processing_time(const std::vector<double>& costs, int parts);

/// An assignment of items to parts from their costs: Distributor::assign, or
/// longest_processing_time over a given part count.
using PartAssignment = std::function<std::vector<int>(const std::vector<double>& costs)>;

/// How a step is spread over the ranks of the group.
enum class Placement {
  replicated,   ///< every rank updates every block
  distributed,  ///< each rank updates the blocks of its part
};

struct ExchangeOptions {
  /// Where the whole group sits on one node and the values are host memory, the segments live in
  /// a node-shared window (MPI_Win_allocate_shared) and the exchange is a barrier instead of an
  /// all-gather. Only for an optimizer whose ranks pass another collective between an exchange and
  /// their next write to their segment: otherwise a rank could overwrite its segment while another
  /// still reads it. Decided (collectively) at the first exchange.
  bool shared_window = false;
};

template <class ExecutionSpace, class Scalar>
class Distributor {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Values = Kokkos::View<Scalar*, memory_space>;

  virtual ~Distributor();
  Distributor(const Distributor&) = delete;
  Distributor& operator=(const Distributor&) = delete;

  virtual Placement placement() const = 0;
  const comm::Group& group() const { return m_group; }
  /// How many parts the blocks are split into (1: replicated), and this rank's.
  virtual int parts() const = 0;
  virtual int part() const = 0;
  bool distributed() const { return placement() == Placement::distributed; }

  /// The part of each block, from each block's cost (the relative time of its share of a step).
  virtual std::vector<int> assign(const std::vector<double>& costs) const = 0;

  /// Runs this rank's share of a step. Replicated, what `work` throws propagates; distributed, the
  /// message is returned ("" on success) for agree() or exchange() to make an error of everywhere.
  /// `fault_point`: the test-only fault-injection point of the share (may be null).
  virtual std::string run_share(const char* fault_point, const std::function<void()>& work) const = 0;
  /// When `local_error` is not empty on any rank, every rank throws the same lather::Error
  /// ("<context>: <message> (on group rank k of n)"). Collective when distributed.
  virtual void agree(const std::string& context, const std::string& local_error) const = 0;
  /// Sums (or maxima) of values that each part computed over its own blocks, in place: over the
  /// group when distributed, nothing to do when replicated. Collective when distributed.
  virtual void combine(std::vector<double>& values, comm::Combine op) const = 0;
  virtual void combine(const ExecutionSpace& space, const Values& values, comm::Combine op) const = 0;

  // ---- the exchange ---------------------------------------------------------------------------

  /// Lays out the exchange buffer: part r's segment holds `part_elements[r]` values and its flag.
  /// Replicated, nothing is allocated. Local.
  virtual void lay_out(const ExecutionSpace& space, const std::vector<std::int64_t>& part_elements,
                       const std::string& label) = 0;
  /// Every segment, flags included (empty when replicated): part r's values start at offset(r).
  const Values& buffer() const { return m_buffer; }
  std::int64_t offset(int part) const { return m_offsets.empty() ? 0 : m_offsets[std::size_t(part)]; }
  /// This rank's values in buffer(), where its share writes its new values (empty when replicated).
  virtual Values segment() const = 0;
  /// A second buffer with buffer()'s layout (to gather state with exchange(..., other)).
  Values make_buffer(const ExecutionSpace& space, const std::string& label) const;
  /// Collective when distributed: every part's values to every rank, in buffer() (or `other`,
  /// laid out alike), with each rank's verdict on its share (`local_error`): when any rank failed,
  /// every rank throws as agree() does. Replicated: throws a non-empty `local_error`.
  virtual void exchange(const ExecutionSpace& space, const std::string& local_error, const std::string& context) = 0;
  virtual void exchange(const ExecutionSpace& space, const std::string& local_error, const std::string& context,
                        const Values& other) = 0;

 protected:
  explicit Distributor(comm::Group group) : m_group(std::move(group)) {}
  comm::Group m_group;
  Values m_buffer;
  std::vector<std::int64_t> m_offsets;  ///< per part: where its values start in m_buffer
};

/// The strategy for `placement` over `group`: distributed over a group of one rank is replicated.
template <class ExecutionSpace, class Scalar>
std::unique_ptr<Distributor<ExecutionSpace, Scalar>> make_distributor(Placement placement, const comm::Group& group,
                                                                      ExchangeOptions options = {});

}  // namespace lather::optim
