#pragma once
// Kernels of the vocabulary-parallel cross-entropy (free functions: their lambdas are
// device-safe).

#include <lather/core/hash.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace lather::nn::Impl {

namespace kmath = ::lather::Impl::kmath;
using ::lather::Impl::fence;
using ::lather::Impl::Fnv1a;
using ::lather::Impl::ScopedRegion;

template <class T, class MemorySpace>
using Rows = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;

/// row_max(i) = max_j logits(i, j) (-inf for a shard without columns).
template <class ExecutionSpace, class S, class MemorySpace>
void row_max(const ExecutionSpace& space, const Rows<const S, MemorySpace>& logits,
             const Kokkos::View<double*, MemorySpace>& maxima) {
  const int columns = int(logits.extent(1));
  const double lowest = -std::numeric_limits<double>::infinity();
  Kokkos::parallel_for(
      "Lather::nn::row_max", Kokkos::RangePolicy<ExecutionSpace>(space, 0, logits.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) {
        double m = lowest;
        for (int j = 0; j < columns; ++j) m = double(logits(i, j)) > m ? double(logits(i, j)) : m;
        maxima(i) = m;
      });
}

/// sums(i) = sum_j exp(logits(i, j) - max(i)); sums(batch + i) = the target logit if this shard
/// owns label(i), else 0. Counts labels outside [0, vocab) in `invalid`.
template <class ExecutionSpace, class S, class MemorySpace>
void local_sums(const ExecutionSpace& space, const Rows<const S, MemorySpace>& logits,
                const Kokkos::View<const int*, MemorySpace>& labels, int begin,
                const Kokkos::View<const double*, MemorySpace>& maxima,
                const Kokkos::View<double*, MemorySpace>& sums) {
  const int columns = int(logits.extent(1));
  const std::size_t batch = logits.extent(0);
  Kokkos::parallel_for(
      "Lather::nn::local_sums", Kokkos::RangePolicy<ExecutionSpace>(space, 0, batch), KOKKOS_LAMBDA(std::size_t i) {
        double total = 0;
        for (int j = 0; j < columns; ++j) total += kmath::exp(double(logits(i, j)) - maxima(i));
        sums(i) = total;
        const int local = labels(i) - begin;
        sums(batch + i) = (local >= 0 && local < columns) ? double(logits(i, local)) : 0.0;
      });
}

/// loss(i) = log Z_i - z_{i,label} (Z_i = sum_j exp z_ij over all shards), zrow(i) = z_loss (log Z_i)^2,
/// correct(i) = 1 when the target logit is the row's largest (ties count), and grad(i, j) =
/// scale * (softmax(i, j) (1 + 2 z_loss log Z_i) - [j owns label(i)]), from the reduced sums.
template <class ExecutionSpace, class S, class MemorySpace>
void finish_cross_entropy(const ExecutionSpace& space, const Rows<const S, MemorySpace>& logits,
                          const Kokkos::View<const int*, MemorySpace>& labels, int begin,
                          const Kokkos::View<const double*, MemorySpace>& maxima,
                          const Kokkos::View<const double*, MemorySpace>& sums, double scale, double z_loss,
                          const Kokkos::View<S*, MemorySpace>& loss, const Kokkos::View<double*, MemorySpace>& zrow,
                          const Kokkos::View<int*, MemorySpace>& correct, const Rows<S, MemorySpace>& grad) {
  const int columns = int(logits.extent(1));
  const std::size_t batch = logits.extent(0);
  Kokkos::parallel_for(
      "Lather::nn::finish_cross_entropy", Kokkos::RangePolicy<ExecutionSpace>(space, 0, batch),
      KOKKOS_LAMBDA(std::size_t i) {
        const double total = sums(i), target = sums(batch + i);
        const double log_z = kmath::log(total) + maxima(i);
        loss(i) = S(log_z - target);
        zrow(i) = z_loss * log_z * log_z;
        correct(i) = target >= maxima(i) ? 1 : 0;
        const double softmax_factor = 1.0 + 2.0 * z_loss * log_z;
        for (int j = 0; j < columns; ++j) {
          const double p = kmath::exp(double(logits(i, j)) - maxima(i)) / total;
          grad(i, j) = S((p * softmax_factor - (j + begin == labels(i) ? 1.0 : 0.0)) * scale);
        }
      });
}

/// sum_i values(i) in double.
template <class ExecutionSpace, class S, class MemorySpace>
double sum_values(const ExecutionSpace& space, const Kokkos::View<const S*, MemorySpace>& values) {
  double total = 0;
  Kokkos::parallel_reduce(
      "Lather::nn::sum_values", Kokkos::RangePolicy<ExecutionSpace>(space, 0, values.extent(0)),
      KOKKOS_LAMBDA(std::size_t i, double& partial) { partial += double(values(i)); }, total);
  return total;
}

}  // namespace lather::nn::Impl
