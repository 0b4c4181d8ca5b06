#pragma once
// The two distribution strategies of distribution.hpp, for explicit instantiation:
// src/optim/distribution.cpp instantiates them for lather::DefaultExecutionSpace (and the host
// space on device builds); a program that needs another execution space includes this header.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/comm/device_mpi.hpp>
#include <lather/comm/request.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/optim/distribution.hpp>

#include <algorithm>
#include <type_traits>
#include <utility>

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
Distributor<ExecutionSpace, Scalar>::~Distributor() = default;

template <class ExecutionSpace, class Scalar>
auto Distributor<ExecutionSpace, Scalar>::make_buffer(const ExecutionSpace& space, const std::string& label) const
    -> Values {
  return Values(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label), m_buffer.extent(0));
}

template <class ExecutionSpace, class Scalar>
bool Distributor<ExecutionSpace, Scalar>::set_layers(std::vector<Layer> layers, std::size_t count) {
  std::size_t next = 0;
  for (const auto& [first, last] : layers) {
    LATHER_REQUIRE(first == next && last > first, "Distributor::set_layers: layer [", first, ", ", last,
                   ") does not follow parameter ", next, " (layers are consecutive, non-empty ranges)");
    next = last;
  }
  LATHER_REQUIRE(layers.empty() || next == count, "Distributor::set_layers: the layers end at parameter ", next, " of ",
                 count);
  if (placement() == Placement::replicated) return false;
  if (!layers.empty())
    LATHER_REQUIRE(m_parameter_starts.size() == std::size_t(parts()) &&
                       std::all_of(m_parameter_starts.begin(), m_parameter_starts.end(),
                                   [&](const auto& starts) { return starts.size() == count + 1; }),
                   "Distributor::set_layers: the exchange was laid out without each parameter's place in the parts");
  LATHER_REQUIRE(!pending(), "Distributor::set_layers: an exchange by layers is still pending");
  m_by_layers = !layers.empty();
  m_layers = m_by_layers ? std::move(layers) : std::vector<Layer>{{0, count}};
  m_unpacked.assign(m_layers.size(), 1);
  return m_by_layers;
}

template <class ExecutionSpace, class Scalar>
void Distributor<ExecutionSpace, Scalar>::complete(std::size_t first, std::size_t last,
                                                   const std::function<void(std::size_t, std::size_t)>& unpack) {
  for (std::size_t k = 0; k < m_layers.size(); ++k) {
    if (m_unpacked[k] || m_layers[k].second <= first || m_layers[k].first >= last) continue;
    wait_layer(k);
    m_unpacked[k] = 1;  // before unpack: a failed copy is not retried over half-written values
    unpack(m_layers[k].first, m_layers[k].second);
  }
}

template <class ExecutionSpace, class Scalar>
bool Distributor<ExecutionSpace, Scalar>::pending() const {
  return std::any_of(m_unpacked.begin(), m_unpacked.end(), [](char done) { return !done; });
}

namespace Impl {

/// flags(r) = buffer(positions(r)) for every part r. A free function: nvcc takes no device lambda
/// in a private member function.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void collect_flags(const ExecutionSpace& space, const Kokkos::View<Scalar*, MemorySpace>& buffer,
                   const Kokkos::View<std::size_t*, MemorySpace>& positions,
                   const Kokkos::View<Scalar*, MemorySpace>& flags) {
  Kokkos::parallel_for(
      "Lather::Distributor::collect_flags", Kokkos::RangePolicy<ExecutionSpace>(space, 0, positions.extent(0)),
      KOKKOS_LAMBDA(std::size_t r) { flags(r) = buffer(positions(r)); });
}

/// Every rank updates every block: one part, no exchange, failures thrown where they happen.
template <class ExecutionSpace, class Scalar>
class ReplicatedStep final : public Distributor<ExecutionSpace, Scalar> {
 public:
  using typename Distributor<ExecutionSpace, Scalar>::Values;
  explicit ReplicatedStep(comm::Group group) : Distributor<ExecutionSpace, Scalar>(std::move(group)) {}

  Placement placement() const override { return Placement::replicated; }
  int parts() const override { return 1; }
  int part() const override { return 0; }
  std::vector<int> assign(const std::vector<double>& costs) const override { return std::vector<int>(costs.size(), 0); }
  std::string run_share(const char*, const std::function<void()>& work) const override {
    work();
    return {};
  }
  void agree(const std::string& context, const std::string& local_error) const override {
    LATHER_REQUIRE(local_error.empty(), context.empty() ? "" : context + ": ", local_error);
  }
  void combine(std::vector<double>&, comm::Combine) const override {}
  void combine(const ExecutionSpace&, const Values&, comm::Combine) const override {}
  void lay_out(const ExecutionSpace&, const std::vector<std::int64_t>&, const std::string&,
               std::vector<std::vector<std::int64_t>>) override {}
  Values segment() const override { return {}; }
  void exchange(const ExecutionSpace&, const std::string& local_error, const std::string& context) override {
    agree(context, local_error);
  }
  void exchange(const ExecutionSpace&, const std::string& local_error, const std::string& context,
                const Values&) override {
    agree(context, local_error);
  }
  bool start_exchange(const ExecutionSpace&, const std::string& local_error, const std::string& context) override {
    agree(context, local_error);
    return false;  // every rank holds every value: nothing was exchanged, nothing to unpack
  }

 protected:
  void wait_layer(std::size_t) override {}
};

/// The blocks split over the group's ranks by cost; one all-gather (or, on one node and with
/// ExchangeOptions::shared_window, a barrier on a node-shared window) exchanges the segments.
template <class ExecutionSpace, class Scalar>
class DistributedStep final : public Distributor<ExecutionSpace, Scalar> {
 public:
  using typename Distributor<ExecutionSpace, Scalar>::Values;
  using typename Distributor<ExecutionSpace, Scalar>::memory_space;

  DistributedStep(comm::Group group, ExchangeOptions options)
      : Distributor<ExecutionSpace, Scalar>(std::move(group)), m_options(options) {}

  Placement placement() const override { return Placement::distributed; }
  int parts() const override { return this->m_group.size(); }
  int part() const override { return this->m_group.rank(); }
  std::vector<int> assign(const std::vector<double>& costs) const override {
    return longest_processing_time(costs, parts());
  }
  std::string run_share(const char* fault_point, const std::function<void()>& work) const override {
    return ::lather::Impl::local_failure(fault_point, work);
  }
  void agree(const std::string& context, const std::string& local_error) const override {
    this->m_group.agree_on_failure(context, local_error);
  }
  void combine(std::vector<double>& values, comm::Combine op) const override { this->m_group.allreduce(values, op); }
  void combine(const ExecutionSpace& space, const Values& values, comm::Combine op) const override {
    this->m_group.allreduce(space, values, op);
  }

  void lay_out(const ExecutionSpace& space, const std::vector<std::int64_t>& part_elements, const std::string& label,
               std::vector<std::vector<std::int64_t>> parameter_starts) override {
    const std::size_t ranks = std::size_t(parts());
    LATHER_REQUIRE(part_elements.size() == ranks, "Distributor::lay_out: ", part_elements.size(),
                   " part sizes for a group of ", ranks);
    LATHER_REQUIRE(!this->pending(), "Distributor::lay_out: an exchange by layers is still pending");
    LATHER_REQUIRE(parameter_starts.empty() || parameter_starts.size() == ranks,
                   "Distributor::lay_out: ", parameter_starts.size(), " parts' parameter starts for a group of ",
                   ranks);
    for (std::size_t r = 0; r < parameter_starts.size(); ++r)
      LATHER_REQUIRE(!parameter_starts[r].empty() && parameter_starts[r].front() == 0 &&
                         parameter_starts[r].back() == part_elements[r] &&
                         std::is_sorted(parameter_starts[r].begin(), parameter_starts[r].end()),
                     "Distributor::lay_out: part ", r, "'s parameter starts do not run from 0 to its ",
                     part_elements[r], " values");
    this->m_parameter_starts = std::move(parameter_starts);
    // The whole list, one layer, until set_layers says otherwise.
    this->m_by_layers = false;
    this->m_layers.clear();
    if (!this->m_parameter_starts.empty()) this->m_layers.emplace_back(0, this->m_parameter_starts.front().size() - 1);
    this->m_unpacked.assign(this->m_layers.size(), 1);
    m_counts.clear();
    m_segment_start.assign(1, 0);
    this->m_offsets.clear();
    for (std::size_t r = 0; r < ranks; ++r) {
      this->m_offsets.push_back(std::int64_t(m_segment_start.back()));
      m_counts.push_back(std::size_t(part_elements[r]) + 1);  // + the failure flag
      m_segment_start.push_back(m_segment_start.back() + m_counts.back());
    }
    this->m_buffer = Values(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, label), m_segment_start.back());
    Kokkos::View<std::size_t*, Kokkos::HostSpace> positions("Lather::Distributor::flag_positions", ranks);
    for (std::size_t r = 0; r < ranks; ++r) positions(r) = m_segment_start[r + 1] - 1;
    m_flag_positions = Kokkos::View<std::size_t*, memory_space>(
        Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::Distributor::flag_positions"), ranks);
    Kokkos::deep_copy(space, m_flag_positions, positions);
    m_flags = Values(Kokkos::view_alloc(space, "Lather::Distributor::flags"), ranks);
    m_flags_host = Kokkos::create_mirror_view(m_flags);
    m_window_state = m_options.shared_window ? WindowState::undecided : WindowState::messages;
    ::lather::Impl::fence(space, "Lather::Distributor: flag positions copied");
  }

  Values segment() const override {
    const std::size_t first = m_segment_start[std::size_t(part())];
    return Kokkos::subview(this->m_buffer, std::make_pair(first, m_segment_start[std::size_t(part()) + 1] - 1));
  }

  void exchange(const ExecutionSpace& space, const std::string& local_error, const std::string& context) override {
    if (m_window_state == WindowState::undecided) place_in_window(space);
    gather(space, local_error, context, this->m_buffer, m_window_state == WindowState::window);
  }
  void exchange(const ExecutionSpace& space, const std::string& local_error, const std::string& context,
                const Values& other) override {
    gather(space, local_error, context, other, false);
  }

  bool start_exchange(const ExecutionSpace& space, const std::string& local_error,
                      const std::string& context) override {
    LATHER_REQUIRE(!this->m_layers.empty(), "Distributor::start_exchange: laid out without parameter starts");
    LATHER_REQUIRE(!this->pending(), "Distributor::start_exchange: the last exchange's values were not all unpacked");
    if (m_window_state == WindowState::undecided) place_in_window(space);
    const bool in_flight = this->by_layers() && m_window_state == WindowState::messages &&
                           comm::mpi_reads_in_place<memory_space>() && this->parts() > 1;
    m_requests.clear();
    if (!in_flight) {
      // The whole exchange now, its flags agreeing on the shares.
      gather(space, local_error, context, this->m_buffer, m_window_state == WindowState::window);
    } else {
      // The shares agreed before any value moves: a failure is the same error on every rank here,
      // in the step, and no gather is ever left without its ranks.
      this->m_group.agree_on_failure(context, local_error);
      ::lather::Impl::fence(space, "Lather::Distributor: own segment written before its layers move");
      const auto ranks = std::size_t(parts());
      const auto rank = std::size_t(part());
      std::vector<std::size_t> counts(ranks), displacements(ranks);
      for (const auto& [first, last] : this->m_layers) {
        for (std::size_t r = 0; r < ranks; ++r) {
          const auto& starts = this->m_parameter_starts[r];
          counts[r] = std::size_t(starts[last] - starts[first]);
          displacements[r] = m_segment_start[r] + std::size_t(starts[first]);
        }
        Scalar* at = this->m_buffer.data();
        m_requests.push_back(this->m_group.start_allgatherv(at + displacements[rank], at, counts, displacements));
      }
    }
    std::fill(this->m_unpacked.begin(), this->m_unpacked.end(), char(0));
    return in_flight;
  }

 protected:
  void wait_layer(std::size_t layer) override {
    if (layer >= m_requests.size()) return;
    m_requests[layer].wait();
    for (std::size_t k = layer + 1; k < m_requests.size(); ++k)
      if (m_requests[k].active()) m_requests[k].test();
  }

 private:
  /// Whether the buffer lives in a node-shared window: not decided until the first exchange.
  enum class WindowState { undecided, window, messages };

  /// Collective at the first exchange: on one node, the buffer moves into a window whose slots are
  /// the segments in part order (this rank's values are copied over).
  void place_in_window(const ExecutionSpace& space) {
    m_window_state = WindowState::messages;
    if constexpr (::lather::Impl::runs_on_host<ExecutionSpace> &&
                  std::is_same<memory_space, Kokkos::HostSpace>::value) {
      if (this->m_group.ranks_on_node() != this->m_group.size()) return;  // not on one node
      const std::size_t mine = m_counts[std::size_t(part())];
      if (!m_window.allocate_contiguous(this->m_group, mine * sizeof(Scalar))) return;
      const Values placed(static_cast<Scalar*>(m_window.slot(0)), this->m_buffer.extent(0));
      const std::size_t first = m_segment_start[std::size_t(part())];
      const auto own = std::make_pair(first, first + mine);
      ::lather::Impl::fence(space, "Lather::Distributor: own segment written before it moves");
      Kokkos::deep_copy(Kokkos::subview(placed, own), Kokkos::subview(this->m_buffer, own));
      this->m_buffer = placed;
      m_window_state = WindowState::window;
    }
  }

  void gather(const ExecutionSpace& space, const std::string& local_error, const std::string& context,
              const Values& buffer, bool in_window) {
    // The flag closes this rank's segment; after the exchange every rank reads every flag, so all
    // agree on a failure without another collective (the message costs one more, on failure only).
    const auto rank = std::size_t(part());
    const std::size_t first = m_segment_start[rank], last = m_segment_start[rank + 1];
    Kokkos::deep_copy(space, Kokkos::subview(buffer, last - 1), Scalar(local_error.empty() ? 0 : 1));
    if (in_window) {
      // Every segment is in place once every rank has written its own.
      ::lather::Impl::fence(space, "Lather::Distributor: own segment in the shared window");
      m_window.synchronize();
    } else {
      this->m_group.allgatherv(
          space, Kokkos::View<const Scalar*, memory_space>(Kokkos::subview(buffer, std::make_pair(first, last))),
          buffer, m_counts);
    }
    collect_flags(space, buffer, m_flag_positions, m_flags);
    Kokkos::deep_copy(space, m_flags_host, m_flags);
    ::lather::Impl::fence(space, "Lather::Distributor: failure flags on the host");
    bool failed = false;
    for (std::size_t r = 0; r < m_flags_host.extent(0); ++r) failed = failed || m_flags_host(r) != Scalar(0);
    if (failed) this->m_group.agree_on_failure(context, local_error);
  }

  ExchangeOptions m_options;
  std::vector<std::size_t> m_counts;         ///< per part: its segment's elements, flag included
  std::vector<std::size_t> m_segment_start;  ///< per part: where its segment starts (+ the total)
  Kokkos::View<std::size_t*, memory_space> m_flag_positions;
  Values m_flags;
  typename Values::HostMirror m_flags_host;
  comm::NodeWindow m_window;
  WindowState m_window_state = WindowState::messages;
  /// Per layer: its all-gather in flight (the exchange by layers). Destroyed first: a Request
  /// destroyed while active waits, before the buffer it writes is freed.
  std::vector<comm::Request> m_requests;
};

}  // namespace Impl

template <class ExecutionSpace, class Scalar>
std::unique_ptr<Distributor<ExecutionSpace, Scalar>> make_distributor(Placement placement, const comm::Group& group,
                                                                      ExchangeOptions options) {
  if (placement == Placement::replicated || group.size() == 1)
    return std::make_unique<Impl::ReplicatedStep<ExecutionSpace, Scalar>>(group);
  return std::make_unique<Impl::DistributedStep<ExecutionSpace, Scalar>>(group, options);
}

}  // namespace lather::optim
