#pragma once
// The matrix products of a Shampoo step over a rank's shape groups (units whose blocks have the
// same shape, consecutive in the packed buffer): the Gram matrices of every dimension, blended
// into the statistics, and the contraction of every block with its preconditioners. On a device
// each product of one dimension of one group is one strided-batched GEMM call. On the host, with
// dense stores, the products of one block at a time go straight to the BLAS, in the stores' slots,
// the blocks shared out among host threads that each run one BLAS thread: at Shampoo's sizes a
// threaded BLAS keeps its threads busier with separate blocks than with one block split up
// (n = 128, 2 CPUs: syrk 155-160 GFLOP/s against 75-80, GEMM 185-198 against 138-159). At a
// reduced ProductPrecision (ShampooOptions::product_precision) every product goes through the
// rounding GEMM (lather/core/gemm.hpp): on the host that is the batched path with its rounded
// copies, not the direct BLAS calls, which have no rounding.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/core/host_blas_threads.hpp>
#include <lather/core/gemm.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/optim/impl/matrix_store.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>

#include <algorithm>
#include <vector>

namespace lather::optim::Impl {

template <class ExecutionSpace, class T>
class BlockProducts {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Store = MatrixStore<ExecutionSpace, T>;
  using Flat = Kokkos::View<T*, memory_space>;

  /// Scratch for Gram matrices within `workspace_bytes` (at least one of the largest), for the
  /// preconditioners of the largest group that must be copied out of the store, and for the
  /// intermediate contractions. `host_threads`: the threads that share out the blocks on a host
  /// backend (ignored on a device); `by_work`: fewer where a phase has too little work for them
  /// (flops_per_host_thread each). `kl_statistics`: scratch for update_kl_statistics too.
  /// `precision`: what the products' inputs are rounded to (float32: nothing).
  BlockProducts(const ExecutionSpace& space, const ShampooPlan& plan, const StepPlan& step, std::size_t workspace_bytes,
                bool quantized, int host_threads, bool by_work, bool kl_statistics = false,
                ProductPrecision precision = ProductPrecision::float32)
      : m_step(&step),
        m_threads(::lather::Impl::runs_on_host<ExecutionSpace> ? std::max(1, host_threads) : 1),
        m_threads_by_work(by_work),
        m_precision(precision) {
    std::int64_t statistics = 0, matrices = 0, packed = 0;
    for (const auto& group : step.groups) {
      std::int64_t group_matrices = 0;
      for (int d : group.dims) {
        const std::int64_t n = group.size[std::size_t(d)];
        const std::int64_t all = std::int64_t(group.units.size()) * n * n;
        statistics += all;
        group_matrices += all;
      }
      matrices = std::max(matrices, group_matrices);
      const std::int64_t elements = product(group.size, 0, int(group.size.size()));
      m_block_elements = std::max(m_block_elements, elements);
      packed = std::max(packed, step.packed_offset[group.units.front()] + std::int64_t(group.units.size()) * elements);
    }
    // Device: every block of the groups, which come first in the packed order. Host: two of the
    // largest block to alternate between for each thread that preconditions, as many threads as
    // that much (no more than the device's) allows, one at least.
    std::int64_t work = packed;
    if constexpr (::lather::Impl::runs_on_host<ExecutionSpace>) {
      m_precondition_threads =
          int(std::clamp<std::int64_t>(packed / std::max<std::int64_t>(2 * m_block_elements, 1), 1, m_threads));
      work = 2 * m_block_elements * m_precondition_threads;
    }
    const std::int64_t m = plan.max_size;
    const std::int64_t budget = std::int64_t(workspace_bytes / sizeof(T)) / (quantized ? 2 : 1);
    m_gram_capacity = std::max(m * m, std::min(statistics, budget));
    const auto scratch = [&](const char* label, std::int64_t n) {
      return Flat(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string("Lather::Shampoo::") + label),
                  std::size_t(std::max<std::int64_t>(n, 1)));
    };
    m_grams = scratch("grams", m_gram_capacity);
    if (quantized) m_gram_scratch = scratch("gram_scratch", m_gram_capacity);
    m_matrices = scratch("preconditioner_matrices", matrices);
    m_work = scratch("preconditioning_work", work);
    if (kl_statistics) m_kl_work = scratch("kl_statistics_work", packed);
  }

  std::int64_t workspace_bytes() const {
    return std::int64_t((m_grams.span() + m_gram_scratch.span() + m_matrices.span() + m_work.span() + m_kl_work.span() +
                         m_rounded.span()) *
                        sizeof(T));
  }
  /// GEMM launches since construction.
  long launches() const { return m_launches; }
  /// Floating-point operations of the products since construction, as the BLAS computes them:
  /// a Gram matrix along a dimension of size n of a block of E elements 2 n E by GEMM, (n + 1) E
  /// by syrk (the upper triangle); a contraction with a preconditioner 2 n E. Counted beside the
  /// launches, in the helpers that make them.
  double flops() const { return m_flops; }

  /// statistics(slot) <- w1 * statistics + w2 * (Gram matrix of the block along each dimension),
  /// for every unit of every group; `packed` holds the blocks (statistics precision). `only`: the
  /// j-th preconditioned dimension of each group alone (groups with fewer are left alone).
  void update_statistics(const ExecutionSpace& space, const T* packed, Store& statistics, T w1, T w2, int only = -1) {
    if constexpr (::lather::Impl::runs_on_host<ExecutionSpace>) {
      if (!statistics.quantized() && m_precision == ProductPrecision::float32) {
        update_dense_statistics_on_host(space, packed, statistics, w1, w2, only);
        return;
      }
    }
    SlotList<memory_space> list;
    std::int64_t used = 0;
    const auto flush = [&] {
      if (list.count() == 0) return;
      list.upload(space);
      statistics.blend(space, list, m_grams, w1, w2, m_gram_scratch);
      list.clear();
      used = 0;
    };
    for_each_statistic_dimension(
        packed,
        [&](const StatisticDimension& s) {
          const std::int64_t square = std::int64_t(s.n) * s.n;
          // Dense slots of the padded size: the products are blended in place by the GEMM itself,
          // S = w2 X X^T + w1 S, with no Gram scratch and no blend pass.
          if (T* slots = statistics.contiguous(s.first_slot, s.n)) {
            gram_products(space, s.first, s.elements, s.n, s.before, s.after, w2, w1, slots, square, s.units);
            return;
          }
          // As many of the group's units at once as the Gram scratch holds.
          for (int begin = 0; begin < s.units;) {
            if (used + square > m_gram_capacity) flush();
            const int count = int(std::min<std::int64_t>(s.units - begin, (m_gram_capacity - used) / square));
            gram_products(space, s.first + begin * s.elements, s.elements, s.n, s.before, s.after, T(1), T(0),
                          m_grams.data() + used, square, count);
            for (int k = 0; k < count; ++k) {
              list.add(s.first_slot + begin + k, s.n, used, s.n);
              used += square;
            }
            begin += count;
          }
        },
        only);
    flush();
  }

  /// KL-Shampoo's statistics: statistics(slot of dimension j) <- w1 * statistics + w2 * (Gram
  /// matrix along j of the block contracted along every other preconditioned dimension with its
  /// preconditioner), as Meta's RootInvKLShampooPreconditionerList computes them. One sweep per
  /// j: the contracted blocks of every group with a j-th dimension land in `scratch` (which holds
  /// the groups' blocks at their packed offsets, as `packed` does), then update_statistics takes
  /// their Gram matrices along j. A group of one dimension has nothing to contract: its blocks
  /// are copied.
  void update_kl_statistics(const ExecutionSpace& space, const T* packed, const Store& preconditioners,
                            Store& statistics, T w1, T w2, T* scratch) {
    using Unmanaged = Kokkos::View<T*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using ConstUnmanaged = Kokkos::View<const T*, memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    std::size_t most = 0;
    for (const auto& group : m_step->groups) most = std::max(most, group.dims.size());
    std::vector<const T*> p;
    std::vector<std::int64_t> stride_p;
    for (int j = 0; j < int(most); ++j) {
      for (const auto& group : m_step->groups) {
        const int contractions = int(group.dims.size()) - 1;
        if (j > contractions) continue;
        const int units = int(group.units.size());
        const std::int64_t elements = product(group.size, 0, int(group.size.size()));
        const std::int64_t offset = m_step->packed_offset[group.units.front()];
        if (contractions == 0) {
          Kokkos::deep_copy(space, Unmanaged(scratch + offset, std::size_t(units * elements)),
                            ConstUnmanaged(packed + offset, std::size_t(units * elements)));
          continue;
        }
        group_preconditioners(space, group, preconditioners, p, stride_p);
        // The last contraction writes `scratch`: start in it or in m_kl_work by their parity.
        const T* x = packed + offset;
        T* targets[2] = {scratch + offset, m_kl_work.data() + offset};
        int target = (contractions % 2 == 1) ? 0 : 1;
        for (int i = 0; i <= contractions; ++i) {
          if (i == j) continue;
          contract(space, group, i, p[std::size_t(i)], stride_p[std::size_t(i)], x, targets[target], elements, units);
          x = targets[target];
          target = 1 - target;
        }
      }
      update_statistics(space, scratch, statistics, w1, w2, j);
    }
  }

  /// The preconditioners of each preconditioned dimension of `group`, in order: p[j] the first
  /// unit's, stride_p[j] apart. Consecutive slots used in place when stored densely at the padded
  /// size, else copied out contiguously (into m_matrices), one dimension after another.
  template <class Group>
  void group_preconditioners(const ExecutionSpace& space, const Group& group, const Store& preconditioners,
                             std::vector<const T*>& p, std::vector<std::int64_t>& stride_p) {
    const int units = int(group.units.size()), contractions = int(group.dims.size());
    p.assign(std::size_t(contractions), nullptr);
    stride_p.assign(std::size_t(contractions), 0);
    SlotList<memory_space> list;
    std::int64_t copied = 0;
    for (int j = 0; j < contractions; ++j) {
      const std::int64_t n = group.size[std::size_t(group.dims[std::size_t(j)])];
      const int first_slot = group.first_slot + j * units;
      p[std::size_t(j)] = preconditioners.contiguous(first_slot, int(n));
      stride_p[std::size_t(j)] = std::int64_t(preconditioners.max_size()) * preconditioners.max_size();
      if (p[std::size_t(j)]) continue;
      list.clear();
      for (int k = 0; k < units; ++k) list.add(first_slot + k, int(n), copied + k * n * n, int(n));
      list.upload(space);
      preconditioners.read(space, list, m_matrices);
      p[std::size_t(j)] = m_matrices.data() + copied;
      stride_p[std::size_t(j)] = n * n;
      copied += units * n * n;
    }
  }

  /// C_k = alpha (Gram matrix of block k along a dimension of size n) + beta C_k for `count`
  /// blocks `elements` apart from x, C_k `stride_c` apart: X X^T of the [n, after] view, X^T X of
  /// the [before, n] view, or the sum over the leading index of the [n, after] slices. On the host
  /// (quantized statistics) the blocks are shared out among the product threads.
  void gram_products(const ExecutionSpace& space, const T* x, std::int64_t elements, int n, std::int64_t before,
                     std::int64_t after, T alpha, T beta, T* c, std::int64_t stride_c, int count) {
    using lather::Impl::gemm_strided_batched;
    m_flops += 2.0 * double(count) * double(n) * double(elements);
    const int threads = m_threads;
    const bool by_work = m_threads_by_work;
    const ProductPrecision precision = m_precision;
    if (before == 1)
      m_launches += gemm_strided_batched(space, precision, m_rounded, 'N', 'T', n, n, int(after), alpha, x, elements, x,
                                         elements, beta, c, stride_c, count, threads, by_work);
    else if (after == 1)
      m_launches += gemm_strided_batched(space, precision, m_rounded, 'T', 'N', n, n, int(before), alpha, x, elements,
                                         x, elements, beta, c, stride_c, count, threads, by_work);
    else
      for (std::int64_t a = 0; a < before; ++a)
        m_launches += gemm_strided_batched(space, precision, m_rounded, 'N', 'T', n, n, int(after), alpha,
                                           x + a * n * after, elements, x + a * n * after, elements,
                                           a == 0 ? beta : T(1), c, stride_c, count, threads, by_work);
  }

  /// Host, dense statistics: every Gram matrix blended into its slot in place by BLAS syrk,
  /// S = w2 X X^T + w1 S (the upper triangle: half the flops of the GEMM; no scratch, no blend
  /// pass), whatever the statistic's size; symmetrize() fills in the lower triangles before
  /// anything reads the statistics.
  void update_dense_statistics_on_host(const ExecutionSpace& space, const T* packed, Store& statistics, T w1, T w2,
                                       int only) {
    m_host_grams.clear();
    double flops = 0;
    for_each_statistic_dimension(
        packed,
        [&](const StatisticDimension& s) {
          for (int k = 0; k < s.units; ++k)
            m_host_grams.push_back(
                {s.first + k * s.elements, statistics.leading(s.first_slot + k), s.n, s.before, s.after});
          m_launches += host_calls(s);
          flops += double(s.units) * double(s.n + 1) * double(s.elements);  // syrk: the upper triangle
        },
        only);
    m_flops += flops;
    const int ld = statistics.max_size();
    ::lather::Impl::fence(space, "Lather::Shampoo: blocks packed before syrk");
    on_host_threads(space, m_host_grams.size(), flops, m_threads, [&](int, std::size_t i) {
      const HostGram& g = m_host_grams[i];
      upper_gram(g.x, g.n, g.before, g.after, w2, w1, g.c, ld);
    });
    m_upper_only = true;
  }

  /// The upper triangle of C = alpha (Gram matrix of one block) + beta C (rows ldc apart), on the
  /// host, through the BLAS alone.
  static void upper_gram(const T* x, int n, std::int64_t before, std::int64_t after, T alpha, T beta, T* c, int ldc) {
    using ::lather::Impl::host_gram_upper;
    if (before == 1)
      host_gram_upper(false, n, int(after), alpha, x, beta, c, ldc);
    else if (after == 1)
      host_gram_upper(true, n, int(before), alpha, x, beta, c, ldc);
    else
      for (std::int64_t a = 0; a < before; ++a)
        host_gram_upper(false, n, int(after), alpha, x + a * n * after, a == 0 ? beta : T(1), c, ldc);
  }

  /// item(thread, i) for i < count on the host threads (thread < at most `most`), each running one
  /// BLAS thread; in this thread alone, with the BLAS's own threads, where one would do. `flops`:
  /// the work of all the items. A threaded host backend (OpenMP, Threads) lends its own threads,
  /// where the user placed and pinned them; a serial one, the process's kept threads.
  template <class Item>
  void on_host_threads(const ExecutionSpace& space, std::size_t count, double flops, int most, const Item& item) const {
    const int threads =
        std::min(most, ::lather::Impl::host_threads_for_products(m_threads, m_threads_by_work, count, flops));
    if (threads <= 1) {
      for (std::size_t i = 0; i < count; ++i) item(0, i);
      return;
    }
    ::lather::ScopedHostBlasThreads one_blas_thread(1);
    ::lather::Impl::for_each_on_host_threads(space, threads, count, item);
  }

  /// True when update_statistics left dense statistics with their upper triangles only: the
  /// caller runs symmetrize() on the store before anything reads them, then clears it.
  bool upper_only() const { return m_upper_only; }
  void clear_upper_only() { m_upper_only = false; }

  /// direction = the reference's preconditioned_grad of every unit of every group: each block
  /// contracted with its preconditioners in order (tensordot over the leading axis, which brings
  /// the axes back to their order after rank steps). A dimension without a statistic (one-sided)
  /// is the reference's transpose with no contraction: here, nothing. `input` holds the blocks;
  /// the result lands in `direction`, both at the units' packed offsets.
  void precondition(const ExecutionSpace& space, const T* input, const Store& preconditioners, T* direction) {
    if constexpr (::lather::Impl::runs_on_host<ExecutionSpace>) {
      if (!preconditioners.quantized() && m_precision == ProductPrecision::float32) {
        precondition_dense_on_host(space, input, preconditioners, direction);
        return;
      }
    }
    for (const auto& group : m_step->groups) {
      const int units = int(group.units.size()), contractions = int(group.dims.size());
      const std::int64_t elements = product(group.size, 0, int(group.size.size()));
      const std::int64_t offset = m_step->packed_offset[group.units.front()];
      std::vector<const T*> p;
      std::vector<std::int64_t> stride_p;
      group_preconditioners(space, group, preconditioners, p, stride_p);
      if constexpr (::lather::Impl::runs_on_host<ExecutionSpace>) {
        // Quantized preconditioners, copied out above, or products at a reduced precision (whose
        // inputs are rounded into copies anyway): one block at a time through a block-sized
        // scratch that stays in cache (the host makes one GEMM per block either way), instead of
        // a pass over a work buffer the size of all.
        for (int k = 0; k < units; ++k) {
          const T* x = input + offset + k * elements;
          for (int j = 0; j < contractions; ++j) {
            T* y = j == contractions - 1 ? direction + offset + k * elements : m_work.data() + (j % 2) * elements;
            contract(space, group, j, p[std::size_t(j)] + k * stride_p[std::size_t(j)], 0, x, y, elements, 1);
            x = y;
          }
        }
      } else {
        // One strided-batched GEMM per dimension over all the group's blocks; the last
        // contraction writes `direction`: start in it or in the work buffer by their parity.
        const T* x = input + offset;
        T* targets[2] = {direction + offset, m_work.data() + offset};
        int target = (contractions % 2 == 1) ? 0 : 1;
        for (int j = 0; j < contractions; ++j) {
          contract(space, group, j, p[std::size_t(j)], stride_p[std::size_t(j)], x, targets[target], elements, units);
          x = targets[target];
          target = 1 - target;
        }
      }
    }
  }

 private:
  /// One preconditioned dimension of a shape group: its `units` blocks from `first`, `elements`
  /// apart, viewed as [before, n, after]; their statistics in the slots from `first_slot` on.
  struct StatisticDimension {
    const T* first;
    int units, n, first_slot;
    std::int64_t elements, before, after;
  };
  /// The BLAS calls the host makes for a dimension's products, one per block, or one per leading
  /// index where the dimension is in the middle of the block.
  static long host_calls(const StatisticDimension& s) {
    return long(s.units) * (s.before > 1 && s.after > 1 ? long(s.before) : 1);
  }
  /// f(dimension) for every preconditioned dimension of every group of the step, in slot order;
  /// `packed` holds the blocks.
  template <class F>
  void for_each_statistic_dimension(const T* packed, const F& f, int only = -1) const {
    for (const auto& group : m_step->groups) {
      const int units = int(group.units.size());
      const std::int64_t elements = product(group.size, 0, int(group.size.size()));
      const T* first = packed + m_step->packed_offset[group.units.front()];
      for (std::size_t j = 0; j < group.dims.size(); ++j) {
        if (only >= 0 && int(j) != only) continue;
        const int d = group.dims[j];
        f(StatisticDimension{first, units, int(group.size[std::size_t(d)]), group.first_slot + int(j) * units, elements,
                             product(group.size, 0, d), product(group.size, d + 1, -1)});
      }
    }
  }

  struct HostGram {
    const T* x;  // the block
    T* c;        // its statistic's slot
    int n;
    std::int64_t before, after;
  };
  struct HostBlock {
    int group, unit;
  };

  /// precondition() on the host with dense preconditioners: each block contracted with its
  /// preconditioners in their slots, through two block-sized scratch buffers per thread.
  void precondition_dense_on_host(const ExecutionSpace& space, const T* input, const Store& preconditioners,
                                  T* direction) {
    const auto& groups = m_step->groups;
    m_host_blocks.clear();
    for (std::size_t g = 0; g < groups.size(); ++g)
      for (int k = 0; k < int(groups[g].units.size()); ++k) m_host_blocks.push_back({int(g), k});
    double flops = 0;
    for_each_statistic_dimension(input, [&](const StatisticDimension& s) {
      m_launches += host_calls(s);
      flops += double(s.units) * 2.0 * double(s.n) * double(s.elements);
    });
    m_flops += flops;
    const int ld = preconditioners.max_size();
    ::lather::Impl::fence(space, "Lather::Shampoo: blocks packed before preconditioning");
    on_host_threads(space, m_host_blocks.size(), flops, m_precondition_threads, [&](int thread, std::size_t i) {
      const auto& group = groups[std::size_t(m_host_blocks[i].group)];
      const int k = m_host_blocks[i].unit, units = int(group.units.size()), contractions = int(group.dims.size());
      const std::int64_t elements = product(group.size, 0, int(group.size.size()));
      const std::int64_t at = m_step->packed_offset[group.units.front()] + k * elements;
      T* work = m_work.data() + std::int64_t(thread) * 2 * m_block_elements;
      const T* x = input + at;
      for (int j = 0; j < contractions; ++j) {
        T* y = j == contractions - 1 ? direction + at : work + (j % 2) * elements;
        contract_on_host(group, j, preconditioners.leading(group.first_slot + j * units + k), ld, x, y);
        x = y;
      }
    });
  }

  /// y = the contraction of one block x with preconditioner p (rows ldp apart) along the group's
  /// j-th preconditioned dimension, on the host, through the BLAS alone (as contract()).
  template <class Group>
  static void contract_on_host(const Group& group, int j, const T* p, int ldp, const T* x, T* y) {
    using ::lather::Impl::host_gemm;
    const int d = group.dims[std::size_t(j)];
    const int n = int(group.size[std::size_t(d)]);
    const std::int64_t before = product(group.size, 0, d), after = product(group.size, d + 1, -1);
    if (before == 1)  // P^T X with X [n, after]
      host_gemm('T', 'N', n, int(after), n, T(1), p, ldp, x, int(after), T(0), y, int(after));
    else if (after == 1)  // X P with X [before, n]
      host_gemm('N', 'N', int(before), n, n, T(1), x, n, p, ldp, T(0), y, n);
    else
      for (std::int64_t a = 0; a < before; ++a)
        host_gemm('T', 'N', n, int(after), n, T(1), p, ldp, x + a * n * after, int(after), T(0), y + a * n * after,
                  int(after));
  }

  /// y_k = the contraction of block x_k (`elements` apart) with preconditioner p_k (`stride_p`
  /// apart) along the group's j-th preconditioned dimension, for `count` blocks; on the host the
  /// blocks are shared out among the product threads, as gram_products() does.
  template <class Group>
  void contract(const ExecutionSpace& space, const Group& group, int j, const T* p, std::int64_t stride_p, const T* x,
                T* y, std::int64_t elements, int count) {
    using lather::Impl::gemm_strided_batched;
    const int d = group.dims[std::size_t(j)];
    const std::int64_t n = group.size[std::size_t(d)];
    const std::int64_t before = product(group.size, 0, d), after = product(group.size, d + 1, -1);
    m_flops += 2.0 * double(count) * double(n) * double(elements);
    const ProductPrecision precision = m_precision;
    if (before == 1)  // P^T X with X [n, after]
      m_launches += gemm_strided_batched(space, precision, m_rounded, 'T', 'N', int(n), int(after), int(n), T(1), p,
                                         stride_p, x, elements, T(0), y, elements, count, m_threads, m_threads_by_work);
    else if (after == 1)  // X P with X [before, n]
      m_launches += gemm_strided_batched(space, precision, m_rounded, 'N', 'N', int(before), int(n), int(n), T(1), x,
                                         elements, p, stride_p, T(0), y, elements, count, m_threads, m_threads_by_work);
    else
      for (std::int64_t a = 0; a < before; ++a)
        m_launches += gemm_strided_batched(space, precision, m_rounded, 'T', 'N', int(n), int(after), int(n), T(1), p,
                                           stride_p, x + a * n * after, elements, T(0), y + a * n * after, elements,
                                           count, m_threads, m_threads_by_work);
  }

  /// The product of size[begin, end) (end < 0: to the last).
  static std::int64_t product(const std::vector<std::int64_t>& size, int begin, int end) {
    std::int64_t out = 1;
    for (int d = begin; d < (end < 0 ? int(size.size()) : end); ++d) out *= size[std::size_t(d)];
    return out;
  }

  const StepPlan* m_step;
  int m_threads = 1;
  bool m_threads_by_work = false;
  int m_precondition_threads = 1;     // host: the threads m_work has scratch for
  std::int64_t m_block_elements = 0;  // the largest block's
  std::vector<HostGram> m_host_grams;
  std::vector<HostBlock> m_host_blocks;
  std::int64_t m_gram_capacity = 1;
  Flat m_grams, m_gram_scratch, m_matrices, m_work, m_kl_work;
  ProductPrecision m_precision = ProductPrecision::float32;
  Flat m_rounded;  // the products' rounded inputs, where the backend does not round them itself
  long m_launches = 0;
  double m_flops = 0;
  bool m_upper_only = false;
};

}  // namespace lather::optim::Impl
