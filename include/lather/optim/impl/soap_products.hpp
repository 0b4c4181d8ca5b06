#pragma once
// Part of the implementation of Soap (included by <lather/optim/impl/soap_impl.hpp> only): the
// per-class batched products (rotations into and out of the eigenbases, factor updates) and the
// eigh/QR refresh of this rank's bases.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/optim/impl/soap_impl.hpp>

namespace lather::optim {

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::rotate(const ExecutionSpace& space, const ShapeClass& c, Scalar* from,
                                          Scalar* scratch, bool forward) {
  // Mode-d product of each block viewed as [outer, n, inner]: forward Y[a] = Q^T X[a], backward
  // Y[a] = Q X[a]. The order of the modes does not matter (they commute); the result ends in
  // `from`, copied back when an odd number of products left it in `scratch`. The blocks of the
  // class lie `elements` apart and their bases n^2 apart: one batched product per dimension
  // (outer and inner both > 1: one per block or one per slice a, whichever is fewer).
  using ::lather::Impl::gemm_strided_batched;
  const auto& size = c.size;
  const std::int64_t count = std::int64_t(c.blocks.size()), elements = c.elements;
  const int threads = m_host_threads;                // on a host backend (gemm_strided_batched)
  const bool by_work = m_options.host_threads == 0;  // automatic: as many as the flops pay for
  Scalar* in = from;
  Scalar* out = scratch;
  for (std::size_t d = 0; d < size.size(); ++d) {
    if (c.factor[d] < 0) continue;
    const int n = int(size[d]);
    const std::int64_t nn = std::int64_t(n) * n;
    const std::int64_t outer = Impl::soap_product(size, 0, d), inner = Impl::soap_product(size, d + 1, size.size());
    const Scalar* q = basis_data() + c.factor[d];
    const char tq = forward ? 'T' : 'N';
    const ProductPrecision precision = m_options.product_precision;
    if (inner == 1) {  // X is [outer, n]: X Q (forward) or X Q^T (backward)
      m_launches +=
          gemm_strided_batched(space, precision, m_rounded, 'N', forward ? 'N' : 'T', int(outer), n, n, Scalar(1), in,
                               elements, q, nn, Scalar(0), out, elements, int(count), threads, by_work);
    } else if (outer == 1) {
      m_launches += gemm_strided_batched(space, precision, m_rounded, tq, 'N', n, int(inner), n, Scalar(1), q, nn, in,
                                         elements, Scalar(0), out, elements, int(count), threads, by_work);
    } else if (count <= outer) {
      for (std::int64_t i = 0; i < count; ++i)
        m_launches += gemm_strided_batched(space, precision, m_rounded, tq, 'N', n, int(inner), n, Scalar(1),
                                           q + i * nn, 0, in + i * elements, n * inner, Scalar(0), out + i * elements,
                                           n * inner, int(outer), threads, by_work);
    } else {
      for (std::int64_t a = 0; a < outer; ++a)
        m_launches += gemm_strided_batched(space, precision, m_rounded, tq, 'N', n, int(inner), n, Scalar(1), q, nn,
                                           in + a * n * inner, elements, Scalar(0), out + a * n * inner, elements,
                                           int(count), threads, by_work);
    }
    std::swap(in, out);
  }
  if (in != from) {
    const Scalar* result = in;
    Kokkos::parallel_for(
        "Lather::soap::copy_rotated", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count * elements),
        KOKKOS_LAMBDA(std::int64_t e) { from[e] = result[e]; });
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::accumulate_factors(const ExecutionSpace& space, const ShapeClass& c, const Scalar* g,
                                                      Scalar beta) {
  // GG = beta GG + (1 - beta) sum_a X[a] X[a]^T over each block's [outer, n, inner] view, every
  // block of the class in one batched product (per slice a when inner > 1 and outer > 1).
  using ::lather::Impl::gemm_strided_batched;
  const auto& size = c.size;
  const std::int64_t count = std::int64_t(c.blocks.size()), elements = c.elements;
  const int threads = m_host_threads;                // on a host backend (gemm_strided_batched)
  const bool by_work = m_options.host_threads == 0;  // automatic: as many as the flops pay for
  for (std::size_t d = 0; d < size.size(); ++d) {
    if (c.factor[d] < 0) continue;
    const int n = int(size[d]);
    const std::int64_t nn = std::int64_t(n) * n;
    const std::int64_t outer = Impl::soap_product(size, 0, d), inner = Impl::soap_product(size, d + 1, size.size());
    Scalar* factor = factor_data() + c.factor[d];
    const ProductPrecision precision = m_options.product_precision;
    if (inner == 1) {
      m_launches += gemm_strided_batched(space, precision, m_rounded, 'T', 'N', n, n, int(outer), Scalar(1) - beta, g,
                                         elements, g, elements, beta, factor, nn, int(count), threads, by_work);
    } else {
      for (std::int64_t a = 0; a < outer; ++a) {
        const Scalar* x = g + a * n * inner;
        m_launches +=
            gemm_strided_batched(space, precision, m_rounded, 'N', 'T', n, n, int(inner), Scalar(1) - beta, x, elements,
                                 x, elements, a == 0 ? beta : Scalar(1), factor, nn, int(count), threads, by_work);
      }
    }
  }
}

template <class ExecutionSpace, class Scalar>
void Soap<ExecutionSpace, Scalar>::refresh_bases(const ExecutionSpace& space, bool first) {
  ::lather::Impl::fault_point("soap.refresh");
  if (m_local_factors[std::size_t(m_group.rank())] == 0) return;
  ::lather::Impl::ScopedRegion region(first ? "Lather::soap::eigh" : "Lather::soap::power_qr");
  // Quantized: m_matrix_work holds the factors (dequantized, updated); the old bases are
  // dequantized into it after the factors' copy, and the new ones quantized from it.
  typename Buffer::HostMirror factors, bases;
  if (quantized()) {
    factors = Kokkos::create_mirror(m_matrix_work);  // a copy even where the mirror would alias
    Kokkos::deep_copy(space, factors, m_matrix_work);
    if (!first) load_matrices(space, true);
    bases = Kokkos::create_mirror(m_matrix_work);
    Kokkos::deep_copy(space, bases, m_matrix_work);
  } else {
    factors = Kokkos::create_mirror_view(m_factors);
    bases = Kokkos::create_mirror_view(m_bases);
    Kokkos::deep_copy(space, factors, m_factors);
    Kokkos::deep_copy(space, bases, m_bases);
  }
  ::lather::Impl::fence(space, "Lather::soap: factors on the host");
  // This rank's factors, class by class, dimension by dimension, block by block, shared out among
  // the refresh's host threads; each factor's LAPACK calls on one BLAS thread, however many
  // threads there are, so that the bases do not depend on their number (OpenBLAS rounds some of
  // dsyevd's products otherwise on 2 threads than on 1).
  struct Factor {
    std::size_t start;
    int n;
  };
  std::vector<Factor> listed;
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    for (std::size_t d = 0; d < c.size.size(); ++d) {
      if (c.factor[d] < 0) continue;
      const int n = int(c.size[d]);
      const std::size_t nn = std::size_t(n) * n;
      for (std::size_t i = 0; i < c.blocks.size(); ++i) listed.push_back({std::size_t(c.factor[d]) + i * nn, n});
    }
  }
  std::vector<std::vector<int>> orders(first ? 0 : listed.size());
  const auto slots = static_cast<std::size_t>(m_host_threads);
  std::vector<std::vector<double>> f(slots), q(slots);  // each thread's factor and basis
  {
    const ScopedHostBlasThreads one_blas_thread(1);
    ::lather::Impl::for_each_on_host_threads(space, m_host_threads, listed.size(), [&](int thread, std::size_t k) {
      const std::size_t start = listed[k].start, nn = std::size_t(listed[k].n) * std::size_t(listed[k].n);
      auto& own_f = f[std::size_t(thread)];
      auto& own_q = q[std::size_t(thread)];
      own_f.assign(factors.data() + start, factors.data() + start + nn);
      own_q.assign(bases.data() + start, bases.data() + start + nn);
      if (first)
        Impl::soap_eigenbasis(listed[k].n, own_f.data(), own_q.data());
      else
        Impl::soap_power_qr(listed[k].n, own_f.data(), own_q.data(), orders[k]);
      for (std::size_t e = 0; e < nn; ++e) bases(start + e) = Scalar(own_q[e]);
    });
  }
  std::vector<int> all_orders;  // every factor's column order, in that order
  for (const auto& order : orders) all_orders.insert(all_orders.end(), order.begin(), order.end());
  if (quantized()) {
    Kokkos::deep_copy(space, m_matrix_work, bases);
    store_matrices(space, true);
    ::lather::Impl::fence(space, "Lather::soap: bases quantized");  // `bases` is freed on return
  } else {
    Kokkos::deep_copy(space, m_bases, bases);
  }
  if (first) return;
  // The estimated eigenvalues reorder the columns; exp_avg_sq follows along the same dimension.
  Kokkos::View<int*, memory_space> device_orders("Lather::soap::orders", all_orders.size());
  {
    Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(all_orders.data(),
                                                                                              all_orders.size());
    Kokkos::deep_copy(space, device_orders, host);
  }
  std::int64_t cursor = 0;
  for (std::size_t ci : m_own_classes) {
    const auto& c = m_classes[ci];
    for (std::size_t d = 0; d < c.size.size(); ++d) {
      if (c.factor[d] < 0) continue;
      const std::int64_t n = c.size[d], inner = Impl::soap_product(c.size, d + 1, c.size.size());
      for (std::size_t i = 0; i < c.blocks.size(); ++i, cursor += n) {
        bool identity = true;
        for (std::int64_t j = 0; j < n; ++j) identity = identity && all_orders[std::size_t(cursor + j)] == j;
        if (identity) continue;
        Scalar* v = m_exp_avg_sq.data() + m_blocks[c.blocks[i]].local;
        Scalar* tmp = m_scratch_a.data();
        const int* perm = device_orders.data() + cursor;
        const std::int64_t elements = c.elements;
        Kokkos::parallel_for(
            "Lather::soap::permute_exp_avg_sq", Kokkos::RangePolicy<ExecutionSpace>(space, 0, elements),
            KOKKOS_LAMBDA(std::int64_t e) {
              const std::int64_t j = (e / inner) % n, base = e - j * inner;
              tmp[e] = v[base + std::int64_t(perm[j]) * inner];
            });
        Kokkos::parallel_for(
            "Lather::soap::copy_exp_avg_sq", Kokkos::RangePolicy<ExecutionSpace>(space, 0, elements),
            KOKKOS_LAMBDA(std::int64_t e) { v[e] = tmp[e]; });
      }
    }
  }
  // device_orders is freed here: keep it alive until the kernels ran.
  ::lather::Impl::fence(space, "Lather::soap: permutations done");
}

}  // namespace lather::optim
