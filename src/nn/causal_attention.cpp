#include <lather/nn/causal_attention.hpp>

#include "fast_math.hpp"
#include "lane_reductions.hpp"

#include <lather/core/error.hpp>
#include <lather/core/gemm.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace lather::nn {

namespace {
namespace kmath = ::lather::Impl::kmath;
using ::lather::Impl::gemm_strided_batched;

// Packed slots: the forward packs q, k, v into slots 0, 1, 2 and multiplies into slot 3; the
// backward packs q, k, v, dy and reuses each slot once its contents are no longer needed.
constexpr int slot_q = 0, slot_k = 1, slot_v = 2, slot_dy = 3, slots = 4;
}  // namespace

// Not in the unnamed namespace: CUDA cannot launch extended lambdas from functions in one.
namespace Impl {

/// f(row, column, at) for every element of a [batch * time, heads * head_dim] matrix, `at` being
/// its index in the per-head layout [batch, heads, time, head_dim]. On the host a call per row, so
/// that the head_dim-long copies vectorise; on a device a thread per element, the threads of a
/// warp reading a row together.
template <class ExecutionSpace, class F>
void for_each_packed(::lather::Impl::HostBody, const char* label, const ExecutionSpace& space, int batch, int time,
                     int heads, int head_dim, const F& f) {
  const std::int64_t rows = std::int64_t(batch) * time;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(std::int64_t row) {
        const std::int64_t s = row / time, t = row % time;
        for (int h = 0; h < heads; ++h) {
          const std::int64_t at = ((s * heads + h) * time + t) * head_dim, column = std::int64_t(h) * head_dim;
          for (int e = 0; e < head_dim; ++e) f(row, column + e, at + e);
        }
      });
}
template <class ExecutionSpace, class F>
void for_each_packed(::lather::Impl::DeviceBody, const char* label, const ExecutionSpace& space, int batch, int time,
                     int heads, int head_dim, const F& f) {
  const std::int64_t columns = std::int64_t(heads) * head_dim, rows = std::int64_t(batch) * time;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows * columns),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t row = i / columns, s = row / time, t = row % time;
        const std::int64_t column = i % columns, h = column / head_dim, e = column % head_dim;
        f(row, column, ((s * heads + h) * time + t) * head_dim + e);
      });
}
template <class ExecutionSpace, class F>
void for_each_packed(const char* label, const ExecutionSpace& space, int batch, int time, int heads, int head_dim,
                     const F& f) {
  for_each_packed(::lather::Impl::BodyFor<ExecutionSpace>{}, label, space, batch, time, heads, head_dim, f);
}

// The row kernels, a body per backend family (kokkos_compat.hpp's BodyFor): on the host a thread
// per row with plain loops (Serial's team reductions cost more than the row's arithmetic); on a
// device a team per row, its threads reading the row together.

/// Rows of scores in `p` -> causal softmax probabilities, in place (row r is position r % time).
template <class ExecutionSpace, class Buffer>
void causal_softmax(::lather::Impl::HostBody, const ExecutionSpace& space, const Buffer& p, int rows, int time) {
  using Scalar = typename Buffer::non_const_value_type;
  Kokkos::parallel_for(
      "Lather::nn::CausalAttention::softmax", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows),
      KOKKOS_LAMBDA(int r) {
        Scalar* const row = p.data() + std::int64_t(r) * time;
        const int visible = r % time + 1;  // position t sees s <= t
        const Scalar top = Impl::lanes_max(row, visible);
        // The exponentials in a loop of their own, which vectorises; then their sum.
        for (int s = 0; s < visible; ++s) row[s] = Impl::exp_nonpositive(row[s] - top);
        const Scalar inverse = Scalar(1.0 / Impl::lanes_sum(visible, [&](int s) { return double(row[s]); }));
        for (int s = 0; s < visible; ++s) row[s] *= inverse;
        for (int s = visible; s < time; ++s) row[s] = Scalar(0);
      });
}
template <class ExecutionSpace, class Buffer>
void causal_softmax(::lather::Impl::DeviceBody, const ExecutionSpace& space, const Buffer& p, int rows, int time) {
  using Scalar = typename Buffer::non_const_value_type;
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::nn::CausalAttention::softmax", Kokkos::TeamPolicy<ExecutionSpace>(space, rows, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const std::int64_t r = member.league_rank(), row = r * time;
        const int visible = int(r % time) + 1;
        Scalar top = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, visible),
            [&](int s, Scalar& largest) { largest = p(row + s) > largest ? p(row + s) : largest; },
            Kokkos::Max<Scalar>(top));
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, visible),
            [&](int s, double& partial) {
              const Scalar e = kmath::exp(p(row + s) - top);
              p(row + s) = e;
              partial += double(e);
            },
            sum);
        member.team_barrier();
        const Scalar inverse = Scalar(1.0 / sum);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, time),
                             [&](int s) { p(row + s) = s < visible ? p(row + s) * inverse : Scalar(0); });
      });
}

/// The gradient of the scores from that of the probabilities `d` (in place), times `scale`.
template <class ExecutionSpace, class Buffer, class Scalar>
void causal_softmax_backward(::lather::Impl::HostBody, const ExecutionSpace& space, const Buffer& p, const Buffer& d,
                             int rows, int time, Scalar scale) {
  Kokkos::parallel_for(
      "Lather::nn::CausalAttention::softmax_backward", Kokkos::RangePolicy<ExecutionSpace>(space, 0, rows),
      KOKKOS_LAMBDA(int r) {
        const Scalar* const probability = p.data() + std::int64_t(r) * time;
        Scalar* const gradient = d.data() + std::int64_t(r) * time;
        const int visible = r % time + 1;
        const Scalar shift =
            Scalar(Impl::lanes_sum(visible, [&](int s) { return double(gradient[s]) * double(probability[s]); }));
        for (int s = 0; s < visible; ++s) gradient[s] = probability[s] * (gradient[s] - shift) * scale;
        for (int s = visible; s < time; ++s) gradient[s] = Scalar(0);
      });
}
template <class ExecutionSpace, class Buffer, class Scalar>
void causal_softmax_backward(::lather::Impl::DeviceBody, const ExecutionSpace& space, const Buffer& p, const Buffer& d,
                             int rows, int time, Scalar scale) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::nn::CausalAttention::softmax_backward", Kokkos::TeamPolicy<ExecutionSpace>(space, rows, Kokkos::AUTO),
      KOKKOS_LAMBDA(const member_type& member) {
        const std::int64_t r = member.league_rank(), row = r * time;
        const int visible = int(r % time) + 1;
        double dot = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, visible),
            [&](int s, double& partial) { partial += double(d(row + s)) * double(p(row + s)); }, dot);
        member.team_barrier();
        const Scalar shift = Scalar(dot);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, time), [&](int s) {
          d(row + s) = s < visible ? p(row + s) * (d(row + s) - shift) * scale : Scalar(0);
        });
      });
}
}  // namespace Impl

template <class ExecutionSpace, class Scalar>
CausalAttention<ExecutionSpace, Scalar>::CausalAttention(int heads, int head_dim)
    : m_heads(heads), m_head_dim(head_dim) {
  LATHER_REQUIRE(heads >= 0, "CausalAttention: heads must be >= 0, got ", heads);
  LATHER_REQUIRE(head_dim >= 1, "CausalAttention: head_dim must be >= 1, got ", head_dim);
}

template <class ExecutionSpace, class Scalar>
std::size_t CausalAttention<ExecutionSpace, Scalar>::scratch_bytes() const {
  return (m_probabilities.size() + m_scores.size() + m_packed.size()) * sizeof(Scalar);
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::check_shapes(const char* function, int batch, int time,
                                                           const const_matrix& q, const const_matrix& k,
                                                           const const_matrix& v) const {
  LATHER_REQUIRE(batch >= 0 && time >= 0, "CausalAttention::", function, ": batch ", batch, " and time ", time,
                 " must be >= 0");
  const std::size_t rows = std::size_t(batch) * std::size_t(time), columns = std::size_t(m_heads) * m_head_dim;
  const auto check = [&](const char* name, const const_matrix& m) {
    LATHER_REQUIRE(m.extent(0) == rows && m.extent(1) == columns, "CausalAttention::", function, ": ", name, " is [",
                   m.extent(0), ", ", m.extent(1), "], expected [batch * time, heads * head_dim] = [", rows, ", ",
                   columns, "] for batch ", batch, ", time ", time, ", ", m_heads, " heads of ", m_head_dim);
  };
  check("q", q);
  check("k", k);
  check("v", v);
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::reserve(const ExecutionSpace& space, int batch, int time) {
  const std::size_t sequences = std::size_t(batch) * std::size_t(m_heads);
  const std::size_t squares = sequences * std::size_t(time) * std::size_t(time);
  const std::size_t packed = slots * sequences * std::size_t(time) * std::size_t(m_head_dim);
  const auto grow = [&](buffer& view, std::size_t size, const char* label) {
    if (view.size() >= size) return;
    view = buffer();  // free before allocating: the peak is the new size, not both
    view = buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), size);
  };
  grow(m_probabilities, squares, "Lather::nn::CausalAttention::probabilities");
  grow(m_packed, packed, "Lather::nn::CausalAttention::packed");
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::pack(const ExecutionSpace& space, int batch, int time,
                                                   const const_matrix& a, const const_matrix& b, const const_matrix& c,
                                                   const const_matrix& d) {
  const std::int64_t block = std::int64_t(batch) * m_heads * time * m_head_dim;
  const buffer packed = m_packed;
  const bool has_d = d.data() != nullptr;
  Impl::for_each_packed(
      "Lather::nn::CausalAttention::pack", space, batch, time, m_heads, m_head_dim,
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t column, std::int64_t at) {
        packed(at) = a(row, column);
        packed(block + at) = b(row, column);
        packed(2 * block + at) = c(row, column);
        if (has_d) packed(3 * block + at) = d(row, column);
      });
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::unpack(const ExecutionSpace& space, int batch, int time,
                                                     const int (&from)[3], const matrix& a, const matrix& b,
                                                     const matrix& c) {
  const std::int64_t block = std::int64_t(batch) * m_heads * time * m_head_dim;
  const std::int64_t from_a = from[0] * block, from_b = from[1] * block, from_c = from[2] * block;
  const buffer packed = m_packed;
  const bool has_b = b.data() != nullptr, has_c = c.data() != nullptr;
  Impl::for_each_packed(
      "Lather::nn::CausalAttention::unpack", space, batch, time, m_heads, m_head_dim,
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t column, std::int64_t at) {
        a(row, column) = packed(from_a + at);
        if (has_b) b(row, column) = packed(from_b + at);
        if (has_c) c(row, column) = packed(from_c + at);
      });
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::softmax(const ExecutionSpace& space, int rows, int time) {
  Impl::causal_softmax(::lather::Impl::BodyFor<ExecutionSpace>{}, space, m_probabilities, rows, time);
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::softmax_backward(const ExecutionSpace& space, int rows, int time) {
  // The scale of the scores comes in here, so that dQ and dK are plain products of dS.
  const Scalar scale = Scalar(1.0 / std::sqrt(double(m_head_dim)));
  Impl::causal_softmax_backward(::lather::Impl::BodyFor<ExecutionSpace>{}, space, m_probabilities, m_scores, rows, time,
                                scale);
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::forward(const ExecutionSpace& space, int batch, int time,
                                                      const const_matrix& q, const const_matrix& k,
                                                      const const_matrix& v, const matrix& y) {
  check_shapes("forward", batch, time, q, k, v);
  LATHER_REQUIRE(y.extent(0) == q.extent(0) && y.extent(1) == q.extent(1), "CausalAttention::forward: y is [",
                 y.extent(0), ", ", y.extent(1), "], q [", q.extent(0), ", ", q.extent(1), "]");
  m_batch = batch;
  m_time = time;
  if (m_heads == 0 || batch == 0 || time == 0) return;
  ::lather::Impl::ScopedRegion region("Lather::nn::CausalAttention::forward");
  reserve(space, batch, time);
  const int sequences = batch * m_heads;
  const std::int64_t square = std::int64_t(time) * time, block = std::int64_t(time) * m_head_dim;
  const std::size_t elements = std::size_t(sequences) * std::size_t(block);
  const Scalar scale = Scalar(1.0 / std::sqrt(double(m_head_dim)));
  Scalar* const scores = m_probabilities.data();
  pack(space, batch, time, q, k, v, const_matrix());
  // S = Q K^T / sqrt(head_dim) over every (sequence, head), the masked half included: one
  // batched GEMM beats skipping it at these sizes.
  gemm_strided_batched(space, 'N', 'T', time, time, m_head_dim, scale, packed(slot_q, elements), block,
                       packed(slot_k, elements), block, Scalar(0), scores, square, sequences);
  softmax(space, sequences * time, time);
  gemm_strided_batched(space, 'N', 'N', time, m_head_dim, time, Scalar(1), scores, square, packed(slot_v, elements),
                       block, Scalar(0), packed(slot_dy, elements), block, sequences);
  unpack(space, batch, time, {slot_dy, slot_dy, slot_dy}, y, matrix(), matrix());
}

template <class ExecutionSpace, class Scalar>
void CausalAttention<ExecutionSpace, Scalar>::backward(const ExecutionSpace& space, int batch, int time,
                                                       const const_matrix& q, const const_matrix& k,
                                                       const const_matrix& v, const const_matrix& dy, const matrix& dq,
                                                       const matrix& dk, const matrix& dv) {
  check_shapes("backward", batch, time, q, k, v);
  const auto check = [&](const char* name, std::size_t rows, std::size_t columns) {
    LATHER_REQUIRE(rows == q.extent(0) && columns == q.extent(1), "CausalAttention::backward: ", name, " is [", rows,
                   ", ", columns, "], q [", q.extent(0), ", ", q.extent(1), "]");
  };
  check("dy", dy.extent(0), dy.extent(1));
  check("dq", dq.extent(0), dq.extent(1));
  check("dk", dk.extent(0), dk.extent(1));
  check("dv", dv.extent(0), dv.extent(1));
  LATHER_REQUIRE(batch == m_batch && time == m_time, "CausalAttention::backward: batch ", batch, " and time ", time,
                 " are not those of the last forward (batch ", m_batch, ", time ", m_time, ")");
  if (m_heads == 0 || batch == 0 || time == 0) return;
  ::lather::Impl::ScopedRegion region("Lather::nn::CausalAttention::backward");
  const int sequences = batch * m_heads;
  const std::int64_t square = std::int64_t(time) * time, block = std::int64_t(time) * m_head_dim;
  const std::size_t elements = std::size_t(sequences) * std::size_t(block);
  if (m_scores.size() < std::size_t(sequences) * std::size_t(square)) {
    m_scores = buffer();
    m_scores = buffer(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "Lather::nn::CausalAttention::scores"),
                      std::size_t(sequences) * std::size_t(square));
  }
  const Scalar* const probabilities = m_probabilities.data();
  Scalar* const scores = m_scores.data();
  Scalar* const q_slot = packed(slot_q, elements);
  Scalar* const k_slot = packed(slot_k, elements);
  Scalar* const v_slot = packed(slot_v, elements);
  Scalar* const dy_slot = packed(slot_dy, elements);
  const int hd = m_head_dim;
  pack(space, batch, time, q, k, v, dy);
  // dP = dY V^T, then dV = P^T dY into V's slot (V is no longer needed).
  gemm_strided_batched(space, 'N', 'T', time, time, hd, Scalar(1), dy_slot, block, v_slot, block, Scalar(0), scores,
                       square, sequences);
  gemm_strided_batched(space, 'T', 'N', time, hd, time, Scalar(1), probabilities, square, dy_slot, block, Scalar(0),
                       v_slot, block, sequences);
  softmax_backward(space, sequences * time, time);
  // dQ = dS K into dY's slot, then dK = dS^T Q into K's slot.
  gemm_strided_batched(space, 'N', 'N', time, hd, time, Scalar(1), scores, square, k_slot, block, Scalar(0), dy_slot,
                       block, sequences);
  gemm_strided_batched(space, 'T', 'N', time, hd, time, Scalar(1), scores, square, q_slot, block, Scalar(0), k_slot,
                       block, sequences);
  unpack(space, batch, time, {slot_dy, slot_k, slot_v}, dq, dk, dv);
}

template class CausalAttention<DefaultExecutionSpace, float>;
template class CausalAttention<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class CausalAttention<DefaultHostExecutionSpace, float>;
template class CausalAttention<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::nn
