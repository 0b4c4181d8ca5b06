#pragma once
// Exact Adasum of one fused buffer, per tensor, by Horovod's vector-halving distance-doubling
// (VHDD) scheme (horovod/common/ops/adasum/adasum.h, FusedAllreduce), extended to group sizes
// that are not powers of two by folding the extra ranks in first.
//
// Adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b, per tensor, where a side whose
// squared norm is below sqrt(DBL_MIN) gets coefficient 1 (Horovod's rule: a zero vector adds
// nothing and takes nothing away). Dot products and norms are accumulated in double; the
// combination is computed in double and rounded once to the tensor's type.
//
// With n ranks and P the largest power of two <= n:
//   1. fold: rank r >= P sends its buffer to r - P, which replaces its own by Adasum(own, received);
//   2. VHDD over ranks 0..P-1: at level l = 1, 2, ..., P/2 rank r exchanges half of its current
//      segment with r XOR l (the lower rank keeps the first half), both combine the half they kept
//      with the partner's copy of it, and the partial dot products and norms of every tensor are
//      summed (MPI_Allreduce) over the 2l ranks whose segments together form the whole buffer;
//   3. all-gather in reverse order of levels, after which ranks 0..P-1 hold the whole result;
//   4. rank r < n - P sends the result to r + P.
// The result equals the pairwise tree on the folded vectors: level by level, v'(i) = Adasum(
// v(2i), v(2i+1)), with the fold v(j) = Adasum(x(j), x(j + P)) for j < n - P, v(j) = x(j) else.
//
// Small buckets, where latency rules, take a shortcut with the same definition: one
// MPI_Allgatherv of every rank's bucket, then that same tree computed by every rank locally
// (adasum_tree_allgather). One collective instead of 3 log2(P) (+2).

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/impl/kernels.hpp>
#include <lather/comm/impl/layout.hpp>
#include <lather/comm/transport.hpp>

#include <lather/comm/group.hpp>

#include <cfloat>
#include <cmath>
#include <vector>

namespace lather::comm::Impl {

/// Horovod's rule for a side's coefficient; `norm_squared` of that side, `dot` of the pair.
inline double adasum_coefficient(double dot, double norm_squared) {
  static const double sqrt_double_min = std::sqrt(DBL_MIN);
  return norm_squared >= sqrt_double_min ? 1.0 - dot / norm_squared * 0.5 : 1.0;
}

template <class ExecutionSpace, class S>
struct AdasumWorkspace {
  using memory_space = typename ExecutionSpace::memory_space;
  int size = 1, rank = 0;
  /// levels[k]: the 2^(k+1) ranks that share rank >> (k+1), among ranks < P (not a member for others).
  const std::vector<Group>* levels = nullptr;
  Transport<ExecutionSpace, S>* transport = nullptr;
  ItemPlan<memory_space>* items = nullptr;
  Vector<S, memory_space> partner;   ///< receives the partner's half (the whole buffer when folding)
  Vector<S, memory_space> gathered;  ///< every rank's bucket, for the small-bucket shortcut
  long* scalar_collectives = nullptr;
};

/// Largest power of two <= n.
inline int power_of_two_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/// Elements the partner buffer must hold for a bucket of `elements`.
inline std::int64_t adasum_partner_elements(int size, std::int64_t elements) {
  return power_of_two_floor(size) < size ? elements : (elements + 1) / 2;
}

/// a := Adasum(a, b) per tensor (counts[t] consecutive elements of a and b belong to tensor t).
/// The dot products and norms are summed over `level` when it is given.
/// `a_is_left`: a holds the lower rank's side (norms are exchanged as [dot, |left|^2, |right|^2]).
template <class ExecutionSpace, class S>
void adasum_combine(const ExecutionSpace& space, AdasumWorkspace<ExecutionSpace, S>& work,
                    const Vector<S, typename ExecutionSpace::memory_space>& a,
                    const Vector<S, typename ExecutionSpace::memory_space>& b, const std::vector<std::int64_t>& counts,
                    const Group* level, bool a_is_left) {
  using memory_space = typename ExecutionSpace::memory_space;
  auto& items = *work.items;
  items.build(space, counts);
  const Vector<const S, memory_space> a_in = a, b_in = b;
  if (items.size() > 0) dot_norm_partials(space, a_in, b_in, items.ranges(), items.size(), items.partials());
  const auto sums = items.per_tensor(space);
  const std::size_t tensors = counts.size();
  std::vector<double> packed(3 * tensors);
  for (std::size_t t = 0; t < tensors; ++t) {
    packed[3 * t] = sums[t].dot;
    packed[3 * t + 1] = a_is_left ? sums[t].aa : sums[t].bb;
    packed[3 * t + 2] = a_is_left ? sums[t].bb : sums[t].aa;
  }
  if (level && tensors > 0) {
    level->allreduce(packed, Combine::sum);
    ++*work.scalar_collectives;
  }
  std::vector<double> coefficient_a(tensors), coefficient_b(tensors);
  for (std::size_t t = 0; t < tensors; ++t) {
    const double dot = packed[3 * t];
    const double left = adasum_coefficient(dot, packed[3 * t + 1]);
    const double right = adasum_coefficient(dot, packed[3 * t + 2]);
    coefficient_a[t] = a_is_left ? left : right;
    coefficient_b[t] = a_is_left ? right : left;
  }
  if (items.size() == 0) return;
  items.set_coefficients(space, coefficient_a, coefficient_b);
  combine_items(space, a, b_in, items.ranges(), items.coefficients(), items.size());
}

/// Splits per-tensor counts of a segment after its first `first_count` elements.
inline void split_counts(const std::vector<std::int64_t>& counts, std::int64_t first_count,
                         std::vector<std::int64_t>& first, std::vector<std::int64_t>& second) {
  first.resize(counts.size());
  second.resize(counts.size());
  std::int64_t position = 0;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const std::int64_t in_first = std::min(counts[t], std::max<std::int64_t>(0, first_count - position));
    first[t] = in_first;
    second[t] = counts[t] - in_first;
    position += counts[t];
  }
}

/// data := Adasum over the group of data by gathering every rank's data and computing the tree
/// (fold, then pairs) on every rank. `work.gathered` holds n * data.extent(0) elements.
template <class ExecutionSpace, class S>
void adasum_tree_allgather(const ExecutionSpace& space, AdasumWorkspace<ExecutionSpace, S>& work,
                           const Vector<S, typename ExecutionSpace::memory_space>& data,
                           const std::vector<std::int64_t>& counts) {
  using memory_space = typename ExecutionSpace::memory_space;
  const int n = work.size;
  const std::int64_t elements = std::int64_t(data.extent(0));
  auto slot = [&](int r) {
    return Vector<S, memory_space>(
        Kokkos::subview(work.gathered, std::make_pair(std::size_t(r * elements), std::size_t((r + 1) * elements))));
  };
  const std::vector<std::size_t> sizes(n, std::size_t(elements));
  work.transport->allgatherv(
      space, data, Kokkos::subview(work.gathered, std::make_pair(std::size_t(0), std::size_t(n * elements))), sizes);
  const int p = power_of_two_floor(n);
  for (int j = 0; j + p < n; ++j) adasum_combine(space, work, slot(j), slot(j + p), counts, nullptr, true);
  for (int stride = 1; stride < p; stride *= 2)
    for (int i = 0; i + stride < p; i += 2 * stride)
      adasum_combine(space, work, slot(i), slot(i + stride), counts, nullptr, true);
  Kokkos::deep_copy(space, data, slot(0));
}

/// data := Adasum over the group of data, per tensor (counts: elements of each tensor, in order).
template <class ExecutionSpace, class S>
void adasum_allreduce(const ExecutionSpace& space, AdasumWorkspace<ExecutionSpace, S>& work,
                      const Vector<S, typename ExecutionSpace::memory_space>& data, std::vector<std::int64_t> counts) {
  constexpr int fold_tag = 0x1a50, result_tag = 0x1a51, level_tag = 0x1a60;
  const int n = work.size, rank = work.rank;
  if (n == 1) return;
  const int p = power_of_two_floor(n);
  const std::int64_t elements = std::int64_t(data.extent(0));
  auto& transport = *work.transport;
  auto range = [](std::int64_t begin, std::int64_t count) {
    return std::make_pair(std::size_t(begin), std::size_t(begin + count));
  };

  // 1. Fold the ranks beyond the largest power of two into their partner r - P.
  if (rank >= p) {
    transport.send(space, data, rank - p, fold_tag);
    transport.receive(space, data, rank - p, result_tag);
    return;
  }
  if (rank < n - p) {
    const auto received = Kokkos::subview(work.partner, range(0, elements));
    transport.receive(space, received, rank + p, fold_tag);
    adasum_combine(space, work, data, Vector<S, typename ExecutionSpace::memory_space>(received), counts, nullptr,
                   true);
  }

  // 2. Reduce-scatter by vector halving, distance doubling.
  std::int64_t offset = 0, count = elements;
  std::vector<std::vector<std::int64_t>> neighbour_counts;
  std::vector<std::int64_t> kept, given;
  int level_index = 0;
  for (int level = 1; level < p; level <<= 1, ++level_index) {
    const int neighbour = rank ^ level;
    const bool upper = (rank & level) != 0;
    const std::int64_t first_half = count / 2, second_half = count - first_half;
    std::int64_t keep_offset, keep_count, give_offset, give_count;
    if (upper) {
      split_counts(counts, first_half, given, kept);
      keep_offset = offset + first_half, keep_count = second_half;
      give_offset = offset, give_count = first_half;
    } else {
      split_counts(counts, first_half, kept, given);
      keep_offset = offset, keep_count = first_half;
      give_offset = offset + first_half, give_count = second_half;
    }
    neighbour_counts.push_back(given);
    counts = kept;
    const auto incoming = Kokkos::subview(work.partner, range(0, keep_count));
    transport.exchange(space, Kokkos::subview(data, range(give_offset, give_count)), incoming, neighbour,
                       level_tag + level_index);
    adasum_combine(
        space, work,
        Vector<S, typename ExecutionSpace::memory_space>(Kokkos::subview(data, range(keep_offset, keep_count))),
        Vector<S, typename ExecutionSpace::memory_space>(incoming), counts, &(*work.levels)[level_index], !upper);
    offset = keep_offset, count = keep_count;
  }

  // 3. All-gather in reverse: every exchange doubles the segment a rank holds.
  for (int level = p >> 1; level > 0; level >>= 1) {
    --level_index;
    const int neighbour = rank ^ level;
    std::int64_t neighbour_count = 0;
    for (auto c : neighbour_counts[level_index]) neighbour_count += c;
    const bool upper = (rank & level) != 0;
    const std::int64_t neighbour_offset = upper ? offset - neighbour_count : offset + count;
    transport.exchange(space, Kokkos::subview(data, range(offset, count)),
                       Kokkos::subview(data, range(neighbour_offset, neighbour_count)), neighbour,
                       level_tag + level_index);
    offset = std::min(offset, neighbour_offset);
    count += neighbour_count;
  }

  // 4. Hand the result to the folded rank.
  if (rank < n - p) transport.send(space, data, rank + p, result_tag);
}

}  // namespace lather::comm::Impl
