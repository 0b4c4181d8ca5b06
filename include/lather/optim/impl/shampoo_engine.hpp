#pragma once
// The Shampoo state and step, templated on the statistics precision T (float or double); the
// public Shampoo class picks T at run time from ShampooOptions::statistics_precision. The step is
// written once over its parts: the plan (shampoo_plan.hpp), the statistics and preconditioner
// stores (matrix_store.hpp), the inverse-root phase (root_phase.hpp), the exchanges between
// ranks (root_exchange.hpp) and the element-wise kernels (shampoo_kernels.hpp).

#include <lather/comm/group.hpp>
#include <lather/core/impl/gemm.hpp>
#include <lather/optim/impl/matrix_store.hpp>
#include <lather/optim/impl/root_exchange.hpp>
#include <lather/optim/impl/root_phase.hpp>
#include <lather/optim/impl/shampoo_kernels.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/quantization.hpp>
#include <lather/optim/shampoo.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace lather::optim::Impl {

template <class ExecutionSpace, class Scalar>
class ShampooEngineBase {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Tensors = TensorList<Scalar, memory_space>;
  virtual ~ShampooEngineBase() = default;
  virtual void step(const ExecutionSpace& space, const Tensors& params, const Tensors& grads) = 0;
  virtual long step_count() const = 0;
  virtual StateMemoryReport memory_report() const = 0;
  virtual std::vector<StateArray<memory_space>> state_arrays() = 0;
  virtual void state_restored(long step_count) = 0;
  virtual const ShampooOptions& options() const = 0;
  virtual const ShampooPlan& plan() const = 0;
  virtual std::vector<StatisticMetrics> metrics() const = 0;
  virtual double root_load_imbalance() const = 0;
  virtual std::vector<double> matrix(const ExecutionSpace& space, int s, bool preconditioner) const = 0;
};

template <class ExecutionSpace, class Scalar, class T>
class ShampooEngine final : public ShampooEngineBase<ExecutionSpace, Scalar> {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Tensors = TensorList<Scalar, memory_space>;
  template <class X>
  using V1 = Kokkos::View<X*, memory_space>;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using ConstMatrix = Kokkos::View<const T**, Kokkos::LayoutRight, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Store = MatrixStore<ExecutionSpace, T>;

  ShampooEngine(const ExecutionSpace& space, const std::vector<ParameterSpec>& parameters,
                const ShampooOptions& options, comm::Group group, comm::Group shards)
      : m_options(options), m_group(std::move(group)), m_shards(std::move(shards)), m_exchange(m_group) {
    m_options.validate();
    m_plan = make_plan(parameters, m_options);
    m_ranks = m_group.size();
    m_rank = m_group.rank();
    m_sharded = m_options.shard_optimizer_states && m_ranks > 1;
    assign_statistics_to_ranks();
    allocate_stores(space);
    allocate_parameter_state(space);
    allocate_scratch(space);
  }

  // ---------------------------------------------------------------------------------------------
  void step(const ExecutionSpace& space, const Tensors& params, const Tensors& grads) override {
    ::lather::Impl::ScopedRegion region("Lather::Shampoo::step");
    const long t = m_step;
    check_finite(space, grads);
    pack_gradients(space, grads);
    if (t % m_options.statistics_compute_steps == 0) {
      const double beta2 = m_options.beta2;
      update_statistics(space, beta2, beta2 == 1.0 ? 1.0 : 1.0 - beta2);
    }
    if (t % m_options.preconditioning_compute_steps == 0) compute_preconditioners(space);

    ::lather::Impl::ScopedRegion update_region("Lather::Shampoo::update");
    const double lr = m_options.learning_rate(t);
    for (const auto& chunk : m_chunks) {
      if (m_sharded) {
        m_exchange.gather(space, m_plan, m_plan.local_statistics, chunk.first_statistic, chunk.end_statistic, m_owner,
                          m_slot, *m_preconditioners, *m_gathered);
        m_gathered_first = chunk.first_statistic;
      }
      for (int p = chunk.first_parameter; p < chunk.end_parameter; ++p)
        update_parameter(space, p, params[p], grads[p], lr, t);
    }
    ++m_step;
  }

  long step_count() const override { return m_step; }
  const ShampooOptions& options() const override { return m_options; }
  const ShampooPlan& plan() const override { return m_plan; }
  std::vector<StatisticMetrics> metrics() const override { return m_metrics; }
  double root_load_imbalance() const override { return load_imbalance(m_plan.statistic_size, m_owner, m_ranks); }

  StateMemoryReport memory_report() const override {
    StateMemoryReport r;
    const auto bytes = [](const auto& view) {
      return std::int64_t(view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type));
    };
    for (const Store* store : {m_statistics.get(), m_preconditioners.get()})
      (store->quantized() ? r.quantized_bytes : r.stack_bytes) += store->bytes();
    for (const auto& l : m_local) {
      r.local_bytes += bytes(l.diagonal) + bytes(l.momentum) + bytes(l.diagonal_momentum);
      r.quantized_bytes += bytes(l.momentum_codes) + bytes(l.momentum_scales) + bytes(l.diagonal_momentum_codes) +
                           bytes(l.diagonal_momentum_scales);
    }
    r.workspace_bytes = bytes(m_packed) + bytes(m_work) + bytes(m_matrices) + bytes(m_grams) +
                        bytes(m_gram_scratch) + bytes(m_graft) + bytes(m_direction) + bytes(m_momentum_work) +
                        bytes(m_diagonal_momentum_work) + m_roots->workspace_bytes() +
                        (m_gathered ? m_gathered->bytes() : 0);
    return r;
  }

  std::vector<StateArray<memory_space>> state_arrays() override;
  void state_restored(long step_count) override {
    m_step = step_count;
    const auto& local = m_plan.local_statistics;
    for (std::size_t k = 0; k < local.size() && k < m_errors_host.size(); ++k) {
      m_metrics[local[k]].error = m_errors_host[k];
      m_metrics[local[k]].consecutive_failures = m_failures_host[k];
    }
  }

  std::vector<double> matrix(const ExecutionSpace& space, int s, bool preconditioner) const override {
    LATHER_REQUIRE(s >= 0 && s < m_plan.num_statistics(), "Shampoo: statistic ", s, " out of range [0, ",
                   m_plan.num_statistics(), ")");
    LATHER_REQUIRE(m_slot[s] >= 0, "Shampoo: statistic ", s, " is not stored on this rank (group rank ", m_rank,
                   m_owner[s] < 0 ? ", it belongs to another weight shard)" : ")");
    const Store& store = preconditioner ? *m_preconditioners : *m_statistics;
    return store.host_matrix(space, m_slot[s], m_plan.statistic_size[s]);
  }

  // Public, not private: nvcc rejects an extended __host__ __device__ lambda (KOKKOS_LAMBDA) whose
  // enclosing member function is private or protected.
 public:
  /// Per-parameter state: the diagonal statistics of the graft, momentum and the graft's momentum
  /// (int8 with per-column scales for rank > 1 parameters when quantized).
  struct LocalState {
    BlockTable<memory_space> blocks;
    V1<Scalar> diagonal, momentum, diagonal_momentum;
    V1<std::int8_t> momentum_codes, diagonal_momentum_codes;
    V1<Scalar> momentum_scales, diagonal_momentum_scales;
  };
  /// Consecutive parameters whose preconditioners are gathered together in sharded mode.
  struct Chunk {
    int first_parameter = 0, end_parameter = 0;
    int first_statistic = 0, end_statistic = 0;
  };

  // ---- construction -----------------------------------------------------------------------------

  /// Root work is shared by the group over this rank's statistics (the same set on every rank of
  /// a data-parallel group: the statistics of one weight shard); in sharded mode each rank stores
  /// only the statistics it owns.
  void assign_statistics_to_ranks() {
    const int n_stats = m_plan.num_statistics();
    const auto& local = m_plan.local_statistics;
    std::vector<int> local_sizes;
    for (int s : local) local_sizes.push_back(m_plan.statistic_size[s]);
    const auto local_owner = assign_statistics(
        local_sizes, m_ranks, m_options.balance_root_work ? RootAssignment::balanced : RootAssignment::even);
    m_owner.assign(n_stats, -1);
    m_local_index.assign(n_stats, -1);
    for (std::size_t k = 0; k < local.size(); ++k) {
      m_owner[local[k]] = local_owner[k];
      m_local_index[local[k]] = int(k);
      if (local_owner[k] == m_rank) m_mine.push_back(local[k]);
    }
    m_metrics.resize(n_stats);
    for (int s = 0; s < n_stats; ++s) {
      m_metrics[s].parameter = m_plan.statistic_owner[s];
      m_metrics[s].size = m_plan.statistic_size[s];
      m_metrics[s].exponent = m_plan.statistic_exponent[s];
      m_metrics[s].owner_rank = m_owner[s];
    }
    m_slot.assign(n_stats, -1);
    for (int s : local)
      if (!m_sharded || m_owner[s] == m_rank) {
        m_slot[s] = int(m_stored.size());
        m_stored.push_back(s);
      }
  }

  void allocate_stores(const ExecutionSpace& space) {
    const int m = m_plan.max_size;
    // The reference's layout: padded with identity to a multiple of the group size.
    const int stored = int(m_stored.size());
    const int slots = m_sharded ? std::max(1, stored) : std::max(1, ((stored + m_ranks - 1) / m_ranks) * m_ranks);
    const bool quantized = m_options.best_effort_memory_usage_reduction;
    m_statistics = make_matrix_store<ExecutionSpace, T>(space, quantized, "Lather::Shampoo::statistics", slots, m);
    m_preconditioners =
        make_matrix_store<ExecutionSpace, T>(space, quantized, "Lather::Shampoo::preconditioners", slots, m);
    // Statistics start at matrix_epsilon * I, preconditioners at I; padding slots are identity.
    m_statistics->fill_identity(space, T(m_options.matrix_epsilon), 0, stored);
    m_statistics->fill_identity(space, T(1), stored, slots);
    m_preconditioners->fill_identity(space, T(1), 0, slots);
  }

  void allocate_parameter_state(const ExecutionSpace& space) {
    const bool diagonal = graft_has_diagonal_statistics(m_options.graft_type);
    const auto alloc = [&](auto& view, const std::string& label, std::int64_t n) {
      using View = std::decay_t<decltype(view)>;
      view = View(Kokkos::view_alloc(space, label), std::size_t(n));
    };
    for (const auto& pp : m_plan.parameters) {
      LocalState l;
      const std::string label = "Lather::Shampoo::" + pp.spec.name;
      if (pp.preconditioned) l.blocks = make_block_table(space, pp.local_shape, pp.local_blocks, pp.spec.name);
      if (diagonal) alloc(l.diagonal, label + "::diagonal_statistics", pp.elements);
      if (pp.quantized_momentum) {
        const std::int64_t columns = pp.elements / pp.spec.shape[0];
        alloc(l.momentum_codes, label + "::momentum_codes", pp.elements);
        alloc(l.diagonal_momentum_codes, label + "::diagonal_momentum_codes", pp.elements);
        alloc(l.momentum_scales, label + "::momentum_scales", columns);
        alloc(l.diagonal_momentum_scales, label + "::diagonal_momentum_scales", columns);
      } else {
        alloc(l.momentum, label + "::momentum", pp.elements);
        alloc(l.diagonal_momentum, label + "::diagonal_momentum", pp.elements);
      }
      m_local.push_back(std::move(l));
    }
  }

  void allocate_scratch(const ExecutionSpace& space) {
    const std::int64_t elements = std::max<std::int64_t>(1, m_plan.max_elements);
    const int m = m_plan.max_size;
    const auto scratch = [&](auto& view, const char* label, std::int64_t n) {
      using View = std::decay_t<decltype(view)>;
      view = View(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("Lather::Shampoo::") + label),
                  std::size_t(std::max<std::int64_t>(n, 1)));
    };
    // The gradient blocks of every preconditioned parameter, packed once per step; the largest
    // parameter's preconditioner matrices, contiguous.
    std::int64_t packed = 0, matrices = 0, statistics_elements = 0;
    m_packed_offset.assign(m_plan.parameters.size(), 0);
    for (std::size_t p = 0; p < m_plan.parameters.size(); ++p) {
      const auto& pp = m_plan.parameters[p];
      if (!pp.preconditioned) continue;
      m_packed_offset[p] = packed;
      packed += pp.elements;
      std::int64_t squares = 0;
      for (std::size_t b = 0; b < pp.local_blocks.size(); ++b)
        for (auto n : pp.local_blocks[b].size) squares += n * n;
      matrices = std::max(matrices, squares);
      statistics_elements += squares;
    }
    scratch(m_packed, "packed_gradients", packed);
    scratch(m_work, "packed_work", elements);
    scratch(m_matrices, "preconditioner_matrices", matrices);
    // Gram matrices are blended into the statistics in chunks within the root workspace.
    const bool quantized = m_options.best_effort_memory_usage_reduction;
    const std::int64_t budget = std::int64_t(m_options.root.workspace_bytes / sizeof(T)) / (quantized ? 2 : 1);
    m_gram_capacity = std::max<std::int64_t>(std::int64_t(m) * m, std::min(statistics_elements, budget));
    scratch(m_grams, "grams", m_gram_capacity);
    if (quantized) scratch(m_gram_scratch, "gram_scratch", m_gram_capacity);
    scratch(m_graft, "graft", elements);
    scratch(m_direction, "direction", elements);
    if (quantized) {
      scratch(m_momentum_work, "momentum_work", elements);
      scratch(m_diagonal_momentum_work, "diagonal_momentum_work", elements);
    }
    m_roots = std::make_unique<RootPhase<ExecutionSpace, T>>(space, m_options, m, int(m_mine.size()));

    // Parameter chunks: one in replicated mode; in sharded mode, consecutive parameters whose
    // preconditioners fit the gather budget together. Chunks are ranges of this rank's
    // statistics (m_plan.local_statistics), which are in parameter order.
    const int n_params = int(m_plan.parameters.size());
    if (!m_sharded) {
      m_chunks.push_back({0, n_params, 0, int(m_plan.local_statistics.size())});
      return;
    }
    const std::size_t per_statistic = m_preconditioners->packed_bytes(m);
    const std::size_t budget_bytes = std::max<std::size_t>(per_statistic, m_options.root.workspace_bytes);
    Chunk chunk{0, 0, 0, 0};
    int next_local = 0;
    for (int p = 0; p < n_params; ++p) {
      const auto& pp = m_plan.parameters[p];
      const int stats = pp.preconditioned ? int(pp.local_blocks.size()) * pp.partition.rank() : 0;
      if (chunk.end_parameter > chunk.first_parameter &&
          std::size_t(chunk.end_statistic - chunk.first_statistic + stats) * per_statistic > budget_bytes) {
        m_chunks.push_back(chunk);
        chunk = Chunk{p, p, next_local, next_local};
      }
      next_local += stats;
      chunk.end_parameter = p + 1;
      chunk.end_statistic = next_local;
    }
    m_chunks.push_back(chunk);
    int largest = 1;
    for (const auto& c : m_chunks) largest = std::max(largest, c.end_statistic - c.first_statistic);
    m_gathered = make_matrix_store<ExecutionSpace, T>(space, quantized, "Lather::Shampoo::gathered", largest, m);
  }

  // ---- the step ---------------------------------------------------------------------------------

  /// Squared gradient norms (kept for the normalized grafts); a NaN or Inf anywhere makes its sum
  /// non-finite (squares of floats cannot overflow a double), and is refused before any state moves.
  void check_finite(const ExecutionSpace& space, const Tensors& grads) {
    m_gradient_norm2.resize(grads.size());
    for (std::size_t p = 0; p < grads.size(); ++p) {
      const V1<const Scalar> g = grads[p];
      m_gradient_norm2[p] = squared_norm<ExecutionSpace, Scalar, memory_space>(space, g);
      LATHER_REQUIRE(std::isfinite(m_gradient_norm2[p]), "Shampoo::step ", m_step, ": the gradient of '",
                     m_plan.parameters[p].spec.name, "' contains NaN or Inf; the optimizer state was not changed");
    }
    // Split tensors: the norm of the whole tensor, over the shards (one collective for all).
    std::vector<double> split;
    for (std::size_t p = 0; p < grads.size(); ++p)
      if (sums_over_shards(int(p))) split.push_back(m_gradient_norm2[p]);
    if (split.empty()) return;
    m_shards.allreduce(split, comm::Combine::sum);
    for (std::size_t p = 0, k = 0; p < grads.size(); ++p)
      if (sums_over_shards(int(p))) m_gradient_norm2[p] = split[k++];
  }

  /// True for a parameter split over the shard group, whose per-tensor norms are group sums.
  bool sums_over_shards(int p) const {
    return m_shards.size() > 1 && m_plan.parameters[p].spec.split() &&
           m_plan.parameters[p].spec.shape != m_plan.parameters[p].spec.global();
  }

  /// The gradient blocks of every preconditioned parameter into m_packed (statistics precision,
  /// each block contiguous): once per step, for the statistics and the preconditioning.
  void pack_gradients(const ExecutionSpace& space, const Tensors& grads) {
    for (std::size_t p = 0; p < m_plan.parameters.size(); ++p) {
      if (!m_plan.parameters[p].preconditioned) continue;
      const V1<const Scalar> from = grads[p];
      repack_blocks<ExecutionSpace, Scalar, T, memory_space>(space, m_local[p].blocks, true, from, packed(int(p)));
    }
  }

  V1<T> packed(int p) const {
    const auto begin = std::size_t(m_packed_offset[p]);
    return Kokkos::subview(m_packed, std::make_pair(begin, begin + std::size_t(m_plan.parameters[p].elements)));
  }

  /// statistic s <- w1 * statistic s + w2 * (mode-j Gram matrix of the block), for every block and
  /// dimension this rank stores. The Gram matrix first, then the blend with the reference's
  /// roundings: folding the weights into the GEMM changes the last bit, which ill-conditioned
  /// statistics amplify.
  void update_statistics(const ExecutionSpace& space, double w1, double w2) {
    ::lather::Impl::ScopedRegion region("Lather::Shampoo::statistics");
    m_list.clear();
    std::int64_t used = 0;
    const auto flush = [&] {
      m_list.upload(space);
      m_statistics->blend(space, m_list, m_grams, T(w1), T(w2), m_gram_scratch);
      m_list.clear();
      used = 0;
    };
    for (std::size_t p = 0; p < m_plan.parameters.size(); ++p) {
      const auto& pp = m_plan.parameters[p];
      if (!pp.preconditioned) continue;
      const int rank = pp.partition.rank();
      const T* gradient = packed(int(p)).data();
      for (std::size_t b = 0; b < pp.local_blocks.size(); ++b) {
        const auto& block = pp.local_blocks[b];
        for (int j = 0, s = pp.local_block_statistic[b]; j < rank; ++j, ++s) {
          const int slot = m_slot[s];
          if (slot < 0) continue;
          const std::int64_t n = block.size[j];
          if (used + n * n > m_gram_capacity) flush();
          std::int64_t before = 1, after = 1;
          for (int d = 0; d < j; ++d) before *= block.size[d];
          for (int d = j + 1; d < rank; ++d) after *= block.size[d];
          const Matrix gram(m_grams.data() + used, n, n);
          const T* x = gradient + block.packed_offset;
          if (before == 1) {
            const ConstMatrix g(x, n, after);
            ::lather::Impl::gemm(space, "N", "T", T(1), g, g, T(0), gram);
          } else if (after == 1) {
            const ConstMatrix g(x, before, n);
            ::lather::Impl::gemm(space, "T", "N", T(1), g, g, T(0), gram);
          } else {
            for (std::int64_t a = 0; a < before; ++a) {
              const ConstMatrix g(x + a * n * after, n, after);
              ::lather::Impl::gemm(space, "N", "T", T(1), g, g, a == 0 ? T(0) : T(1), gram);
            }
          }
          m_list.add(slot, int(n), used, int(n));
          used += n * n;
        }
      }
    }
    if (m_list.count() > 0) flush();
  }

  /// Inverse roots of the statistics this rank owns, the exchange that gives every rank the
  /// metrics (and, replicated, the preconditioners), then the failure rule.
  void compute_preconditioners(const ExecutionSpace& space) {
    ::lather::Impl::ScopedRegion region("Lather::Shampoo::inverse_roots");
    m_roots->compute(space, m_plan, m_mine, m_slot, *m_statistics, *m_preconditioners, m_metrics);
    if (m_ranks > 1)
      m_exchange.share_roots(space, m_plan, m_plan.local_statistics, m_owner, m_slot, m_metrics, *m_preconditioners,
                             !m_sharded);
    m_roots->check_failures(m_plan, m_plan.local_statistics, m_metrics, m_step);
  }

  /// direction = the reference's preconditioned_grad: each block contracted with its
  /// preconditioners in order (tensordot over the leading axis, which returns the axes to their
  /// order after rank steps), merged back to the parameter's shape.
  void precondition(const ExecutionSpace& space, int p) {
    const auto& pp = m_plan.parameters[p];
    const int rank = pp.partition.rank();
    // The preconditioners as contiguous matrices: the stored slot itself where it is one (dense,
    // unpadded), else a copy in m_matrices.
    const Store& store = m_sharded ? *m_gathered : *m_preconditioners;
    std::vector<const T*> matrix_of;
    m_list.clear();
    std::int64_t used = 0;
    for (std::size_t b = 0; b < pp.local_blocks.size(); ++b)
      for (int j = 0, s = pp.local_block_statistic[b]; j < rank; ++j, ++s) {
        const int n = int(pp.local_blocks[b].size[j]);
        const int slot = m_sharded ? m_local_index[s] - m_gathered_first : m_slot[s];
        const T* direct = store.contiguous(slot, n);
        if (!direct) {
          m_list.add(slot, n, used, n);
          direct = m_matrices.data() + used;
          used += std::int64_t(n) * n;
        }
        matrix_of.push_back(direct);
      }
    if (m_list.count() > 0) {
      m_list.upload(space);
      store.read(space, m_list, m_matrices);
    }
    V1<T> current = packed(p), next = m_work;
    for (std::size_t b = 0, k = 0; b < pp.local_blocks.size(); ++b) {
      const auto& block = pp.local_blocks[b];
      current = packed(p);
      next = m_work;
      for (int j = 0; j < rank; ++j, ++k) {
        const std::int64_t n = block.size[j];
        std::int64_t before = 1, after = 1;
        for (int d = 0; d < j; ++d) before *= block.size[d];
        for (int d = j + 1; d < rank; ++d) after *= block.size[d];
        const ConstMatrix pm(matrix_of[k], n, n);
        const T* x = current.data() + block.packed_offset;
        T* y = next.data() + block.packed_offset;
        if (before == 1) {
          ::lather::Impl::gemm(space, "T", "N", T(1), pm, ConstMatrix(x, n, after), T(0), Matrix(y, n, after));
        } else if (after == 1) {
          ::lather::Impl::gemm(space, "N", "N", T(1), ConstMatrix(x, before, n), pm, T(0), Matrix(y, before, n));
        } else {
          for (std::int64_t a = 0; a < before; ++a)
            ::lather::Impl::gemm(space, "T", "N", T(1), pm, ConstMatrix(x + a * n * after, n, after), T(0),
                                 Matrix(y + a * n * after, n, after));
        }
        std::swap(current, next);
      }
    }
    const V1<const T> result = current;
    repack_blocks<ExecutionSpace, T, Scalar, memory_space>(space, m_local[p].blocks, false, result, m_direction);
  }

  void update_parameter(const ExecutionSpace& space, int p, const V1<Scalar>& param, const V1<Scalar>& grad,
                        double lr, long t);

  // ---- members ----------------------------------------------------------------------------------

  ShampooOptions m_options;
  ShampooPlan m_plan;
  comm::Group m_group;
  comm::Group m_shards;  // ranks holding the other slices of split parameters
  int m_ranks = 1, m_rank = 0;
  bool m_sharded = false;
  std::vector<int> m_owner;        // per statistic: rank computing its root (-1: another shard's)
  std::vector<int> m_local_index;  // per statistic: position in m_plan.local_statistics, or -1
  std::vector<int> m_slot;         // per statistic: slot in the stores, -1 if not stored here
  std::vector<int> m_stored;       // statistics stored here, by slot
  std::vector<int> m_mine;         // statistics whose roots this rank computes
  std::vector<Chunk> m_chunks;
  int m_gathered_first = 0;
  long m_step = 0;

  std::unique_ptr<Store> m_statistics, m_preconditioners, m_gathered;
  std::unique_ptr<RootPhase<ExecutionSpace, T>> m_roots;
  RootExchange<ExecutionSpace, T> m_exchange;
  std::vector<LocalState> m_local;
  std::vector<StatisticMetrics> m_metrics;

  SlotList<memory_space> m_list;
  std::vector<std::int64_t> m_packed_offset;
  std::int64_t m_gram_capacity = 1;
  V1<T> m_packed, m_work, m_matrices, m_grams, m_gram_scratch;
  V1<Scalar> m_graft, m_direction, m_momentum_work, m_diagonal_momentum_work;

  std::vector<double> m_gradient_norm2;
  // Host mirrors of host-side state, for state_arrays().
  std::int64_t m_step_host = 0;
  std::vector<std::int32_t> m_exponents_host, m_failures_host;
  std::vector<double> m_errors_host;
};

template <class ExecutionSpace, class Scalar, class T>
void ShampooEngine<ExecutionSpace, Scalar, T>::update_parameter(const ExecutionSpace& space, int p,
                                                               const V1<Scalar>& param, const V1<Scalar>& grad,
                                                               double lr, long t) {
  const auto& pp = m_plan.parameters[p];
  auto& l = m_local[p];
  const auto& o = m_options;
  const std::int64_t elements = pp.elements;
  const auto graft = Kokkos::subview(m_graft, std::pair<std::int64_t, std::int64_t>(0, elements));
  const auto direction = Kokkos::subview(m_direction, std::pair<std::int64_t, std::int64_t>(0, elements));

  UpdateScalars<Scalar> s;
  s.graft = int(o.graft_type);
  s.beta1 = Scalar(o.beta1);
  s.w1 = Scalar(o.beta2);
  s.w2 = Scalar(o.beta2 == 1.0 ? 1.0 : 1.0 - o.beta2);
  s.diagonal_epsilon = Scalar(o.diagonal_epsilon);
  const V1<const Scalar> g = grad;
  if (o.graft_type == GraftType::adagrad_normalized || o.graft_type == GraftType::rmsprop_normalized)
    s.gradient_scale = Scalar(1.0 / (std::sqrt(m_gradient_norm2[p]) + 1e-16));
  graft_direction<ExecutionSpace, Scalar, memory_space>(space, s, g, l.diagonal, graft);
  // Squared norms of the graft and of the preconditioned gradient (summed over the shards for a
  // split tensor, so that it is grafted as a whole).
  std::vector<double> norms2 = {squared_norm<ExecutionSpace, Scalar, memory_space>(space, graft), 0.0};
  if (pp.preconditioned) {
    precondition(space, p);
    norms2[1] = squared_norm<ExecutionSpace, Scalar, memory_space>(space, direction);
  }
  if (sums_over_shards(p)) m_shards.allreduce(norms2, comm::Combine::sum);
  const double graft_norm_raw = std::sqrt(norms2[0]);
  double graft_multiplier = 1.0;
  if ((o.graft_type == GraftType::rmsprop || o.graft_type == GraftType::rmsprop_normalized) &&
      o.clip_by_scaled_gradient_norm > 0) {
    const double scaled_norm = graft_norm_raw / std::sqrt(double(element_count(pp.spec.global())));
    graft_multiplier = 1.0 / std::max(1.0, scaled_norm / o.clip_by_scaled_gradient_norm);
  }
  if (!o.decoupled_learning_rate) graft_multiplier *= lr;
  const double graft_norm = graft_norm_raw * graft_multiplier;

  double shampoo_multiplier;
  V1<const Scalar> dir;
  if (pp.preconditioned) {
    shampoo_multiplier = graft_norm / (std::sqrt(norms2[1]) + 1e-16);
    dir = direction;
  } else {
    // The reference sets precond_grad = grafting_update for parameters it skips.
    shampoo_multiplier = graft_multiplier * (graft_norm / (graft_norm + 1e-16));
    dir = graft;
  }
  s.graft_multiplier = Scalar(graft_multiplier);
  s.shampoo_multiplier = Scalar(shampoo_multiplier);
  s.weight_decay = Scalar(o.weight_decay);
  s.decoupled_weight_decay = o.decoupled_weight_decay;
  s.momentum_weight = Scalar(o.moving_average_for_momentum ? 1.0 - o.beta1 : 1.0);
  s.run_shampoo = t >= o.start_preconditioning_step;
  s.nesterov = o.nesterov;
  s.lr = Scalar(lr);
  s.update_multiplier = Scalar(o.decoupled_learning_rate ? lr : 1.0);

  if (pp.quantized_momentum) {
    const std::int64_t rows = pp.spec.shape[0], columns = elements / rows;
    const auto m = Kokkos::subview(m_momentum_work, std::pair<std::int64_t, std::int64_t>(0, elements));
    const auto dm = Kokkos::subview(m_diagonal_momentum_work, std::pair<std::int64_t, std::int64_t>(0, elements));
    dequantize_columns<ExecutionSpace, Scalar, std::int8_t>(space, l.momentum_codes, l.momentum_scales, rows, columns,
                                                            m);
    dequantize_columns<ExecutionSpace, Scalar, std::int8_t>(space, l.diagonal_momentum_codes,
                                                            l.diagonal_momentum_scales, rows, columns, dm);
    apply_update<ExecutionSpace, Scalar, memory_space>(space, s, graft, dir, m, dm, param);
    quantize_columns<ExecutionSpace, Scalar, std::int8_t>(space, m, rows, columns, l.momentum_codes, l.momentum_scales);
    quantize_columns<ExecutionSpace, Scalar, std::int8_t>(space, dm, rows, columns, l.diagonal_momentum_codes,
                                                          l.diagonal_momentum_scales);
  } else {
    apply_update<ExecutionSpace, Scalar, memory_space>(space, s, graft, dir, l.momentum, l.diagonal_momentum, param);
  }
}

}  // namespace lather::optim::Impl

#include <lather/optim/impl/shampoo_state.hpp>
