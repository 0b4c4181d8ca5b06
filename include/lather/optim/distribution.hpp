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
//
// A step's exchange: start_exchange(), then complete() hands the optimizer each *layer*
// (consecutive parameters one forward step reads together) to unpack. By default the whole list is
// one layer, gathered inside start_exchange() as exchange() does and unpacked at once. The
// exchange by layers (set_layers): a part's values lie in parameter order, so each layer is one
// range of every segment, and the exchange runs as one nonblocking all-gather per layer, each
// landing its ranges in place. start_exchange() agrees on the shares (one small collective) and
// starts them; complete() waits for a layer's just before the next forward reads it (PyTorch
// FSDP's forward prefetch, for a ZeRO-1 step). The values and the order of every sum are those of
// exchange(): only the time the other parts' values arrive differs.

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
  /// `parameter_starts[r][p]`: where parameter p's values start in part r's (one more entry, its
  /// end; non-decreasing), for the exchange by layers; empty where the optimizer exchanges whole
  /// segments only. Replicated, nothing is allocated. Local.
  virtual void lay_out(const ExecutionSpace& space, const std::vector<std::int64_t>& part_elements,
                       const std::string& label, std::vector<std::vector<std::int64_t>> parameter_starts) = 0;
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

  // ---- the exchange by layers ----------------------------------------------------------------

  /// Parameters [first, last) that one layer's forward reads together.
  using Layer = std::pair<std::size_t, std::size_t>;
  /// The layers of the next exchanges: consecutive ranges covering parameters [0, count) in order
  /// (lay_out's parameter_starts then required); empty: the whole list, exchanged at once. Returns
  /// whether the exchange now runs by layers (never when replicated: nothing is exchanged). Local.
  bool set_layers(std::vector<Layer> layers, std::size_t count);
  bool by_layers() const { return m_by_layers; }
  /// Collective when distributed: every rank's verdict on its share agreed first (throws as
  /// exchange() does), then, by layers, each layer's all-gather started. Returns whether they are
  /// in flight; false where the exchange is complete here (not by layers; replicated; a
  /// node-shared window, whose segments other ranks may rewrite once a later collective lets them;
  /// memory MPI cannot read in place), and then the caller completes every layer now.
  virtual bool start_exchange(const ExecutionSpace& space, const std::string& local_error,
                              const std::string& context) = 0;
  /// For each layer holding a parameter of [first, last) whose values have not been handed out
  /// since start_exchange(), in order: waits for its all-gather, then `unpack(layer.first,
  /// layer.last)` copies its values out of buffer(). Local; nothing pending, nothing to do.
  void complete(std::size_t first, std::size_t last, const std::function<void(std::size_t, std::size_t)>& unpack);
  /// Whether any layer's values wait for complete().
  bool pending() const;

 protected:
  explicit Distributor(comm::Group group) : m_group(std::move(group)) {}
  /// Waits for layer k's all-gather (nothing where none is in flight), then lets MPI progress the
  /// later ones.
  virtual void wait_layer(std::size_t layer) = 0;
  comm::Group m_group;
  Values m_buffer;
  std::vector<std::int64_t> m_offsets;                        ///< per part: where its values start in m_buffer
  std::vector<std::vector<std::int64_t>> m_parameter_starts;  ///< per part, per parameter (lay_out)
  std::vector<Layer> m_layers;   ///< set_layers' (or the whole list: lay_out's parameter_starts)
  bool m_by_layers = false;      ///< whether m_layers are set_layers' own
  std::vector<char> m_unpacked;  ///< per layer: its values handed out since the last start_exchange
};

/// The strategy for `placement` over `group`: distributed over a group of one rank is replicated.
template <class ExecutionSpace, class Scalar>
std::unique_ptr<Distributor<ExecutionSpace, Scalar>> make_distributor(Placement placement, const comm::Group& group,
                                                                      ExchangeOptions options = {});

}  // namespace lather::optim
