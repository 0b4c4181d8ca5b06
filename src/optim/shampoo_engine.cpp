#include "shampoo_engine.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace lather::optim::Impl {

namespace {

using ::lather::Impl::fence;
using ::lather::Impl::ScopedRegion;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

/// C = alpha op(A) op(B) + beta C through Kokkos Kernels (BLAS on the host, cuBLAS on CUDA).
template <class ExecutionSpace, class AView, class BView, class CView>
void gemm(const ExecutionSpace& space, const char* ta, const char* tb, double alpha, const AView& a,
          const BView& b, double beta, const CView& c) {
  using V = typename CView::non_const_value_type;
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40100
  KokkosBlas::gemm(space, ta, tb, V(alpha), a, b, V(beta), c);
#else
  (void)space;
  KokkosBlas::gemm(ta, tb, V(alpha), a, b, V(beta), c);
#endif
}

}  // namespace

template <class ExecutionSpace, class Scalar, class T>
class ShampooEngine final : public ShampooEngineBase<ExecutionSpace, Scalar> {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Tensors = TensorList<Scalar, memory_space>;
  template <class X>
  using V1 = Kokkos::View<X*, memory_space>;
  template <class X>
  using V2 = Kokkos::View<X**, Kokkos::LayoutRight, memory_space>;
  template <class X>
  using V3 = Kokkos::View<X***, Kokkos::LayoutRight, memory_space>;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, memory_space, Unmanaged>;
  using ConstMatrix = Kokkos::View<const T**, Kokkos::LayoutRight, memory_space, Unmanaged>;

  ShampooEngine(const ExecutionSpace& space, const std::vector<ParameterSpec>& parameters,
                const ShampooOptions& options, std::shared_ptr<WorkGroup> group, std::shared_ptr<WorkGroup> shards)
      : m_space(space), m_options(options), m_group(std::move(group)), m_shards(std::move(shards)) {
    m_options.validate();
    m_plan = make_plan(parameters, m_options);
    m_ranks = m_group ? m_group->size() : 1;
    m_rank = m_group ? m_group->rank() : 0;
    m_quantized = m_options.best_effort_memory_usage_reduction;
    m_sharded = m_options.shard_optimizer_states && m_ranks > 1;
    m_root_options = m_options.root;
    m_root_options.ridge_epsilon = m_options.matrix_epsilon;
    m_root_options.relative_ridge = m_options.relative_matrix_epsilon;

    // Root work is shared by the group over this rank's statistics (the same set on every rank of
    // a data-parallel group: the statistics of one weight shard).
    const int n_stats = m_plan.num_statistics();
    const auto& local = m_plan.local_statistics;
    std::vector<int> local_sizes;
    for (int s : local) local_sizes.push_back(m_plan.statistic_size[s]);
    const auto local_owner = assign_statistics(local_sizes, m_ranks,
                                               m_options.balance_root_work ? RootAssignment::balanced : RootAssignment::even);
    m_owner.assign(n_stats, -1);
    m_local_index.assign(n_stats, -1);
    for (std::size_t k = 0; k < local.size(); ++k) {
      m_owner[local[k]] = local_owner[k];
      m_local_index[local[k]] = int(k);
    }
    m_metrics.resize(n_stats);
    for (int s = 0; s < n_stats; ++s) {
      m_metrics[s].parameter = m_plan.statistic_owner[s];
      m_metrics[s].size = m_plan.statistic_size[s];
      m_metrics[s].exponent = m_plan.statistic_exponent[s];
      m_metrics[s].owner_rank = m_owner[s];
    }

    // Which statistics this rank stores, and where.
    m_slot.assign(n_stats, -1);
    for (int s : local)
      if (!m_sharded || m_owner[s] == m_rank) {
        m_slot[s] = int(m_stored.size());
        m_stored.push_back(s);
      }
    // The reference's layout: padded with identity to a multiple of the group size.
    m_slots = m_sharded ? std::max<int>(1, int(m_stored.size()))
                        : std::max(1, ((int(m_stored.size()) + m_ranks - 1) / m_ranks) * m_ranks);
    allocate_stacks();
    allocate_local_state();
    allocate_scratch();
  }

  // ---------------------------------------------------------------------------------------------
  void step(const Tensors& params, const Tensors& grads) override {
    ScopedRegion region("Lather::Shampoo::step");
    const long t = m_step;
    check_finite(grads);
    const bool do_statistics = t % m_options.statistics_compute_steps == 0;
    const bool do_roots = t % m_options.preconditioning_compute_steps == 0;
    const double beta2 = m_options.beta2;
    const double w1 = beta2, w2 = beta2 == 1.0 ? 1.0 : 1.0 - beta2;

    if (do_statistics) {
      ScopedRegion stats_region("Lather::Shampoo::statistics");
      for (std::size_t p = 0; p < m_plan.parameters.size(); ++p)
        if (m_plan.parameters[p].preconditioned) update_statistics(int(p), grads[p], w1, w2);
    }
    if (do_roots) compute_preconditioners();

    ScopedRegion update_region("Lather::Shampoo::update");
    const double lr = m_options.learning_rate(t);
    for (const auto& chunk : m_chunks) {
      if (m_sharded) gather_preconditioners(chunk);
      for (int p = chunk.first_parameter; p < chunk.end_parameter; ++p)
        update_parameter(p, params[p], grads[p], lr, t);
    }
    fence(m_space, "Lather::Shampoo::step: parameters updated");
    ++m_step;
  }

  long step_count() const override { return m_step; }
  const ShampooOptions& options() const override { return m_options; }
  const ShampooPlan& plan() const override { return m_plan; }
  std::vector<StatisticMetrics> metrics() const override { return m_metrics; }
  double root_load_imbalance() const override {
    return load_imbalance(m_plan.statistic_size, m_owner, m_ranks);
  }

  StateMemoryReport memory_report() const override {
    StateMemoryReport r;
    const auto bytes = [](const auto& view) { return std::int64_t(view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type)); };
    r.stack_bytes = bytes(m_statistics) + bytes(m_preconditioners);
    r.quantized_bytes = bytes(m_statistic_codes) + bytes(m_preconditioner_codes) + bytes(m_statistic_diagonal) +
                        bytes(m_statistic_scales) + bytes(m_preconditioner_diagonal) +
                        bytes(m_preconditioner_scales);
    for (const auto& l : m_local) {
      r.local_bytes += bytes(l.diagonal) + bytes(l.momentum) + bytes(l.diagonal_momentum);
      r.quantized_bytes += bytes(l.momentum_codes) + bytes(l.momentum_scales) +
                           bytes(l.diagonal_momentum_codes) + bytes(l.diagonal_momentum_scales);
    }
    r.workspace_bytes = bytes(m_packed_a) + bytes(m_packed_b) + bytes(m_matrix) + bytes(m_graft) +
                        bytes(m_direction) + bytes(m_momentum_work) + bytes(m_diagonal_momentum_work) +
                        bytes(m_root_in) + bytes(m_root_out) + bytes(m_gathered) +
                        bytes(m_gathered_codes) + bytes(m_gathered_diagonal) + bytes(m_gathered_scales);
    return r;
  }

  // ---------------------------------------------------------------------------------------------
  std::vector<StateArray<memory_space>> state_arrays() override {
    std::vector<StateArray<memory_space>> arrays;
    const std::int64_t n = m_plan.num_statistics(), m = m_plan.max_size;
    m_step_host = m_step;
    arrays.push_back(host_array("step", DType::int64, {}, &m_step_host, 1));
    // Global stacks: the statistics this rank stores, by global row; replicated stacks are
    // written by rank 0 alone.
    std::vector<std::int64_t> rows;
    if (m_sharded || !m_plan.all_local()) rows.assign(m_stored.begin(), m_stored.end());
    const bool writer = m_sharded || m_rank == 0;
    const std::int64_t local_rows = std::int64_t(m_stored.size());
    std::vector<int> row_parameter;
    for (auto r : rows) row_parameter.push_back(m_plan.statistic_owner[r]);
    const auto stack = [&](const std::string& name, auto& view, TensorShape shape) {
      using V = typename std::decay_t<decltype(view)>::value_type;
      StateArray<memory_space> a;
      a.name = name;
      a.dtype = dtype_of<V>();
      a.shape = std::move(shape);
      a.rows = rows;
      a.row_parameter = row_parameter;
      a.writer = writer;
      a.device_bytes = as_bytes<memory_space>(view, std::size_t(local_rows * a.row_elements()));
      arrays.push_back(a);
    };
    if (n > 0) {
      if (m_quantized) {
        stack("global/statistics/codes", m_statistic_codes, {n, m, m});
        stack("global/statistics/diagonal", m_statistic_diagonal, {n, m});
        stack("global/statistics/scales", m_statistic_scales, {n, m});
        stack("global/preconditioners/codes", m_preconditioner_codes, {n, m, m});
        stack("global/preconditioners/diagonal", m_preconditioner_diagonal, {n, m});
        stack("global/preconditioners/scales", m_preconditioner_scales, {n, m});
      } else {
        stack("global/statistics", m_statistics, {n, m, m});
        stack("global/preconditioners", m_preconditioners, {n, m, m});
      }
      // Per-statistic metadata and metrics, for the statistics of this rank's blocks.
      const auto& local = m_plan.local_statistics;
      m_exponents_host.clear();
      m_errors_host.clear();
      m_failures_host.clear();
      for (int s : local) {
        m_exponents_host.push_back(m_plan.statistic_exponent[s]);
        m_errors_host.push_back(m_metrics[s].error);
        m_failures_host.push_back(m_metrics[s].consecutive_failures);
      }
      const auto per_statistic = [&](const std::string& name, DType dtype, void* data) {
        auto a = host_array(name, dtype, {n}, data, std::int64_t(local.size()));
        if (!m_plan.all_local()) {
          a.rows.assign(local.begin(), local.end());
          for (int s : local) a.row_parameter.push_back(m_plan.statistic_owner[s]);
          a.writer = m_rank == 0;
        }
        arrays.push_back(a);
      };
      per_statistic("global/exponents", DType::int32, m_exponents_host.data());
      per_statistic("global/inverse_root_errors", DType::float64, m_errors_host.data());
      per_statistic("global/consecutive_failures", DType::int32, m_failures_host.data());
    }
    for (std::size_t p = 0; p < m_plan.parameters.size(); ++p) {
      const auto& pp = m_plan.parameters[p];
      auto& l = m_local[p];
      const std::string prefix = "local/" + pp.spec.name + "/";
      const auto local = [&](const std::string& name, auto& view, TensorShape shape) {
        if (view.size() == 0) return;
        const bool elementwise = shape == pp.spec.shape;
        using V = typename std::decay_t<decltype(view)>::value_type;
        StateArray<memory_space> a;
        a.name = prefix + name;
        a.dtype = dtype_of<V>();
        a.shape = std::move(shape);
        a.writer = m_rank == 0;  // replicated across the group
        a.parameter = elementwise ? int(p) : -1;
        a.device_bytes = as_bytes<memory_space>(view, view.size());
        arrays.push_back(a);
      };
      local("diagonal_statistics", l.diagonal, pp.spec.shape);
      if (pp.quantized_momentum) {
        const TensorShape columns(pp.spec.shape.begin() + 1, pp.spec.shape.end());
        local("momentum/codes", l.momentum_codes, pp.spec.shape);
        local("momentum/scales", l.momentum_scales, columns);
        local("diagonal_momentum/codes", l.diagonal_momentum_codes, pp.spec.shape);
        local("diagonal_momentum/scales", l.diagonal_momentum_scales, columns);
      } else {
        local("momentum", l.momentum, pp.spec.shape);
        local("diagonal_momentum", l.diagonal_momentum, pp.spec.shape);
      }
    }
    return arrays;
  }

  void state_restored(long step_count) override {
    m_step = step_count;
    const auto& local = m_plan.local_statistics;
    for (std::size_t k = 0; k < local.size() && k < m_errors_host.size(); ++k) {
      m_metrics[local[k]].error = m_errors_host[k];
      m_metrics[local[k]].consecutive_failures = m_failures_host[k];
    }
  }

  std::vector<double> statistic(int s) const override { return read_matrix(s, false); }
  std::vector<double> preconditioner(int s) const override { return read_matrix(s, true); }

  // Public, not private: nvcc rejects an extended __host__ __device__ lambda (KOKKOS_LAMBDA) whose
  // enclosing member function is private or protected. The class is local to this file.
 public:
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

  StateArray<memory_space> host_array(const std::string& name, DType dtype, TensorShape shape, void* data,
                                      std::int64_t elements) {
    StateArray<memory_space> a;
    a.name = name;
    a.dtype = dtype;
    a.shape = std::move(shape);
    a.writer = m_rank == 0;
    a.host_bytes = Kokkos::View<char*, Kokkos::HostSpace, Unmanaged>(static_cast<char*>(data),
                                                                      std::size_t(elements) * size_of(dtype));
    return a;
  }

  // ---------------------------------------------------------------------------------------------
  void allocate_stacks() {
    const int m = m_plan.max_size;
    const auto alloc3 = [&](auto& view, const std::string& label) {
      using View = std::decay_t<decltype(view)>;
      view = View(Kokkos::view_alloc(m_space, label), m_slots, m, m);
    };
    if (m_quantized) {
      alloc3(m_statistic_codes, "Lather::Shampoo::statistic_codes");
      alloc3(m_preconditioner_codes, "Lather::Shampoo::preconditioner_codes");
      m_statistic_diagonal = V2<T>("Lather::Shampoo::statistic_diagonal", m_slots, m);
      m_statistic_scales = V2<T>("Lather::Shampoo::statistic_scales", m_slots, m);
      m_preconditioner_diagonal = V2<T>("Lather::Shampoo::preconditioner_diagonal", m_slots, m);
      m_preconditioner_scales = V2<T>("Lather::Shampoo::preconditioner_scales", m_slots, m);
    } else {
      alloc3(m_statistics, "Lather::Shampoo::statistics");
      alloc3(m_preconditioners, "Lather::Shampoo::preconditioners");
    }
    // Statistics start at matrix_epsilon * I, preconditioners at I (padding rows too).
    const T eps = T(m_options.matrix_epsilon);
    if (m_quantized) {
      // Off-diagonal codes are already zero; the diagonal carries everything.
      const auto sd = m_statistic_diagonal, pd = m_preconditioner_diagonal;
      Kokkos::parallel_for("Lather::Shampoo::init_quantized",
                           Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {m_slots, m}),
                           KOKKOS_LAMBDA(int b, int i) {
                             sd(b, i) = eps;
                             pd(b, i) = T(1);
                           });
    } else {
      const auto s = m_statistics, p = m_preconditioners;
      Kokkos::parallel_for("Lather::Shampoo::init_stacks",
                           Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {m_slots, m}),
                           KOKKOS_LAMBDA(int b, int i) {
                             s(b, i, i) = eps;
                             p(b, i, i) = T(1);
                           });
    }
    // Padding rows of a replicated stack are identity statistics (the reference pads with I).
    if (!m_sharded && m_slots > int(m_stored.size())) {
      const int first = int(m_stored.size());
      if (m_quantized) {
        const auto sd = m_statistic_diagonal;
        Kokkos::parallel_for("Lather::Shampoo::init_padding",
                             Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {first, 0}, {m_slots, m}),
                             KOKKOS_LAMBDA(int b, int i) { sd(b, i) = T(1); });
      } else {
        const auto s = m_statistics;
        Kokkos::parallel_for("Lather::Shampoo::init_padding",
                             Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {first, 0}, {m_slots, m}),
                             KOKKOS_LAMBDA(int b, int i) { s(b, i, i) = T(1); });
      }
    }
  }

  void allocate_local_state() {
    const bool diagonal = graft_has_diagonal_statistics(m_options.graft_type);
    for (const auto& pp : m_plan.parameters) {
      LocalState l;
      const std::string label = "Lather::Shampoo::" + pp.spec.name;
      if (pp.preconditioned) l.blocks = make_block_table<memory_space>(pp.local_shape, pp.local_blocks, pp.spec.name);
      if (diagonal) l.diagonal = V1<Scalar>(label + "::diagonal_statistics", pp.elements);
      if (pp.quantized_momentum) {
        const std::int64_t columns = pp.elements / pp.spec.shape[0];
        l.momentum_codes = V1<std::int8_t>(label + "::momentum_codes", pp.elements);
        l.diagonal_momentum_codes = V1<std::int8_t>(label + "::diagonal_momentum_codes", pp.elements);
        l.momentum_scales = V1<Scalar>(label + "::momentum_scales", columns);
        l.diagonal_momentum_scales = V1<Scalar>(label + "::diagonal_momentum_scales", columns);
      } else {
        l.momentum = V1<Scalar>(label + "::momentum", pp.elements);
        l.diagonal_momentum = V1<Scalar>(label + "::diagonal_momentum", pp.elements);
      }
      m_local.push_back(std::move(l));
    }
  }

  void allocate_scratch() {
    const std::int64_t elements = std::max<std::int64_t>(1, m_plan.max_elements);
    const int m = m_plan.max_size;
    m_packed_a = V1<T>(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Shampoo::packed_a"), elements);
    m_packed_b = V1<T>(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Shampoo::packed_b"), elements);
    m_matrix = V2<T>("Lather::Shampoo::matrix", m, m);
    m_graft = V1<Scalar>(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Shampoo::graft"), elements);
    m_direction = V1<Scalar>(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Shampoo::direction"), elements);
    if (m_quantized) {
      m_momentum_work = V1<Scalar>("Lather::Shampoo::momentum_work", elements);
      m_diagonal_momentum_work = V1<Scalar>("Lather::Shampoo::diagonal_momentum_work", elements);
    }
    // Roots are computed in chunks of gathered statistics: at most `workspace_bytes` of input
    // and output together, at least one matrix.
    const int tasks = std::max(1, owned_count());
    const std::size_t per_matrix = 2 * std::size_t(m) * m * sizeof(T);
    m_root_chunk = int(std::max<std::size_t>(1, std::min<std::size_t>(tasks, m_options.root.workspace_bytes / per_matrix)));
    m_root_in = V3<T>(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Shampoo::root_in"), m_root_chunk, m, m);
    m_root_out = V3<T>(Kokkos::view_alloc(m_space, Kokkos::WithoutInitializing, "Lather::Shampoo::root_out"), m_root_chunk, m, m);

    // Parameter chunks: one in replicated mode; in sharded mode, consecutive parameters whose
    // preconditioners fit the gather budget together. Chunks are ranges of this rank's
    // statistics (m_plan.local_statistics), which are in parameter order.
    const int n_params = int(m_plan.parameters.size());
    if (!m_sharded) {
      m_chunks.push_back({0, n_params, 0, int(m_plan.local_statistics.size())});
    } else {
      const std::size_t per_statistic = m_quantized ? std::size_t(m) * m * sizeof(std::int16_t) + 2 * m * sizeof(T)
                                                    : std::size_t(m) * m * sizeof(T);
      const std::size_t budget = std::max<std::size_t>(per_statistic, m_options.root.workspace_bytes);
      Chunk chunk{0, 0, 0, 0};
      int next_local = 0;
      for (int p = 0; p < n_params; ++p) {
        const auto& pp = m_plan.parameters[p];
        const int stats = pp.preconditioned ? int(pp.local_blocks.size()) * pp.partition.rank() : 0;
        if (chunk.end_parameter > chunk.first_parameter &&
            std::size_t(chunk.end_statistic - chunk.first_statistic + stats) * per_statistic > budget) {
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
      if (m_quantized) {
        m_gathered_codes = V3<std::int16_t>("Lather::Shampoo::gathered_codes", largest, m, m);
        m_gathered_diagonal = V2<T>("Lather::Shampoo::gathered_diagonal", largest, m);
        m_gathered_scales = V2<T>("Lather::Shampoo::gathered_scales", largest, m);
      } else {
        m_gathered = V3<T>("Lather::Shampoo::gathered", largest, m, m);
      }
    }
  }

  int owned_count() const {
    int count = 0;
    for (int owner : m_owner) count += owner == m_rank;
    return count;
  }

  // ---------------------------------------------------------------------------------------------
  /// Squared gradient norms (kept for the normalized grafts); a NaN or Inf anywhere makes its sum
  /// non-finite (squares of floats cannot overflow a double), and is refused before any state moves.
  void check_finite(const Tensors& grads) {
    m_gradient_norm2.resize(grads.size());
    for (std::size_t p = 0; p < grads.size(); ++p) {
      const V1<const Scalar> g = grads[p];
      m_gradient_norm2[p] = squared_norm<ExecutionSpace, Scalar, memory_space>(m_space, g);
      LATHER_REQUIRE(std::isfinite(m_gradient_norm2[p]), "Shampoo::step ", m_step, ": the gradient of '",
                     m_plan.parameters[p].spec.name,
                     "' contains NaN or Inf; the optimizer state was not changed");
    }
    // Split tensors: the norm of the whole tensor, over the shards (one collective for all).
    std::vector<double> split;
    for (std::size_t p = 0; p < grads.size(); ++p)
      if (sums_over_shards(int(p))) split.push_back(m_gradient_norm2[p]);
    if (split.empty()) return;
    m_shards->sum_in_place(split);
    for (std::size_t p = 0, k = 0; p < grads.size(); ++p)
      if (sums_over_shards(int(p))) m_gradient_norm2[p] = split[k++];
  }

  /// True for a parameter split over the shard group, whose per-tensor norms are group sums.
  bool sums_over_shards(int p) const {
    return m_shards && m_shards->size() > 1 && m_plan.parameters[p].spec.split() &&
           m_plan.parameters[p].spec.shape != m_plan.parameters[p].spec.global();
  }

  /// Packs the gradient of parameter p into m_packed_a (statistics precision, blocks contiguous).
  void pack(int p, const V1<Scalar>& grad) {
    const V1<const Scalar> from = grad;
    repack_blocks<ExecutionSpace, Scalar, T, memory_space>(m_space, m_local[p].blocks, true, from, m_packed_a);
  }

  ConstMatrix block_matrix(const V1<T>& packed, std::int64_t offset, std::int64_t rows, std::int64_t cols) const {
    return ConstMatrix(packed.data() + offset, rows, cols);
  }

  /// statistic s <- w1 * statistic s + w2 * (mode-j Gram matrix of the block), for every block and
  /// dimension of parameter p that this rank stores.
  void update_statistics(int p, const V1<Scalar>& grad, double w1, double w2) {
    const auto& pp = m_plan.parameters[p];
    pack(p, grad);
    const int rank = pp.partition.rank();
    for (std::size_t b = 0; b < pp.local_blocks.size(); ++b) {
      const auto& block = pp.local_blocks[b];
      for (int j = 0, s = pp.local_block_statistic[b]; j < rank; ++j, ++s) {
        const int slot = m_slot[s];
        if (slot < 0) continue;
        const std::int64_t n = block.size[j];
        std::int64_t before = 1, after = 1;
        for (int d = 0; d < j; ++d) before *= block.size[d];
        for (int d = j + 1; d < rank; ++d) after *= block.size[d];
        // The Gram matrix first, then w1 * S + w2 * G with the reference's roundings: folding the
        // weights into the GEMM changes the last bit, which ill-conditioned statistics amplify.
        Matrix gram(m_matrix.data(), n, n);
        const double alpha = 1.0;
        double beta = 0.0;
        if (before == 1) {
          const auto x = block_matrix(m_packed_a, block.packed_offset, n, after);
          gemm(m_space, "N", "T", alpha, x, x, beta, gram);
        } else if (after == 1) {
          const auto x = block_matrix(m_packed_a, block.packed_offset, before, n);
          gemm(m_space, "T", "N", alpha, x, x, beta, gram);
        } else {
          for (std::int64_t a = 0; a < before; ++a, beta = 1.0) {
            const auto x = block_matrix(m_packed_a, block.packed_offset + a * n * after, n, after);
            gemm(m_space, "N", "T", alpha, x, x, beta, gram);
          }
        }
        if (m_quantized) {
          dequantize_slot(m_statistic_codes, m_statistic_diagonal, m_statistic_scales, slot, n, m_root_in, 0);
          blend_statistic<ExecutionSpace, T, memory_space>(m_space, m_root_in, 0, ConstMatrix(m_matrix.data(), n, n),
                                                           int(n), T(w1), T(w2));
          quantize_slot(m_root_in, 0, n, m_statistic_codes, m_statistic_diagonal, m_statistic_scales, slot);
        } else {
          blend_statistic<ExecutionSpace, T, memory_space>(m_space, m_statistics, slot,
                                                           ConstMatrix(m_matrix.data(), n, n), int(n), T(w1), T(w2));
        }
      }
    }
  }

  // Single-matrix (de)quantization between a stack slot and a float stack slot.
  void dequantize_slot(const V3<std::int16_t>& codes, const V2<T>& diagonal, const V2<T>& scales, int slot,
                       std::int64_t n, const V3<T>& out, int out_slot) const {
    Kokkos::parallel_for(
        "Lather::Shampoo::dequantize_slot",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {n, n}),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) {
          out(out_slot, i, j) = T(codes(slot, i, j)) * scales(slot, j) + (i == j ? diagonal(slot, j) : T(0));
        });
  }
  void quantize_slot(const V3<T>& in, int in_slot, std::int64_t n, const V3<std::int16_t>& codes,
                     const V2<T>& diagonal, const V2<T>& scales, int slot) const {
    const T buckets = T(max_code<std::int16_t>());
    Kokkos::parallel_for(
        "Lather::Shampoo::quantize_slot", Kokkos::RangePolicy<ExecutionSpace>(m_space, 0, n),
        KOKKOS_LAMBDA(std::int64_t j) {
          diagonal(slot, j) = in(in_slot, j, j);
          T largest = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const T a = i == j ? T(0) : kmath::fabs(in(in_slot, i, j));
            if (a > largest) largest = a;
          }
          const T scale = largest / buckets;
          scales(slot, j) = scale;
          const T divisor = scale > T(0) ? scale : T(1);
          for (std::int64_t i = 0; i < n; ++i)
            codes(slot, i, j) = i == j ? std::int16_t(0) : std::int16_t(kmath::nearbyint(in(in_slot, i, j) / divisor));
        });
  }

  // ---------------------------------------------------------------------------------------------
  /// Inverse roots of the statistics this rank owns, the reference's failure rule, then the
  /// exchange that gives every rank the result.
  void compute_preconditioners() {
    ScopedRegion region("Lather::Shampoo::inverse_roots");
    std::vector<int> mine;
    for (int s : m_plan.local_statistics)
      if (m_owner[s] == m_rank) mine.push_back(s);
    for (std::size_t begin = 0; begin < mine.size(); begin += m_root_chunk) {
      const std::size_t end = std::min(mine.size(), begin + m_root_chunk);
      solve_chunk(std::vector<int>(mine.begin() + begin, mine.begin() + end));
    }
    if (m_ranks > 1) exchange_roots(mine);
    if (m_options.max_consecutive_root_failures > 0) {
      for (int s : m_plan.local_statistics) {
        const auto& mt = m_metrics[s];
        LATHER_REQUIRE(mt.consecutive_failures < m_options.max_consecutive_root_failures,
                       "Shampoo step ", m_step, ": statistic ", s - m_plan.parameters[mt.parameter].first_statistic,
                       " of '", m_plan.parameters[mt.parameter].spec.name, "': inverse root failed ",
                       mt.consecutive_failures, " times in a row (last error ", mt.error,
                       " >= inverse_failure_threshold ", m_options.inverse_failure_threshold,
                       "); raise matrix_epsilon, use root.compute_precision=float64 or method=eigh");
      }
    }
  }

  void solve_chunk(const std::vector<int>& chunk) {
    const int count = int(chunk.size());
    // Gather the statistics into the root input stack.
    for (int c = 0; c < count; ++c) {
      const int s = chunk[c];
      const int slot = m_slot[s];
      const std::int64_t n = m_plan.statistic_size[s];
      if (m_quantized) {
        dequantize_slot(m_statistic_codes, m_statistic_diagonal, m_statistic_scales, slot, n, m_root_in, c);
      } else {
        const auto in = m_statistics, out = m_root_in;
        Kokkos::parallel_for("Lather::Shampoo::gather_statistic",
                             Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {n, n}),
                             KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) { out(c, i, j) = in(slot, i, j); });
      }
    }
    std::vector<linalg::RootTask> tasks(count);
    for (int c = 0; c < count; ++c)
      tasks[c] = {c, m_plan.statistic_size[chunk[c]], m_plan.statistic_exponent[chunk[c]]};
    const double threshold = m_options.inverse_failure_threshold;
    linalg::InverseRootResult result = linalg::inverse_pth_root(m_space, m_root_in, m_root_out, tasks, m_root_options);
    if (m_options.retry_failed_roots_in_double &&
        m_root_options.compute_precision == linalg::Precision::float32) {
      std::vector<linalg::RootTask> retry;
      std::vector<int> where;
      for (int c = 0; c < count; ++c)
        if (!result.accepted(c, threshold)) {
          retry.push_back(tasks[c]);
          where.push_back(c);
        }
      if (!retry.empty()) {
        auto options = m_root_options;
        options.compute_precision = linalg::Precision::float64;
        const auto again = linalg::inverse_pth_root(m_space, m_root_in, m_root_out, retry, options);
        for (std::size_t k = 0; k < retry.size(); ++k) {
          const int c = where[k];
          result.error[c] = again.error[k];
          result.iterations[c] = again.iterations[k];
          result.status[c] = again.status[k];
        }
      }
    }
    for (int c = 0; c < count; ++c) {
      const int s = chunk[c];
      auto& mt = m_metrics[s];
      mt.error = result.error[c];
      mt.iterations = result.iterations[c];
      if (!result.accepted(c, threshold)) {  // keep the previous preconditioner
        ++mt.consecutive_failures;
        ++mt.failures;
        continue;
      }
      mt.consecutive_failures = 0;
      store_preconditioner(c, s);
    }
  }

  /// Root c of the output stack becomes the preconditioner of statistic s.
  void store_preconditioner(int c, int s) {
    const int slot = m_slot[s];
    const std::int64_t n = m_plan.statistic_size[s];
    if (m_quantized) {
      quantize_slot(m_root_out, c, n, m_preconditioner_codes, m_preconditioner_diagonal, m_preconditioner_scales, slot);
    } else {
      const auto in = m_root_out, out = m_preconditioners;
      Kokkos::parallel_for("Lather::Shampoo::store_preconditioner",
                           Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {n, n}),
                           KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) { out(slot, i, j) = in(c, i, j); });
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Exchange between the ranks of the group (host-staged bytes).

  /// Bytes of one statistic's preconditioner in its storage format (leading block only).
  std::size_t preconditioner_bytes(int s) const {
    const std::size_t n = m_plan.statistic_size[s];
    return m_quantized ? n * n * sizeof(std::int16_t) + 2 * n * sizeof(T) : n * n * sizeof(T);
  }

  /// Copies preconditioner s (from `slot` of the given stacks) into host bytes, or back.
  template <class Codes, class Values, class Diagonal, class Scales>
  void transfer_preconditioner(int s, int slot, char* bytes, bool to_bytes, const Values& values,
                               const Codes& codes, const Diagonal& diagonal, const Scales& scales) {
    const std::int64_t n = m_plan.statistic_size[s];
    if (m_quantized) {
      auto code_host = Kokkos::create_mirror_view(Kokkos::subview(codes, slot, Kokkos::ALL, Kokkos::ALL));
      auto diag_host = Kokkos::create_mirror_view(Kokkos::subview(diagonal, slot, Kokkos::ALL));
      auto scale_host = Kokkos::create_mirror_view(Kokkos::subview(scales, slot, Kokkos::ALL));
      std::int16_t* c = reinterpret_cast<std::int16_t*>(bytes);
      T* d = reinterpret_cast<T*>(bytes + n * n * sizeof(std::int16_t));
      T* sc = d + n;
      if (to_bytes) {
        Kokkos::deep_copy(code_host, Kokkos::subview(codes, slot, Kokkos::ALL, Kokkos::ALL));
        Kokkos::deep_copy(diag_host, Kokkos::subview(diagonal, slot, Kokkos::ALL));
        Kokkos::deep_copy(scale_host, Kokkos::subview(scales, slot, Kokkos::ALL));
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int64_t j = 0; j < n; ++j) c[i * n + j] = code_host(i, j);
          d[i] = diag_host(i);
          sc[i] = scale_host(i);
        }
      } else {
        Kokkos::deep_copy(code_host, Kokkos::subview(codes, slot, Kokkos::ALL, Kokkos::ALL));
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int64_t j = 0; j < n; ++j) code_host(i, j) = c[i * n + j];
          diag_host(i) = d[i];
          scale_host(i) = sc[i];
        }
        Kokkos::deep_copy(Kokkos::subview(codes, slot, Kokkos::ALL, Kokkos::ALL), code_host);
        Kokkos::deep_copy(Kokkos::subview(diagonal, slot, Kokkos::ALL), diag_host);
        Kokkos::deep_copy(Kokkos::subview(scales, slot, Kokkos::ALL), scale_host);
      }
    } else {
      auto host = Kokkos::create_mirror_view(Kokkos::subview(values, slot, Kokkos::ALL, Kokkos::ALL));
      T* v = reinterpret_cast<T*>(bytes);
      if (to_bytes) {
        Kokkos::deep_copy(host, Kokkos::subview(values, slot, Kokkos::ALL, Kokkos::ALL));
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t j = 0; j < n; ++j) v[i * n + j] = host(i, j);
      } else {
        Kokkos::deep_copy(host, Kokkos::subview(values, slot, Kokkos::ALL, Kokkos::ALL));
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t j = 0; j < n; ++j) host(i, j) = v[i * n + j];
        Kokkos::deep_copy(Kokkos::subview(values, slot, Kokkos::ALL, Kokkos::ALL), host);
      }
    }
  }

  /// After the roots: every rank learns every statistic's metrics; in replicated mode also every
  /// preconditioner, so all ranks hold the same stack.
  void exchange_roots(const std::vector<int>& mine) {
    ScopedRegion region("Lather::Shampoo::exchange_roots");
    fence(m_space, "Lather::Shampoo: roots ready before sending");
    const std::size_t metric_bytes = sizeof(double) + 3 * sizeof(std::int64_t);
    std::vector<std::size_t> counts(m_ranks, 0);
    for (int s : m_plan.local_statistics)
      counts[m_owner[s]] += metric_bytes + (m_sharded ? 0 : preconditioner_bytes(s));
    std::vector<char> send(counts[m_rank]);
    char* out = send.data();
    for (int s : mine) {
      const auto& mt = m_metrics[s];
      const std::int64_t ints[3] = {mt.iterations, mt.consecutive_failures, mt.failures};
      std::memcpy(out, &mt.error, sizeof(double));
      std::memcpy(out + sizeof(double), ints, sizeof ints);
      out += metric_bytes;
      if (!m_sharded) {
        transfer_preconditioner(s, m_slot[s], out, true, m_preconditioners, m_preconditioner_codes,
                                m_preconditioner_diagonal, m_preconditioner_scales);
        out += preconditioner_bytes(s);
      }
    }
    std::size_t total = 0;
    for (auto c : counts) total += c;
    std::vector<char> received(total);
    m_group->allgatherv(send.data(), send.size(), received.data(), counts);
    std::vector<std::size_t> offset(m_ranks, 0);
    for (int r = 1; r < m_ranks; ++r) offset[r] = offset[r - 1] + counts[r - 1];
    for (int s : m_plan.local_statistics) {
      const int r = m_owner[s];
      const char* in = received.data() + offset[r];
      if (r != m_rank) {
        auto& mt = m_metrics[s];
        std::int64_t ints[3];
        std::memcpy(&mt.error, in, sizeof(double));
        std::memcpy(ints, in + sizeof(double), sizeof ints);
        mt.iterations = int(ints[0]);
        mt.consecutive_failures = int(ints[1]);
        mt.failures = ints[2];
        if (!m_sharded)
          transfer_preconditioner(s, m_slot[s], const_cast<char*>(in + metric_bytes), false, m_preconditioners,
                                  m_preconditioner_codes, m_preconditioner_diagonal, m_preconditioner_scales);
      }
      offset[r] += metric_bytes + (m_sharded ? 0 : preconditioner_bytes(s));
    }
  }

  /// Sharded mode: every rank gathers the preconditioners of one chunk of parameters.
  void gather_preconditioners(const Chunk& chunk) {
    ScopedRegion region("Lather::Shampoo::gather_preconditioners");
    fence(m_space, "Lather::Shampoo: preconditioners ready before sending");
    const auto& local = m_plan.local_statistics;
    std::vector<std::size_t> counts(m_ranks, 0);
    for (int k = chunk.first_statistic; k < chunk.end_statistic; ++k) counts[m_owner[local[k]]] += preconditioner_bytes(local[k]);
    std::vector<char> send(counts[m_rank]);
    char* out = send.data();
    for (int k = chunk.first_statistic; k < chunk.end_statistic; ++k)
      if (m_owner[local[k]] == m_rank) {
        transfer_preconditioner(local[k], m_slot[local[k]], out, true, m_preconditioners, m_preconditioner_codes,
                                m_preconditioner_diagonal, m_preconditioner_scales);
        out += preconditioner_bytes(local[k]);
      }
    std::size_t total = 0;
    for (auto c : counts) total += c;
    std::vector<char> received(total);
    m_group->allgatherv(send.data(), send.size(), received.data(), counts);
    std::vector<std::size_t> offset(m_ranks, 0);
    for (int r = 1; r < m_ranks; ++r) offset[r] = offset[r - 1] + counts[r - 1];
    for (int k = chunk.first_statistic; k < chunk.end_statistic; ++k) {
      const int s = local[k];
      const int r = m_owner[s];
      transfer_preconditioner(s, k - chunk.first_statistic, received.data() + offset[r], false, m_gathered,
                              m_gathered_codes, m_gathered_diagonal, m_gathered_scales);
      offset[r] += preconditioner_bytes(s);
    }
    m_gathered_first = chunk.first_statistic;
  }

  // ---------------------------------------------------------------------------------------------
  /// The n x n preconditioner of statistic s as a contiguous matrix: the stack slot itself when it
  /// is stored unpadded in full precision, else a contiguous copy in m_matrix.
  ConstMatrix preconditioner_matrix(int s) const {
    const std::int64_t n = m_plan.statistic_size[s];
    const bool gathered = m_sharded;
    const int slot = gathered ? m_local_index[s] - m_gathered_first : m_slot[s];
    const Matrix out(m_matrix.data(), n, n);
    if (m_quantized) {
      const auto codes = gathered ? m_gathered_codes : m_preconditioner_codes;
      const auto diagonal = gathered ? m_gathered_diagonal : m_preconditioner_diagonal;
      const auto scales = gathered ? m_gathered_scales : m_preconditioner_scales;
      Kokkos::parallel_for(
          "Lather::Shampoo::dequantize_preconditioner",
          Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {n, n}),
          KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) {
            out(i, j) = T(codes(slot, i, j)) * scales(slot, j) + (i == j ? diagonal(slot, j) : T(0));
          });
      return out;
    }
    const auto values = gathered ? m_gathered : m_preconditioners;
    if (n == m_plan.max_size) return ConstMatrix(slot_pointer(values, slot), n, n);
    Kokkos::parallel_for("Lather::Shampoo::copy_preconditioner",
                         Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(m_space, {0, 0}, {n, n}),
                         KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) { out(i, j) = values(slot, i, j); });
    return out;
  }

  /// Start of matrix `slot` of a stack, without dereferencing device memory on the host.
  template <class Stack>
  static typename Stack::pointer_type slot_pointer(const Stack& stack, int slot) {
    return stack.data() + std::size_t(slot) * stack.extent(1) * stack.extent(2);
  }

  /// direction = the reference's preconditioned_grad: each block contracted with its
  /// preconditioners in order (tensordot over the leading axis, which returns the axes to their
  /// order after rank steps), merged back to the parameter's shape.
  void precondition(int p, const V1<Scalar>& grad) {
    const auto& pp = m_plan.parameters[p];
    pack(p, grad);
    const int rank = pp.partition.rank();
    V1<T> current = m_packed_a, next = m_packed_b;
    for (std::size_t b = 0; b < pp.local_blocks.size(); ++b) {
      const auto& block = pp.local_blocks[b];
      current = m_packed_a;
      next = m_packed_b;
      for (int j = 0, s = pp.local_block_statistic[b]; j < rank; ++j, ++s) {
        const std::int64_t n = block.size[j];
        std::int64_t before = 1, after = 1;
        for (int d = 0; d < j; ++d) before *= block.size[d];
        for (int d = j + 1; d < rank; ++d) after *= block.size[d];
        const auto pm = preconditioner_matrix(s);
        const auto x = [&](std::int64_t off, std::int64_t r, std::int64_t c) { return ConstMatrix(current.data() + off, r, c); };
        const auto y = [&](std::int64_t off, std::int64_t r, std::int64_t c) { return Matrix(next.data() + off, r, c); };
        const std::int64_t o = block.packed_offset;
        if (before == 1) {
          gemm(m_space, "T", "N", 1.0, pm, x(o, n, after), 0.0, y(o, n, after));
        } else if (after == 1) {
          gemm(m_space, "N", "N", 1.0, x(o, before, n), pm, 0.0, y(o, before, n));
        } else {
          for (std::int64_t a = 0; a < before; ++a)
            gemm(m_space, "T", "N", 1.0, pm, x(o + a * n * after, n, after), 0.0, y(o + a * n * after, n, after));
        }
        std::swap(current, next);
      }
    }
    const V1<const T> result = current;
    repack_blocks<ExecutionSpace, T, Scalar, memory_space>(m_space, m_local[p].blocks, false, result, m_direction);
  }

  void update_parameter(int p, const V1<Scalar>& param, const V1<Scalar>& grad, double lr, long t) {
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
    graft_direction<ExecutionSpace, Scalar, memory_space>(m_space, s, g, l.diagonal, graft);
    // Squared norms of the graft and of the preconditioned gradient (summed over the shards for a
    // split tensor, so that it is grafted as a whole).
    std::vector<double> norms2 = {squared_norm<ExecutionSpace, Scalar, memory_space>(m_space, graft), 0.0};
    if (pp.preconditioned) {
      precondition(p, grad);
      norms2[1] = squared_norm<ExecutionSpace, Scalar, memory_space>(m_space, direction);
    }
    if (sums_over_shards(p)) m_shards->sum_in_place(norms2);
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
      dequantize_columns<ExecutionSpace, Scalar, std::int8_t>(m_space, l.momentum_codes, l.momentum_scales, rows, columns, m);
      dequantize_columns<ExecutionSpace, Scalar, std::int8_t>(m_space, l.diagonal_momentum_codes,
                                                              l.diagonal_momentum_scales, rows, columns, dm);
      apply_update<ExecutionSpace, Scalar, memory_space>(m_space, s, graft, dir, m, dm, param);
      quantize_columns<ExecutionSpace, Scalar, std::int8_t>(m_space, m, rows, columns, l.momentum_codes, l.momentum_scales);
      quantize_columns<ExecutionSpace, Scalar, std::int8_t>(m_space, dm, rows, columns, l.diagonal_momentum_codes,
                                                            l.diagonal_momentum_scales);
    } else {
      apply_update<ExecutionSpace, Scalar, memory_space>(m_space, s, graft, dir, l.momentum, l.diagonal_momentum, param);
    }
  }

  std::vector<double> read_matrix(int s, bool preconditioner) const {
    LATHER_REQUIRE(s >= 0 && s < m_plan.num_statistics(), "Shampoo: statistic ", s, " out of range [0, ",
                   m_plan.num_statistics(), ")");
    const int slot = m_slot[s];
    LATHER_REQUIRE(slot >= 0, "Shampoo: statistic ", s, " is not stored on this rank (group rank ", m_rank,
                   m_owner[s] < 0 ? ", it belongs to another weight shard)" : ")");
    const std::int64_t n = m_plan.statistic_size[s], m = m_plan.max_size;
    std::vector<double> out(n * n);
    if (m_quantized) {
      auto codes = Kokkos::create_mirror_view(preconditioner ? m_preconditioner_codes : m_statistic_codes);
      auto diagonal = Kokkos::create_mirror_view(preconditioner ? m_preconditioner_diagonal : m_statistic_diagonal);
      auto scales = Kokkos::create_mirror_view(preconditioner ? m_preconditioner_scales : m_statistic_scales);
      Kokkos::deep_copy(codes, preconditioner ? m_preconditioner_codes : m_statistic_codes);
      Kokkos::deep_copy(diagonal, preconditioner ? m_preconditioner_diagonal : m_statistic_diagonal);
      Kokkos::deep_copy(scales, preconditioner ? m_preconditioner_scales : m_statistic_scales);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < n; ++j)
          out[i * n + j] = double(T(codes(slot, i, j)) * scales(slot, j) + (i == j ? diagonal(slot, j) : T(0)));
    } else {
      const auto& stack = preconditioner ? m_preconditioners : m_statistics;
      auto host = Kokkos::create_mirror_view(stack);
      Kokkos::deep_copy(host, stack);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < n; ++j) out[i * n + j] = double(host(slot, i, j));
    }
    (void)m;
    return out;
  }

  ExecutionSpace m_space;
  ShampooOptions m_options;
  linalg::InverseRootOptions m_root_options;
  ShampooPlan m_plan;
  std::shared_ptr<WorkGroup> m_group;
  std::shared_ptr<WorkGroup> m_shards;  // ranks holding the other slices of split parameters
  int m_ranks = 1, m_rank = 0;
  bool m_quantized = false, m_sharded = false;
  std::vector<int> m_owner;   // per statistic: rank computing its root (-1: another shard's)
  std::vector<int> m_local_index;  // per statistic: position in m_plan.local_statistics, or -1
  std::vector<int> m_slot;    // per statistic: slot in the local stacks, -1 if not stored here
  std::vector<int> m_stored;  // statistics stored here, by slot
  int m_slots = 1;
  std::vector<Chunk> m_chunks;
  int m_root_chunk = 1;
  int m_gathered_first = 0;
  long m_step = 0;

  V3<T> m_statistics, m_preconditioners;
  V3<std::int16_t> m_statistic_codes, m_preconditioner_codes;
  V2<T> m_statistic_diagonal, m_statistic_scales, m_preconditioner_diagonal, m_preconditioner_scales;
  std::vector<LocalState> m_local;
  std::vector<StatisticMetrics> m_metrics;

  V1<T> m_packed_a, m_packed_b;
  V2<T> m_matrix;
  V1<Scalar> m_graft, m_direction, m_momentum_work, m_diagonal_momentum_work;
  V3<T> m_root_in, m_root_out;
  V3<T> m_gathered;
  V3<std::int16_t> m_gathered_codes;
  V2<T> m_gathered_diagonal, m_gathered_scales;

  std::vector<double> m_gradient_norm2;
  // Host mirrors of host-side state, for state_arrays().
  std::int64_t m_step_host = 0;
  std::vector<std::int32_t> m_exponents_host, m_failures_host;
  std::vector<double> m_errors_host;
};

template <class ExecutionSpace, class Scalar, class T>
std::unique_ptr<ShampooEngineBase<ExecutionSpace, Scalar>> make_shampoo_engine(
    const ExecutionSpace& space, const std::vector<ParameterSpec>& parameters, const ShampooOptions& options,
    std::shared_ptr<WorkGroup> group, std::shared_ptr<WorkGroup> shards) {
  return std::make_unique<ShampooEngine<ExecutionSpace, Scalar, T>>(space, parameters, options, std::move(group),
                                                                    std::move(shards));
}

#define LATHER_INSTANTIATE_SHAMPOO_ENGINE(SCALAR, T)                                                  \
  template std::unique_ptr<ShampooEngineBase<DefaultExecutionSpace, SCALAR>>                        \
  make_shampoo_engine<DefaultExecutionSpace, SCALAR, T>(const DefaultExecutionSpace&,                \
                                                         const std::vector<ParameterSpec>&,          \
                                                         const ShampooOptions&, std::shared_ptr<WorkGroup>,    \
                                                         std::shared_ptr<WorkGroup>);
LATHER_INSTANTIATE_SHAMPOO_ENGINE(float, float)
LATHER_INSTANTIATE_SHAMPOO_ENGINE(float, double)
LATHER_INSTANTIATE_SHAMPOO_ENGINE(double, float)
LATHER_INSTANTIATE_SHAMPOO_ENGINE(double, double)

}  // namespace lather::optim::Impl
