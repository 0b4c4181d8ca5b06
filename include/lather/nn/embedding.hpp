#pragma once
// Token and learned position embeddings of a GPT-style model. The token table may be split by
// vocabulary across shards (Megatron-LM's VocabParallelEmbedding): each shard looks up the tokens
// it holds, writes zeros for the others, and the caller sums the shards' outputs. Backward passes
// are deterministic (fixed summation order, no atomics), so repeated runs give identical gradients.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/tensor_parallel.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace lather::nn {

using comm::Matrix;

/// table [vocab_count, D] holds the rows of token ids [vocab_begin, vocab_begin + vocab_count):
/// out(n, :) = table(tokens(n) - vocab_begin, :) for tokens in that range, 0 for the others
/// (which includes ids outside the vocabulary: no error is raised inside the kernel). out [N, D].
template <class ExecutionSpace, class Scalar>
void token_embedding_forward(const ExecutionSpace& space,
                             const Kokkos::View<const std::int32_t*, typename ExecutionSpace::memory_space>& tokens,
                             const Matrix<const Scalar, typename ExecutionSpace::memory_space>& table, int vocab_begin,
                             const Matrix<Scalar, typename ExecutionSpace::memory_space>& out);

/// dtable(v, :) = sum of dout(n, :) over the n, in order, with tokens(n) == vocab_begin + v (added
/// to dtable when `accumulate`; rows of tokens absent from the batch are then left as they are,
/// otherwise zeroed).
template <class ExecutionSpace, class Scalar>
void token_embedding_backward(const ExecutionSpace& space,
                              const Kokkos::View<const std::int32_t*, typename ExecutionSpace::memory_space>& tokens,
                              const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dout, int vocab_begin,
                              const Matrix<Scalar, typename ExecutionSpace::memory_space>& dtable, bool accumulate);

/// Learned positions, table [max_time, D]: out(b * time + t, :) = table(t, :) for out
/// [batch * time, D], time <= max_time.
template <class ExecutionSpace, class Scalar>
void position_embedding_forward(const ExecutionSpace& space, int batch, int time,
                                const Matrix<const Scalar, typename ExecutionSpace::memory_space>& table,
                                const Matrix<Scalar, typename ExecutionSpace::memory_space>& out);

/// dtable(t, :) = sum over b of dout(b * time + t, :) (added when `accumulate`); rows t >= time
/// are zeroed unless `accumulate`.
template <class ExecutionSpace, class Scalar>
void position_embedding_backward(const ExecutionSpace& space, int batch, int time,
                                 const Matrix<const Scalar, typename ExecutionSpace::memory_space>& dout,
                                 const Matrix<Scalar, typename ExecutionSpace::memory_space>& dtable, bool accumulate);

}  // namespace lather::nn
