#pragma once
// Host-side planning of the reductions: which tensors share a fusion bucket, and the "items"
// (pieces of one tensor) the per-tensor dot-product kernels work on.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/impl/kernels.hpp>
#include <lather/comm/impl/support.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace lather::comm::Impl {

/// Tensors [first, last) of the list, packed one after the other.
struct Bucket {
  std::size_t first = 0, last = 0;
  std::int64_t elements = 0;
  bool single() const { return last - first == 1; }
};

/// How a list of tensors travels: consecutive tensors share a bucket while their total stays
/// within the fusion buffer; a tensor larger than the buffer is a bucket of its own.
struct Layout {
  std::vector<std::int64_t> sizes;
  std::vector<Bucket> buckets;
  std::int64_t total = 0;
  std::int64_t largest_bucket = 0;
  std::uint64_t hash = 0;  ///< of the tensor count and every size, in order
};

inline Layout plan_layout(std::vector<std::int64_t> sizes, std::int64_t fusion_elements) {
  Layout layout;
  layout.sizes = std::move(sizes);
  Fnv1a hash;
  hash.add(layout.sizes.size());
  Bucket current;
  for (std::size_t t = 0; t < layout.sizes.size(); ++t) {
    const std::int64_t n = layout.sizes[t];
    hash.add(std::uint64_t(n));
    layout.total += n;
    if (current.last > current.first && current.elements + n > fusion_elements) {
      layout.buckets.push_back(current);
      current = Bucket{t, t, 0};
    }
    if (current.last == current.first) current = Bucket{t, t, 0};
    current.last = t + 1;
    current.elements += n;
  }
  if (current.last > current.first) layout.buckets.push_back(current);
  layout.hash = hash.value();
  for (const auto& bucket : layout.buckets) layout.largest_bucket = std::max(layout.largest_bucket, bucket.elements);
  return layout;
}

/// Items of at most `item_elements` over consecutive per-tensor pieces (counts[t] elements of
/// tensor t, in order), on the host and uploaded to the device, with the per-item results of the
/// dot-product kernel and the per-item coefficients of the combination kernel.
template <class MemorySpace>
class ItemPlan {
 public:
  static constexpr std::int64_t item_elements = std::int64_t(1) << 15;

  template <class ExecutionSpace>
  void build(const ExecutionSpace& space, const std::vector<std::int64_t>& counts) {
    // Host mirrors are rewritten below: earlier asynchronous copies from them must be done.
    fence(space, "Lather::comm::ItemPlan: previous items consumed");
    m_tensor.clear();
    m_begin.clear();
    m_length.clear();
    std::int64_t position = 0;
    for (std::size_t t = 0; t < counts.size(); ++t) {
      for (std::int64_t done = 0; done < counts[t]; done += item_elements) {
        m_tensor.push_back(int(t));
        m_begin.push_back(position + done);
        m_length.push_back(std::min(item_elements, counts[t] - done));
      }
      position += counts[t];
    }
    m_tensors = counts.size();
    const std::size_t n = m_tensor.size();
    if (m_ranges.extent(0) < n) {
      const std::size_t capacity = std::max<std::size_t>(n, 2 * m_ranges.extent(0));
      m_ranges = ItemRanges<MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::ItemPlan::ranges"), capacity);
      m_coefficients = ItemCoefficients<MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::ItemPlan::coefficients"), capacity);
      m_partials = Vector<DotNorms, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::comm::ItemPlan::partials"), capacity);
      m_ranges_host = Kokkos::create_mirror_view(m_ranges);
      m_coefficients_host = Kokkos::create_mirror_view(m_coefficients);
      m_partials_host = Kokkos::create_mirror_view(m_partials);
    }
    for (std::size_t k = 0; k < n; ++k) {
      m_ranges_host(k, 0) = m_begin[k];
      m_ranges_host(k, 1) = m_length[k];
    }
    if (n > 0) Kokkos::deep_copy(space, m_ranges, m_ranges_host);
  }

  int size() const { return int(m_tensor.size()); }
  const ItemRanges<MemorySpace>& ranges() const { return m_ranges; }
  const ItemCoefficients<MemorySpace>& coefficients() const { return m_coefficients; }
  const Vector<DotNorms, MemorySpace>& partials() const { return m_partials; }

  /// Sums of the partials per tensor, in item order (deterministic); waits for the kernel.
  template <class ExecutionSpace>
  std::vector<DotNorms> per_tensor(const ExecutionSpace& space) {
    std::vector<DotNorms> sums(m_tensors);
    if (!m_tensor.empty()) {
      Kokkos::deep_copy(space, m_partials_host, m_partials);
      fence(space, "Lather::comm::ItemPlan: partial sums on the host");
      for (std::size_t k = 0; k < m_tensor.size(); ++k) sums[m_tensor[k]] += m_partials_host(k);
    }
    return sums;
  }

  /// Coefficients per item from coefficients per tensor.
  template <class ExecutionSpace>
  void set_coefficients(const ExecutionSpace& space, const std::vector<double>& a, const std::vector<double>& b) {
    if (m_tensor.empty()) return;
    for (std::size_t k = 0; k < m_tensor.size(); ++k) {
      m_coefficients_host(k, 0) = a[m_tensor[k]];
      m_coefficients_host(k, 1) = b[m_tensor[k]];
    }
    Kokkos::deep_copy(space, m_coefficients, m_coefficients_host);
  }

 private:
  std::size_t m_tensors = 0;
  std::vector<int> m_tensor;
  std::vector<std::int64_t> m_begin, m_length;
  ItemRanges<MemorySpace> m_ranges;
  ItemCoefficients<MemorySpace> m_coefficients;
  Vector<DotNorms, MemorySpace> m_partials;
  typename ItemRanges<MemorySpace>::HostMirror m_ranges_host;
  typename ItemCoefficients<MemorySpace>::HostMirror m_coefficients_host;
  typename Vector<DotNorms, MemorySpace>::HostMirror m_partials_host;
};

}  // namespace lather::comm::Impl
