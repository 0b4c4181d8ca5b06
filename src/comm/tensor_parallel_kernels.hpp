#pragma once
// Kernels of the tensor-parallel layers (free functions: their lambdas are device-safe); products
// go through Lather's one GEMM call.

#include <lather/core/kokkos_compat.hpp>

#include <lather/core/impl/gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace lather::comm::Impl {

namespace kmath = ::lather::Impl::kmath;

template <class T, class MemorySpace>
using Rows = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;

using ::lather::Impl::gemm;

/// sums(j) = sum_i m(i, j) (added to sums(j) when `accumulate`), accumulated in S: a bias gradient
/// sums one batch of rows, where float's rounding is far below the gradient's own noise.
template <class ExecutionSpace, class S, class MemorySpace>
void column_sums(const ExecutionSpace& space, const Rows<const S, MemorySpace>& m,
                 const Kokkos::View<S*, MemorySpace>& sums, bool accumulate) {
  const int rows = int(m.extent(0));
  if constexpr (::lather::Impl::runs_on_host<ExecutionSpace>) {
    // On the host a column at a time strides through memory (it was 5% of a transformer step):
    // rows are walked in order over a strip of columns instead, which vectorises and adds in the
    // same order, so the sums are the same to the bit.
    const int columns = int(m.extent(1));
    Kokkos::parallel_for(
        "Lather::comm::column_sums", Kokkos::RangePolicy<ExecutionSpace>(space, 0, (columns + 255) / 256),
        KOKKOS_LAMBDA(int strip) {
          constexpr int width = 256;
          const int first = strip * width, count = columns - first < width ? columns - first : width;
          S total[width];
          for (int j = 0; j < count; ++j) total[j] = 0;
          for (int i = 0; i < rows; ++i) {
            const S* row = &m(i, first);
            for (int j = 0; j < count; ++j) total[j] += row[j];
          }
          for (int j = 0; j < count; ++j)
            sums(first + j) = accumulate ? S(sums(first + j) + total[j]) : total[j];
        });
  } else {
    Kokkos::parallel_for(
        "Lather::comm::column_sums", Kokkos::RangePolicy<ExecutionSpace>(space, 0, m.extent(1)),
        KOKKOS_LAMBDA(std::size_t j) {
          S total = 0;
          for (int i = 0; i < rows; ++i) total += m(i, j);
          sums(j) = accumulate ? S(sums(j) + total) : total;
        });
  }
}

/// y(i, j) += bias(j).
template <class ExecutionSpace, class S, class MemorySpace>
void add_bias(const ExecutionSpace& space, const Rows<S, MemorySpace>& y,
              const Kokkos::View<const S*, MemorySpace>& bias) {
  Kokkos::parallel_for(
      "Lather::comm::add_bias",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(
          space, {std::int64_t(0), std::int64_t(0)}, {std::int64_t(y.extent(0)), std::int64_t(y.extent(1))}),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t j) { y(i, j) += bias(j); });
}

/// gathered(i, begin_d + j) = packed[offset_d + i * count_d + j] for every shard d: the shards'
/// row-major blocks, as MPI_Allgatherv lays them one after the other, placed side by side.
template <class ExecutionSpace, class S, class MemorySpace>
void place_blocks(const ExecutionSpace& space, const Kokkos::View<const S*, MemorySpace>& packed,
                  const Kokkos::View<const int*, MemorySpace>& column_of_block_start, int shards,
                  const Rows<S, MemorySpace>& gathered) {
  const int batch = int(gathered.extent(0)), features = int(gathered.extent(1));
  Kokkos::parallel_for(
      "Lather::comm::place_blocks",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(
          space, {std::int64_t(0), std::int64_t(0)}, {std::int64_t(batch), std::int64_t(features)}),
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t col) {
        const int i = int(row), column = int(col);
        int d = 0;  // the shard owning `column`: the last block starting at or before it
        while (d + 1 < shards && column_of_block_start(d + 1) <= column) ++d;
        const int begin = column_of_block_start(d);
        const int count = column_of_block_start(d + 1) - begin;
        gathered(i, column) = packed(std::size_t(begin) * batch + std::size_t(i) * count + (column - begin));
      });
}

/// row_max(i) = max_j logits(i, j) (-inf for a shard without columns).
template <class ExecutionSpace, class S, class MemorySpace>
void row_max(const ExecutionSpace& space, const Rows<const S, MemorySpace>& logits,
             const Kokkos::View<double*, MemorySpace>& maxima) {
  const int columns = int(logits.extent(1));
  const double lowest = -std::numeric_limits<double>::infinity();
  Kokkos::parallel_for(
      "Lather::comm::row_max", Kokkos::RangePolicy<ExecutionSpace>(space, 0, logits.extent(0)),
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
      "Lather::comm::local_sums", Kokkos::RangePolicy<ExecutionSpace>(space, 0, batch),
      KOKKOS_LAMBDA(std::size_t i) {
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
      "Lather::comm::finish_cross_entropy", Kokkos::RangePolicy<ExecutionSpace>(space, 0, batch),
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
      "Lather::comm::sum_values", Kokkos::RangePolicy<ExecutionSpace>(space, 0, values.extent(0)),
      KOKKOS_LAMBDA(std::size_t i, double& partial) { partial += double(values(i)); }, total);
  return total;
}

}  // namespace lather::comm::Impl
