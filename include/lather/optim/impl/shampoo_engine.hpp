#pragma once
// The Shampoo state and step, templated on the statistics precision T (float or double); the
// public Shampoo class picks T at run time from ShampooOptions::statistics_precision. The step is
// written once over its parts: the plan of blocks and who updates them (shampoo_plan.hpp), the
// statistics and preconditioner stores (matrix_store.hpp), the batched block products
// (block_products.hpp), the inverse-root phase (root_phase.hpp), the exchanges between ranks
// (root_exchange.hpp) and the element-wise passes (step_passes.hpp).
//
// A step on a rank: (1) its units' gradients are packed, once, with their squared norms; (2) the
// statistics of its blocks take their Gram matrices; (3) every preconditioning_compute_steps the
// inverse roots of the statistics it owns; (4) its blocks are preconditioned; (5) the graft and the
// norms grafting needs; (6) momentum and the parameter update of its units. Replicated, a rank's
// units are all units and the roots are exchanged; distributed, each rank updates its share and
// one all-gather of parameter values ends the step.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/comm/group.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/optim/distribution.hpp>
#include <lather/optim/impl/block_products.hpp>
#include <lather/optim/impl/finite_gradients.hpp>
#include <lather/optim/impl/matrix_store.hpp>
#include <lather/optim/impl/root_exchange.hpp>
#include <lather/optim/impl/async_roots.hpp>
#include <lather/optim/impl/root_phase.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/impl/step_passes.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/statistic_metrics.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace lather::optim::Impl {

/// The host threads of a rank's Shampoo.
struct HostThreads {
  int roots = 1;     ///< for the eigh roots
  int products = 1;  ///< sharing out the blocks' products on a host backend
};

/// options.root.host_threads and options.product_host_threads, each where it is 0 the threads of
/// `space` where it is a threaded host backend, else the CPUs this rank has to itself on its node
/// (the CPUs the node's ranks of both groups are bound to, shared among them; see
/// host_threads_for). Collective over both groups, whatever the options say: Shampoo's
/// constructor calls it on every rank before anything that may fail on one rank only (or differ
/// between ranks, as a rank given other options would) can part the ranks.
template <class ExecutionSpace>
HostThreads host_threads(const ShampooOptions& options, const comm::Group& group, const comm::Group& shards,
                         const ExecutionSpace& space) {
  const comm::NodeOccupancy on_node = group.node_occupancy(), shards_on_node = shards.node_occupancy();
  comm::NodeOccupancy both = on_node;  // the node's ranks of both groups, on the CPUs of either
  both.ranks *= shards_on_node.ranks;
  both.cpus = std::max(on_node.cpus, shards_on_node.cpus);
  const int share = both.cpu_share();
  using ::lather::Impl::host_threads_for;
  return {host_threads_for(space, options.root.host_threads, share),
          host_threads_for(space, options.product_host_threads, share)};
}

template <class ExecutionSpace, class Scalar>
class ShampooEngineBase {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Tensors = TensorList<Scalar, memory_space>;
  virtual ~ShampooEngineBase() = default;
  virtual void step(const ExecutionSpace& space, const Tensors& params, const Tensors& grads) = 0;
  virtual long step_count() const = 0;
  virtual StateMemoryReport memory_report() const = 0;
  virtual std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) = 0;
  virtual void state_restored(const ExecutionSpace& space, long step_count) = 0;
  virtual void state_released() = 0;
  virtual const ShampooOptions& options() const = 0;
  virtual const ShampooPlan& plan() const = 0;
  virtual bool distributed() const = 0;
  virtual std::vector<StatisticMetrics> metrics() const = 0;
  virtual double root_load_imbalance() const = 0;
  virtual std::vector<double> matrix(const ExecutionSpace& space, int s, bool preconditioner) const = 0;
  virtual void measure_phases(bool on) = 0;
  virtual std::vector<std::pair<std::string, double>> phase_seconds() const = 0;
  virtual long gemm_launches() const = 0;
  virtual double product_flops() const = 0;
  /// Which parameters' pieces this rank counts in the per-tensor sums over the shards
  /// (Impl::counted_pieces); until set, all of them.
  virtual void set_counted_pieces(std::vector<char> counted) = 0;
  virtual bool overlap_exchange(const ExecutionSpace& space,
                                std::vector<std::pair<std::size_t, std::size_t>> layers) = 0;
  virtual void values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) = 0;
};

template <class ExecutionSpace, class Scalar, class T>
class ShampooEngine final : public ShampooEngineBase<ExecutionSpace, Scalar> {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Tensors = TensorList<Scalar, memory_space>;
  template <class X>
  using V1 = Kokkos::View<X*, memory_space>;
  using Store = MatrixStore<ExecutionSpace, T>;

  /// Makes no collective call: Shampoo's constructor agrees on its outcome. `threads`: its host
  /// threads (see host_threads).
  ShampooEngine(const ExecutionSpace& space, const std::vector<ParameterSpec>& parameters,
                const ShampooOptions& options, comm::Group group, comm::Group shards, HostThreads threads)
      : m_options(options), m_group(std::move(group)), m_shards(std::move(shards)), m_exchange(m_group) {
    m_options.validate();
    m_plan = make_plan(parameters, m_options);
    const bool distributed = m_options.step_mode == StepMode::distributed || m_options.shard_optimizer_states ||
                             (m_options.step_mode == StepMode::automatic && m_group.size() > 1);
    // The exchange may go through node-shared memory: every rank passes the norms' collective at
    // the start of its next step before it rewrites its segment (ExchangeOptions::shared_window).
    ExchangeOptions exchange;
    exchange.shared_window = m_options.shared_memory_gather;
    m_distributor = make_distributor<ExecutionSpace, Scalar>(
        distributed ? Placement::distributed : Placement::replicated, m_group, exchange);
    m_step_plan = make_step_plan(m_plan, m_options, m_group.size(), *m_distributor);
    m_metrics.resize(m_plan.num_statistics());
    for (int s = 0; s < m_plan.num_statistics(); ++s)
      m_metrics[s] = {m_plan.statistic_owner[s],
                      m_plan.statistic_size[s],
                      m_plan.statistic_exponent[s],
                      m_step_plan.root_owner[s],
                      0.0,
                      0,
                      0,
                      0};
    for (int s : m_plan.local_statistics)
      if (m_step_plan.root_owner[s] == m_group.rank()) m_mine.push_back(s);
    // Asynchronous roots in the background on a host backend make LAPACK calls while the step
    // runs, on the BLAS's thread count as it stands at each call (and dsyevd rounds otherwise on
    // 1 thread than on 2): host threads for the products, which set the count to 1 for their
    // phase, would make the roots depend on timing. There the products keep to this thread, and
    // so do the element-wise passes, the roots' threads having the CPUs.
    const bool roots_in_background =
        ::lather::Impl::runs_on_host<ExecutionSpace> && m_options.async_roots && m_options.async_roots_in_background;
    m_step_threads = roots_in_background ? 1 : threads.products;
    allocate_stores(space);
    allocate_state(space);
    m_roots = std::make_unique<RootPhase<ExecutionSpace, T>>(space, m_options, m_plan.max_size, int(m_mine.size()),
                                                             threads.roots);
    if (m_options.async_roots)
      m_async_roots = std::make_unique<AsyncRoots<ExecutionSpace, T>>(
          m_options, async_root_threads<memory_space>(m_options, threads.roots));
    m_products = std::make_unique<BlockProducts<ExecutionSpace, T>>(
        space, m_plan, m_step_plan, m_options.root.workspace_bytes, quantized(), m_step_threads,
        m_options.product_host_threads == 0, m_options.kl_shampoo, m_options.product_precision);
  }

  // ---------------------------------------------------------------------------------------------
  void step(const ExecutionSpace& space, const Tensors& params, const Tensors& grads) override {
    ::lather::Impl::ScopedRegion region("Lather::Shampoo::step");
    const long t = m_step;
    values_needed(space, 0, m_plan.parameters.size());  // the last exchange by layers, before the new pointers
    m_values.update(space, params);
    m_gradients.update(space, grads);
    Phases phases(*this, space);

    // (1) Pack, and agree on the gradients' norms: a NaN or Inf anywhere is refused on every rank
    // before any state moves, and so is a failure of the packing on any rank (its count travels
    // with the norms, its message in the agreement below). Distributed, a rank packs only its own
    // units: it scans its whole gradient first, and a NaN or Inf in its copy of a unit another
    // rank updates is a failure of its packing. Replicated, the packing reads every element.
    std::string local_error;
    if (m_step_plan.distributed) {
      const int bad = first_non_finite(space, grads);
      if (bad >= 0) local_error = non_finite_gradient_message(m_plan.parameters[std::size_t(bad)].spec.name);
    }
    if (local_error.empty())
      local_error = ::lather::Impl::local_failure("shampoo.pack", [&] {
        pack_gradients<ExecutionSpace, Scalar, T, memory_space>(space, m_mine_table, m_gradients.device(),
                                                                m_parameter_scalars, m_packed, m_packed_t, m_unit_norms,
                                                                m_mine_threads);
      });
    phases.end("pack");
    const AgreedNorms gradient = parameter_norms(space, !local_error.empty());
    const std::vector<SquaredNorms>& gradient_norm2 = gradient.norms;
    phases.end("communication");
    std::string bad_gradient;
    for (std::size_t p = 0; p < gradient_norm2.size() && bad_gradient.empty() && gradient.failures == 0; ++p)
      if (!std::isfinite(gradient_norm2[p].plain))
        bad_gradient = non_finite_gradient_message(m_plan.parameters[p].spec.name);
    // Distributed, the norms and the failure count were summed over the group (and the shards),
    // so its ranks see the same non-finite sum and count; they agree on a message only when some
    // rank failed. Replicated, each rank summed its own copy, and the shards each hold their own
    // copy of the unsplit parameters: a rank whose gradient differs (copies should agree, but
    // nothing may hang when they do not) tells the others before any exchange, over both groups,
    // throwing only once both agreed.
    const std::string context = ::lather::Impl::concat("Shampoo::step ", m_step);
    const bool summed_over_group = m_step_plan.distributed || m_group.size() == 1;
    if (!local_error.empty()) local_error = context + ": " + local_error;
    if (summed_over_group && m_shards.size() == 1) {
      if (gradient.failures > 0) agree_everywhere(local_error);
      LATHER_REQUIRE(bad_gradient.empty(), context, ": ", bad_gradient);
    } else {
      std::string agreed = !local_error.empty()   ? local_error
                           : bad_gradient.empty() ? bad_gradient
                                                  : context + ": " + bad_gradient;
      if (!summed_over_group || gradient.failures > 0) {
        try {
          m_group.agree_on_failure("", summed_over_group ? local_error : agreed);
        } catch (const Error& e) {
          agreed = e.message();
        }
      }
      m_shards.agree_on_failure("", agreed);
    }
    const T* blocks = m_packed_t.extent(0) > 0 ? m_packed_t.data() : reinterpret_cast<const T*>(m_packed.data());

    // (2)-(4) Statistics, roots, preconditioning of this rank's blocks.
    if (t % m_options.statistics_compute_steps == 0) {
      ::lather::Impl::ScopedRegion statistics("Lather::Shampoo::statistics");
      const double beta2 = m_options.beta2;
      const T w1(beta2), w2(beta2 == 1.0 ? 1.0 : 1.0 - beta2);
      // KL-Shampoo's Gram matrices are of the blocks preconditioned along their other dimensions
      // with the preconditioners in use (the last roots'): the direction's buffer, written only
      // by step (4), holds them meanwhile.
      if (m_options.kl_shampoo)
        m_products->update_kl_statistics(space, blocks, *m_preconditioners, *m_statistics, w1, w2, m_direction.data());
      else
        m_products->update_statistics(space, blocks, *m_statistics, w1, w2);
      phases.end("statistics");
    }
    if (t % m_options.preconditioning_compute_steps == 0) {
      statistics_symmetric(space);
      compute_preconditioners(space, phases);
    }
    {
      ::lather::Impl::ScopedRegion precondition("Lather::Shampoo::precondition");
      m_products->precondition(space, blocks, *m_preconditioners, m_direction.data());
      phases.end("precondition");
    }

    // (5) The graft and the norms that scale the two directions, per parameter. Distributed,
    // the rest of the step ends in the all-gather of the new values: a failure of this rank's
    // share of the work travels with the norms, and every rank throws it.
    const auto c = step_scalars(t);
    set_gradient_scales(space, gradient_norm2);
    const auto graft = [&] {
      graft_and_norms<ExecutionSpace, Scalar, T, memory_space>(space, m_mine_table, c, m_parameter_scalars, m_direction,
                                                               m_diagonal, m_packed, m_unit_norms, m_mine_threads);
    };
    const std::string share_error = m_distributor->run_share("shampoo.distributed_step", graft);
    phases.end("graft");
    const AgreedNorms norms = parameter_norms(space, !share_error.empty());
    phases.end("communication");
    if (norms.failures > 0) agree_everywhere(share_error.empty() ? share_error : context + ": " + share_error);
    set_multipliers(space, norms.norms, c.lr);
    if (grafts_per_block()) scale_blocks(space);

    // (6) Momentum and the update; distributed, every rank's new values to every rank.
    UpdateElement<Scalar, T, memory_space> element = update_element(c);
    if (m_quantized_columns > 0) {
      // The new column scales of int8 momentum: the column maxima over every rank's units.
      Kokkos::deep_copy(space, m_scales[1], Scalar(0));
      column_maxima<ExecutionSpace, Scalar, T, memory_space>(space, m_mine_table, m_values.device(),
                                                             m_parameter_scalars, element);
      if (m_step_plan.distributed || m_row_split_columns > 0) phases.end("update");
      m_distributor->combine(space, m_scales[1], comm::Combine::max);
      if (m_row_split_columns > 0) {
        // Tensors split by rows: the maxima over the shards (their columns come first).
        const auto first = std::make_pair(std::size_t(0), std::size_t(m_row_split_columns));
        const auto second =
            std::make_pair(std::size_t(m_quantized_columns), std::size_t(m_quantized_columns + m_row_split_columns));
        m_shards.allreduce(space, V1<Scalar>(Kokkos::subview(m_scales[1], first)), comm::Combine::max);
        m_shards.allreduce(space, V1<Scalar>(Kokkos::subview(m_scales[1], second)), comm::Combine::max);
      }
      if (m_step_plan.distributed || m_row_split_columns > 0) phases.end("communication");
    }
    // Distributed, the new values also go to this rank's segment of the exchange, which then fills
    // in the other parts; only those are unpacked into the parameters.
    update_parameters<ExecutionSpace, Scalar, T, memory_space>(
        space, m_mine_table, m_values.device(), m_parameter_scalars, element, m_distributor->segment(), m_mine_threads);
    std::swap(m_scales[0], m_scales[1]);  // the new scales are the current ones from here on
    phases.end("update");
    if (m_step_plan.distributed) {
      // By layers, their all-gathers may be left in flight for the next forward (values_needed).
      const bool in_flight = m_distributor->start_exchange(space, "", context);
      phases.end("communication");
      if (!in_flight) values_needed(space, 0, m_plan.parameters.size());
      phases.end("update");
    }
    ++m_step;
  }

  bool overlap_exchange(const ExecutionSpace& space, std::vector<std::pair<std::size_t, std::size_t>> layers) override;
  void values_needed(const ExecutionSpace& space, std::size_t first, std::size_t last) override;

  long step_count() const override { return m_step; }
  const ShampooOptions& options() const override { return m_options; }
  const ShampooPlan& plan() const override { return m_plan; }
  bool distributed() const override { return m_step_plan.distributed; }
  std::vector<StatisticMetrics> metrics() const override { return m_metrics; }
  double root_load_imbalance() const override {
    std::vector<int> owner(m_plan.num_statistics(), -1);
    for (int s = 0; s < m_plan.num_statistics(); ++s) owner[s] = m_step_plan.root_owner[s];
    return load_imbalance(m_plan.statistic_size, owner, m_group.size());
  }
  void measure_phases(bool on) override { m_measure = on; }
  std::vector<std::pair<std::string, double>> phase_seconds() const override {
    return {m_phase_seconds.begin(), m_phase_seconds.end()};
  }
  long gemm_launches() const override { return m_products->launches() + m_root_gemm_calls; }
  double product_flops() const override { return m_products->flops(); }

  StateMemoryReport memory_report() const override;
  std::vector<StateArray<memory_space>> state_arrays(const ExecutionSpace& space) override;
  void state_restored(const ExecutionSpace& space, long step_count) override;
  void state_released() override;

  std::vector<double> matrix(const ExecutionSpace& space, int s, bool preconditioner) const override {
    LATHER_REQUIRE(s >= 0 && s < m_plan.num_statistics(), "Shampoo: statistic ", s, " out of range [0, ",
                   m_plan.num_statistics(), ")");
    LATHER_REQUIRE(m_step_plan.slot[s] >= 0, "Shampoo: statistic ", s, " is not stored on this rank (group rank ",
                   m_group.rank(),
                   m_step_plan.root_owner[s] < 0 ? ", it belongs to another weight shard)"
                                                 : "; the distributed step keeps it on its block's rank)");
    if (!preconditioner) statistics_symmetric(space);
    const Store& store = preconditioner ? *m_preconditioners : *m_statistics;
    return store.host_matrix(space, m_step_plan.slot[s], m_plan.statistic_size[s]);
  }

  // Public, not private: nvcc rejects an extended __host__ __device__ lambda (KOKKOS_LAMBDA) whose
  // enclosing member function is private or protected.
 public:
  /// Seconds by phase when measuring (the execution space fenced at each boundary).
  class Phases {
   public:
    Phases(ShampooEngine& engine, const ExecutionSpace& space) : m_engine(engine), m_space(space) {}
    void end(const char* phase) {
      if (!m_engine.m_measure) return;
      ::lather::Impl::fence(m_space, "Lather::Shampoo: phase timing");
      const auto now = std::chrono::steady_clock::now();
      m_engine.m_phase_seconds[phase] += std::chrono::duration<double>(now - m_last).count();
      m_last = now;
    }

   private:
    ShampooEngine& m_engine;
    ExecutionSpace m_space;
    std::chrono::steady_clock::time_point m_last = std::chrono::steady_clock::now();
  };

  bool quantized() const { return m_options.best_effort_memory_usage_reduction; }
  /// Completes statistics that the products left as upper triangles (BlockProducts::upper_only).
  void statistics_symmetric(const ExecutionSpace& space) const {
    if (!m_products->upper_only()) return;
    m_statistics->symmetrize(space);
    m_products->clear_upper_only();
  }
  void allocate_stores(const ExecutionSpace& space);
  void allocate_state(const ExecutionSpace& space);
  /// The other parts' units among parameters [first, last), read from the exchange buffer.
  struct OthersTable {
    std::size_t first = 0;
    UnitTable<memory_space> table;
    int threads = 1;
  };
  OthersTable others_table(const ExecutionSpace& space, std::size_t first, std::size_t last);
  /// Host threads of an element-wise pass over `units` units of `values` values in all.
  int pass_threads(std::size_t units, std::int64_t values) const;
  /// The other parts' units of the layer (or the whole list) that starts at parameter `first` into
  /// the parameters of the last step.
  void unpack_others(const ExecutionSpace& space, std::size_t first);
  StepScalars<Scalar> step_scalars(long t) const;
  UpdateElement<Scalar, T, memory_space> update_element(const StepScalars<Scalar>& c) const;
  void compute_preconditioners(const ExecutionSpace& space, Phases& phases);
  /// Per-parameter sums of the last pass, and how many ranks (of the group when distributed, and
  /// of the shards) reported a failure of the work before it.
  struct AgreedNorms {
    std::vector<SquaredNorms> norms;
    long failures = 0;
  };
  AgreedNorms parameter_norms(const ExecutionSpace& space, bool failed);
  /// Collective over the group, then the shards: when `local_error` is not empty on any rank of
  /// either, every rank throws the lowest failing rank's message ("... (on group rank k of n)").
  /// Called by every rank of both groups, or by none.
  void agree_everywhere(const std::string& local_error) const {
    std::string agreed = local_error;
    if (m_group.size() > 1) {
      try {
        m_group.agree_on_failure("", agreed);
      } catch (const Error& e) {
        agreed = e.message();
      }
    }
    if (m_shards.size() > 1) m_shards.agree_on_failure("", agreed);
    if (!agreed.empty()) throw Error(agreed, nullptr, 0);
  }
  void set_gradient_scales(const ExecutionSpace& space, const std::vector<SquaredNorms>& gradient_norm2);
  void set_multipliers(const ExecutionSpace& space, const std::vector<SquaredNorms>& norms2, double lr);
  /// Per-block grafting: each of this rank's preconditioned blocks' directions takes the norm of
  /// its own graft (the units' norms of the last pass; no communication: a block is one rank's).
  void scale_blocks(const ExecutionSpace& space);
  bool sums_over_shards(int p) const;
  void set_counted_pieces(std::vector<char> counted) override { m_counted = std::move(counted); }
  /// True where each block's direction takes its own graft's norm (graft_granularity block); false
  /// per tensor, and without a graft (graft_type none), where the direction keeps its norm.
  bool grafts_per_block() const {
    return m_options.graft_granularity == GraftGranularity::block && m_options.graft_type != GraftType::none;
  }
  bool split_by_rows(int p) const;
  void upload_parameter_scalars(const ExecutionSpace& space);

  // ---- members ----------------------------------------------------------------------------------

  ShampooOptions m_options;
  ShampooPlan m_plan;
  StepPlan m_step_plan;
  comm::Group m_group;
  comm::Group m_shards;         // ranks holding the other slices of split parameters
  std::vector<char> m_counted;  // per parameter: this rank's piece counts in sums over the shards
  /// Which rank updates each unit, and the exchange of the new values (the step plan's parts).
  std::unique_ptr<Distributor<ExecutionSpace, Scalar>> m_distributor;
  std::vector<int> m_mine;  // statistics whose roots this rank computes
  long m_step = 0;

  std::unique_ptr<Store> m_statistics, m_preconditioners;
  std::unique_ptr<RootPhase<ExecutionSpace, T>> m_roots;
  std::unique_ptr<AsyncRoots<ExecutionSpace, T>> m_async_roots;  // with async_roots only
  std::unique_ptr<BlockProducts<ExecutionSpace, T>> m_products;
  RootExchange<ExecutionSpace, T> m_exchange;
  std::vector<StatisticMetrics> m_metrics;

  // The units this rank updates (packed order) and, distributed, the others' (m_others, each at
  // m_others_at in the exchange buffer), in one table per layer of the exchange (or one in all).
  UnitTable<memory_space> m_mine_table;
  std::vector<int> m_others;
  std::vector<std::int64_t> m_others_at;
  std::vector<OthersTable> m_others_layers;
  // Host threads: the step's products' (see the constructor) and, out of those, the element-wise
  // passes' over each table's units (run_units).
  int m_step_threads = 1, m_mine_threads = 1;
  PointerTable<Scalar, memory_space> m_values, m_gradients;
  std::vector<ParameterScalars<Scalar>> m_parameter_scalars_host;
  V1<ParameterScalars<Scalar>> m_parameter_scalars;
  V1<SquaredNorms> m_unit_norms;
  typename V1<SquaredNorms>::HostMirror m_unit_norms_host;
  V1<double> m_unit_scales;  ///< per-block grafting: each unit's direction scale
  typename V1<double>::HostMirror m_unit_scales_host;

  // Packed per-element buffers over this rank's units, and the per-element state.
  V1<Scalar> m_packed;  // this rank's gradient values in packed order; after the graft pass, the graft
  V1<Scalar> m_diagonal, m_momentum, m_diagonal_momentum;
  V1<T> m_packed_t, m_direction;
  V1<std::int8_t> m_momentum_codes, m_diagonal_momentum_codes;
  /// int8 momentum: the column scales [momentum columns | diagonal momentum columns], current and
  /// being computed.
  V1<Scalar> m_scales[2];
  std::int64_t m_quantized_columns = 0;
  std::int64_t m_row_split_columns = 0;  // of those, the columns of tensors split by rows

  bool m_measure = false;
  std::map<std::string, double> m_phase_seconds;
  long m_root_gemm_calls = 0;

  // Host copies for state_arrays() and the full-shape state they describe.
  std::int64_t m_step_host = 0;
  std::vector<std::int32_t> m_exponents_host, m_failures_host;
  std::vector<double> m_errors_host;
  std::vector<V1<Scalar>> m_state_scalars;
  std::vector<V1<std::int8_t>> m_state_codes;
};

}  // namespace lather::optim::Impl

#include <lather/optim/impl/shampoo_engine_state.hpp>
#include <lather/optim/impl/shampoo_engine_step.hpp>
