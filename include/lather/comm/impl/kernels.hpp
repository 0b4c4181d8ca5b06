#pragma once
// Kernels of the collectives: scaling, per-tensor dot products and norms over "items" (pieces of
// at most a few thousand elements of one tensor, so one team per item balances any mix of tensor
// sizes), the Adasum combination, and the 16-bit wire encodings. Free functions only: lambdas in
// them are safe for device backends.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/wire_precision.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>

namespace lather::comm::Impl {

/// Sum of a.b, a.a and b.b in double.
struct DotNorms {
  double dot = 0, aa = 0, bb = 0;
  DotNorms() = default;
  KOKKOS_INLINE_FUNCTION DotNorms(double d, double a, double b) : dot(d), aa(a), bb(b) {}
  KOKKOS_INLINE_FUNCTION DotNorms& operator+=(const DotNorms& other) {
    dot += other.dot;
    aa += other.aa;
    bb += other.bb;
    return *this;
  }
#if KOKKOS_VERSION < 40000
  // Kokkos 3 reduces custom types through volatile references on some backends.
  KOKKOS_INLINE_FUNCTION void operator+=(const volatile DotNorms& other) volatile {
    dot += other.dot;
    aa += other.aa;
    bb += other.bb;
  }
#endif
};

}  // namespace lather::comm::Impl

namespace Kokkos {
template <>
struct reduction_identity<lather::comm::Impl::DotNorms> {
  KOKKOS_FORCEINLINE_FUNCTION static lather::comm::Impl::DotNorms sum() {
    return lather::comm::Impl::DotNorms(0, 0, 0);
  }
};
}  // namespace Kokkos

namespace lather::comm::Impl {

template <class T, class MemorySpace>
using Vector = Kokkos::View<T*, MemorySpace>;
/// items(k, 0) = first element, items(k, 1) = element count, relative to the Views a kernel gets.
template <class MemorySpace>
using ItemRanges = Kokkos::View<std::int64_t* [2], Kokkos::LayoutRight, MemorySpace>;
/// coefficients(k, 0) multiplies a, coefficients(k, 1) multiplies b.
template <class MemorySpace>
using ItemCoefficients = Kokkos::View<double* [2], Kokkos::LayoutRight, MemorySpace>;

/// data(i) *= factor, in the tensor's type (the factor rounded to it: within one unit in the last
/// place of the exact product, and a single vectorisable multiplication per element).
template <class ExecutionSpace, class S, class MemorySpace>
void scale(const ExecutionSpace& space, const Vector<S, MemorySpace>& data, double factor) {
  if (factor == 1.0) return;
  const S f = S(factor);
  S* const base = data.data();
  ::lather::Impl::parallel_for_runs(
      "Lather::comm::scale", space, std::int64_t(data.extent(0)), KOKKOS_LAMBDA(std::int64_t begin, std::int64_t end) {
        S* KOKKOS_RESTRICT x = base + begin;
        for (std::int64_t i = 0; i < end - begin; ++i) x[i] *= f;
      });
}

/// own(i) = factor * (own(i) + incoming(i)), in the tensor's type (the factor rounded to it, as
/// in scale; no multiplication when it is 1): a pairwise sum and the mean's division in one pass.
template <class ExecutionSpace, class S, class MemorySpace>
void add_scaled(const ExecutionSpace& space, const Vector<S, MemorySpace>& own,
                const Vector<const S, MemorySpace>& incoming, double factor) {
  const S f = S(factor);
  const bool plain = factor == 1.0;
  S* const to = own.data();
  const S* const from = incoming.data();
  ::lather::Impl::parallel_for_runs(
      "Lather::comm::add_scaled", space, std::int64_t(own.extent(0)),
      KOKKOS_LAMBDA(std::int64_t begin, std::int64_t end) {
        S* KOKKOS_RESTRICT x = to + begin;
        const S* KOKKOS_RESTRICT y = from + begin;
        if (plain)
          for (std::int64_t i = 0; i < end - begin; ++i) x[i] = x[i] + y[i];
        else
          for (std::int64_t i = 0; i < end - begin; ++i) x[i] = (x[i] + y[i]) * f;
      });
}

/// The number of NaN and +-Inf values in data (core's count over runs of elements).
template <class ExecutionSpace, class S, class MemorySpace>
long count_non_finite(const ExecutionSpace& space, const Vector<const S, MemorySpace>& data) {
  return long(::lather::Impl::count_non_finite(space, data.data(), std::int64_t(data.extent(0))));
}

/// to(i) = factor * from(i) (the unpacking of a fused bucket, with the mean's division folded in).
template <class ExecutionSpace, class S, class MemorySpace>
void copy_scaled(const ExecutionSpace& space, const Vector<const S, MemorySpace>& from,
                 const Vector<S, MemorySpace>& to, double factor) {
  if (factor == 1.0) {
    Kokkos::deep_copy(space, to, from);
    return;
  }
  const S f = S(factor);
  Kokkos::parallel_for(
      "Lather::comm::copy_scaled", Kokkos::RangePolicy<ExecutionSpace>(space, 0, to.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { to(i) = from(i) * f; });
}

/// accumulator(i) = accumulator(i) + factor * increment(i), or = factor * increment(i) when
/// `overwrite` (the first micro-batch of an accumulation).
template <class ExecutionSpace, class S, class MemorySpace>
void accumulate_scaled(const ExecutionSpace& space, const Vector<S, MemorySpace>& accumulator,
                       const Vector<const S, MemorySpace>& increment, double factor, bool overwrite) {
  Kokkos::parallel_for(
      "Lather::comm::accumulate_scaled", Kokkos::RangePolicy<ExecutionSpace>(space, 0, accumulator.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) {
        const double add = factor * double(increment(i));
        accumulator(i) = overwrite ? S(add) : S(double(accumulator(i)) + add);
      });
}

/// partials(k) = {sum a.b, sum a.a, sum b.b} over item k, accumulated in double.
template <class ExecutionSpace, class S, class MemorySpace>
void dot_norm_partials(const ExecutionSpace& space, const Vector<const S, MemorySpace>& a,
                       const Vector<const S, MemorySpace>& b, const ItemRanges<MemorySpace>& items, int count,
                       const Vector<DotNorms, MemorySpace>& partials) {
  using policy = Kokkos::TeamPolicy<ExecutionSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "Lather::comm::dot_norm_partials", policy(space, count, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const int k = team.league_rank();
        const std::int64_t begin = items(k, 0), length = items(k, 1);
        DotNorms sums;
        // Four elements per step: four independent products per accumulation shorten the
        // dependency chains of the double sums (a few times faster on CPUs), and the order stays
        // fixed.
        const std::int64_t groups = (length + 3) / 4;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, groups),
            [&](std::int64_t g, DotNorms& local) {
              const std::int64_t first = begin + 4 * g, last = begin + length;
              double dot = 0, aa = 0, bb = 0;
              for (std::int64_t e = first; e < first + 4 && e < last; ++e) {
                const double x = double(a(e)), y = double(b(e));
                dot += x * y;
                aa += x * x;
                bb += y * y;
              }
              local.dot += dot;
              local.aa += aa;
              local.bb += bb;
            },
            Kokkos::Sum<DotNorms>(sums));
        Kokkos::single(Kokkos::PerTeam(team), [&]() { partials(k) = sums; });
      });
}

/// a(i) = coefficients(k, 0) * a(i) + coefficients(k, 1) * b(i) over every item k, in double.
template <class ExecutionSpace, class S, class MemorySpace>
void combine_items(const ExecutionSpace& space, const Vector<S, MemorySpace>& a, const Vector<const S, MemorySpace>& b,
                   const ItemRanges<MemorySpace>& items, const ItemCoefficients<MemorySpace>& coefficients, int count) {
  using policy = Kokkos::TeamPolicy<ExecutionSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "Lather::comm::combine_items", policy(space, count, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const int k = team.league_rank();
        const std::int64_t begin = items(k, 0), length = items(k, 1);
        const double ca = coefficients(k, 0), cb = coefficients(k, 1);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, length), [&](std::int64_t j) {
          a(begin + j) = S(ca * double(a(begin + j)) + cb * double(b(begin + j)));
        });
      });
}

/// a(i) *= coefficients(k, 0) over every item k, in double.
template <class ExecutionSpace, class S, class MemorySpace>
void scale_items(const ExecutionSpace& space, const Vector<S, MemorySpace>& a, const ItemRanges<MemorySpace>& items,
                 const ItemCoefficients<MemorySpace>& coefficients, int count) {
  using policy = Kokkos::TeamPolicy<ExecutionSpace>;
  using member = typename policy::member_type;
  Kokkos::parallel_for(
      "Lather::comm::scale_items", policy(space, count, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const int k = team.league_rank();
        const std::int64_t begin = items(k, 0), length = items(k, 1);
        const double c = coefficients(k, 0);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, length),
                             [&](std::int64_t j) { a(begin + j) = S(c * double(a(begin + j))); });
      });
}

/// wire(i) = 16-bit encoding of float(data(i)) for i < data.extent(0), 0 up to wire.extent(0).
template <class ExecutionSpace, class S, class MemorySpace>
void encode16(const ExecutionSpace& space, const Vector<const S, MemorySpace>& data,
              const Vector<std::uint16_t, MemorySpace>& wire, bool bfloat16) {
  const std::size_t length = data.extent(0);
  Kokkos::parallel_for(
      "Lather::comm::encode16", Kokkos::RangePolicy<ExecutionSpace>(space, 0, wire.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) {
        wire(i) = i < length ? encode_wire16(float(data(i)), bfloat16) : std::uint16_t(0);
      });
}

/// data(i) = decode(wire(i)) for i < data.extent(0).
template <class ExecutionSpace, class S, class MemorySpace>
void decode16(const ExecutionSpace& space, const Vector<const std::uint16_t, MemorySpace>& wire,
              const Vector<S, MemorySpace>& data, bool bfloat16) {
  Kokkos::parallel_for(
      "Lather::comm::decode16", Kokkos::RangePolicy<ExecutionSpace>(space, 0, data.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { data(i) = S(decode_wire16(wire(i), bfloat16)); });
}

/// The reduce step of the 16-bit reduce-scatter: received holds `ranks` segments of `segment`
/// encoded values (segment j from group rank j); own(i) = encode(factor * sum_j decode(...)),
/// summed in float in rank order, rounded to 16 bits once.
template <class ExecutionSpace, class MemorySpace>
void reduce_segments16(const ExecutionSpace& space, const Vector<const std::uint16_t, MemorySpace>& received, int ranks,
                       std::size_t segment, float factor, const Vector<std::uint16_t, MemorySpace>& own,
                       bool bfloat16) {
  Kokkos::parallel_for(
      "Lather::comm::reduce_segments16", Kokkos::RangePolicy<ExecutionSpace>(space, 0, segment),
      KOKKOS_LAMBDA(std::size_t i) {
        float total = 0.0f;
        for (int j = 0; j < ranks; ++j) total += decode_wire16(received(std::size_t(j) * segment + i), bfloat16);
        own(i) = encode_wire16(total * factor, bfloat16);
      });
}

}  // namespace lather::comm::Impl
