#pragma once
// The core of multi-head causal self-attention (GPT-2) for the heads one shard holds: given the
// projected queries, keys and values, y_h = softmax(q_h k_h^T / sqrt(head_dim) + causal mask) v_h
// per sequence and head, position t attending to positions s <= t. The projections themselves
// are the caller's (column-parallel by heads, then row-parallel: Megatron-LM's split).
//
// Layout: q, k, v, y are [batch * time, heads * head_dim] row-major, row b * time + t, head h in
// columns [h * head_dim, (h + 1) * head_dim). The two products per (sequence, head) are batched
// GEMMs (one cuBLAS strided-batched call on CUDA) on per-head contiguous copies
// [batch, heads, time, head_dim] packed in one pass.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace lather::nn {

using comm::Matrix;

template <class ExecutionSpace, class Scalar>
class CausalAttention {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using matrix = Matrix<Scalar, memory_space>;
  using const_matrix = Matrix<const Scalar, memory_space>;

  /// heads >= 0 (a shard may hold none: every call is then a no-op), head_dim >= 1.
  CausalAttention(int heads, int head_dim);

  int heads() const { return m_heads; }
  int head_dim() const { return m_head_dim; }

  /// y = attention(q, k, v) for `batch` sequences of `time` positions. Keeps the probabilities
  /// [batch, heads, time, time] for backward (allocated on first use and on growth, kept between
  /// calls; the masked ones exactly 0).
  void forward(const ExecutionSpace& space, int batch, int time, const const_matrix& q, const const_matrix& k,
               const const_matrix& v, const matrix& y);

  /// Gradients w.r.t. q, k and v given dy, for the inputs of the last forward (the same q, k, v
  /// passed again; batch and time must be the last forward's). dq, dk, dv are overwritten. May
  /// be called more than once per forward.
  void backward(const ExecutionSpace& space, int batch, int time, const const_matrix& q, const const_matrix& k,
                const const_matrix& v, const const_matrix& dy, const matrix& dq, const matrix& dk, const matrix& dv);

  /// Bytes of the Views this object holds (probabilities and scratch), for memory reports.
  std::size_t scratch_bytes() const;

  // Implementation steps. Public only because nvcc rejects an extended __host__ __device__ lambda
  // (KOKKOS_LAMBDA) whose enclosing member function is private or protected; not for users.
  using buffer = Kokkos::View<Scalar*, memory_space>;
  /// Per-head contiguous copies of a, b, c, d [batch * time, heads * head_dim] into packed slots
  /// 0 .. 3 (d skipped when empty).
  void pack(const ExecutionSpace& space, int batch, int time, const const_matrix& a, const const_matrix& b,
            const const_matrix& c, const const_matrix& d);
  /// The inverse of pack: a, b, c from packed slots from[0], from[1], from[2] (b, c skipped when
  /// empty).
  void unpack(const ExecutionSpace& space, int batch, int time, const int (&from)[3], const matrix& a, const matrix& b,
              const matrix& c);
  /// Rows of scores -> causal softmax probabilities, in place in m_probabilities.
  void softmax(const ExecutionSpace& space, int rows, int time);
  /// Rows of dP -> dS = P o (dP - rowsum(dP o P)) / sqrt(head_dim), in place in m_scores.
  void softmax_backward(const ExecutionSpace& space, int rows, int time);

 private:
  void check_shapes(const char* function, int batch, int time, const const_matrix& q, const const_matrix& k,
                    const const_matrix& v) const;
  void reserve(const ExecutionSpace& space, int batch, int time);
  Scalar* packed(int slot, std::size_t elements) const { return m_packed.data() + std::size_t(slot) * elements; }

  int m_heads = 0, m_head_dim = 1;
  int m_batch = -1, m_time = -1;  ///< shape of the last forward (-1: none yet)
  buffer m_probabilities;         ///< [batch, heads, time, time] of the last forward
  buffer m_scores;                ///< backward scratch [batch, heads, time, time]: dP, then dS
  buffer m_packed;                ///< 4 per-head copies [batch, heads, time, head_dim]
};

}  // namespace lather::nn
