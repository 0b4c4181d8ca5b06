#pragma once
// The exchange between the ranks of a Shampoo group after the roots, through its comm::Group:
// every rank learns every statistic's metrics and (replicated step) the preconditioners the other
// ranks computed. Preconditioners travel packed in their storage format (dense or quantized) in
// device buffers, which go to MPI directly where it can read them.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/comm/group.hpp>
#include <lather/optim/impl/matrix_store.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/statistic_metrics.hpp>

#include <cstring>
#include <vector>

namespace lather::optim::Impl {

template <class ExecutionSpace, class T>
class RootExchange {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Store = MatrixStore<ExecutionSpace, T>;
  using Bytes = Kokkos::View<char*, memory_space>;

  explicit RootExchange(comm::Group group) : m_group(std::move(group)) {}

  /// Every rank learns the metrics of every statistic in `local` (computed by owner[s]); with
  /// `preconditioners_too`, also the preconditioners, unpacked into `preconditioners` at slot_of[s].
  /// `failed`: this rank's roots failed. Every rank says so in the exchange of the metrics, before
  /// any preconditioner moves; if any did, nothing is exchanged further and true is returned on
  /// every rank (the caller then agrees on the message).
  bool share_roots(const ExecutionSpace& space, const ShampooPlan& plan, const std::vector<int>& local,
                   const std::vector<int>& owner, const std::vector<int>& slot_of,
                   std::vector<StatisticMetrics>& metrics, Store& preconditioners, bool preconditioners_too,
                   bool failed = false) {
    ::lather::Impl::ScopedRegion region("Lather::Shampoo::exchange_roots");
    const int ranks = m_group.size(), rank = m_group.rank();
    // Per rank: whether its roots failed, then the metrics (error, iterations, consecutive
    // failures, failures) of each statistic it owns.
    std::vector<std::size_t> counts(ranks, 1);
    for (int s : local) counts[owner[s]] += metric_words;
    std::vector<double> mine = {failed ? 1.0 : 0.0};
    for (int s : local)
      if (owner[s] == rank) {
        const auto& mt = metrics[s];
        mine.insert(mine.end(),
                    {mt.error, double(mt.iterations), double(mt.consecutive_failures), double(mt.failures)});
      }
    std::vector<double> all(total(counts));
    m_group.allgatherv(mine.data(), all.data(), counts);
    std::vector<std::size_t> at = starts(counts);
    for (int r = 0; r < ranks; ++r)
      if (all[at[r]++] != 0.0) return true;
    for (int s : local) {
      const double* in = all.data() + at[owner[s]];
      at[owner[s]] += metric_words;
      if (owner[s] == rank) continue;
      auto& mt = metrics[s];
      mt.error = in[0];
      mt.iterations = int(in[1]);
      mt.consecutive_failures = int(in[2]);
      mt.failures = long(in[3]);
    }
    if (preconditioners_too) share_preconditioners(space, plan, local, owner, slot_of, preconditioners);
    return false;
  }

 private:
  static constexpr std::size_t metric_words = 4;

  static std::size_t total(const std::vector<std::size_t>& counts) {
    std::size_t sum = 0;
    for (auto c : counts) sum += c;
    return sum;
  }
  static std::vector<std::size_t> starts(const std::vector<std::size_t>& counts) {
    std::vector<std::size_t> at(counts.size(), 0);
    for (std::size_t r = 1; r < counts.size(); ++r) at[r] = at[r - 1] + counts[r - 1];
    return at;
  }

  /// All-gathers the preconditioners of `statistics` (each packed by its owner) into every rank's
  /// `preconditioners` at slot_of[s].
  void share_preconditioners(const ExecutionSpace& space, const ShampooPlan& plan, const std::vector<int>& statistics,
                             const std::vector<int>& owner, const std::vector<int>& slot_of, Store& preconditioners) {
    const int ranks = m_group.size(), rank = m_group.rank();
    std::vector<std::size_t> counts(ranks, 0);
    for (int s : statistics) counts[owner[s]] += preconditioners.packed_bytes(plan.statistic_size[s]);
    m_outgoing.clear();
    std::int64_t offset = 0;
    for (int s : statistics)
      if (owner[s] == rank) {
        m_outgoing.add(slot_of[s], plan.statistic_size[s], offset, 0);
        offset += std::int64_t(preconditioners.packed_bytes(plan.statistic_size[s]));
      }
    ensure(m_send, counts[rank]);
    ensure(m_receive, total(counts));
    m_outgoing.upload(space);
    preconditioners.pack(space, m_outgoing, m_send);
    m_group.allgatherv(space, Kokkos::View<const char*, memory_space>(Kokkos::subview(m_send, range(counts[rank]))),
                       Bytes(Kokkos::subview(m_receive, range(total(counts)))), counts);
    m_incoming.clear();
    std::vector<std::size_t> at = starts(counts);
    for (int s : statistics) {
      if (owner[s] != rank) m_incoming.add(slot_of[s], plan.statistic_size[s], std::int64_t(at[owner[s]]), 0);
      at[owner[s]] += preconditioners.packed_bytes(plan.statistic_size[s]);
    }
    m_incoming.upload(space);
    preconditioners.unpack(space, m_incoming, m_receive);
  }

  static std::pair<std::size_t, std::size_t> range(std::size_t n) { return {0, n}; }
  static void ensure(Bytes& bytes, std::size_t n) {
    if (bytes.extent(0) < std::max<std::size_t>(n, 1))
      bytes = Bytes(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::Shampoo::exchange"),
                    std::max<std::size_t>(n, 1));
  }

  comm::Group m_group;
  Bytes m_send, m_receive;
  SlotList<memory_space> m_outgoing, m_incoming;
};

}  // namespace lather::optim::Impl
