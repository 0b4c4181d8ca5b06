#pragma once
// The collectives of tensor parallelism over the shard group of a Mesh: how features are split
// across shards (shard_range) and the all-gather of a sharded activation. The layers built on them
// (nn::ColumnParallelLinear, nn::RowParallelLinear, nn::VocabParallelCrossEntropy) live in nn.
//
// Uneven splits are supported: `total` features over S shards give shard d the range
// shard_range(total, S, d), the first total % S shards holding one more (a shard may hold none
// when total < S). Every collective call first agrees on the shapes across the shards (one small
// MPI_Allreduce, TensorParallelOptions::verify_shapes), so a mismatch is an error on every shard.
//
// Failures: what a shard does before a call's collective (checking its Views, allocating the
// call's buffers) is agreed in that same small MPI_Allreduce, so a failure on one shard is a
// lather::Error on every shard, "<call>: <message> (on group rank k of n)", thrown before any
// output is written; the object stays usable. With verify_shapes off there is no agreement and a
// failure is thrown on its shard alone.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>

#include <Kokkos_Core.hpp>

#include <memory>

namespace lather::comm {

template <class Scalar, class MemorySpace>
using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;

/// The features [begin, begin + count) that shard `shard` of `shards` holds out of `total`.
struct ShardRange {
  int begin = 0;
  int count = 0;
};
ShardRange shard_range(int total, int shards, int shard);

struct TensorParallelOptions {
  /// Agree on the batch size (and argument validity) before every communicating call: one small
  /// MPI_Allreduce. Turn off only when every shard is known to pass the same shapes.
  bool verify_shapes = true;
};

/// x [batch, f] := the shards' x_d [batch, f_d] side by side, shard d's at columns
/// shard_range(f, S, d). Keeps its buffers between calls; collective over `shards` (agreement +
/// one all-gather).
template <class ExecutionSpace, class Scalar>
class FeatureAllGather {
 public:
  using memory_space = typename ExecutionSpace::memory_space;

  explicit FeatureAllGather(const Group& shards, const TensorParallelOptions& options = {});
  ~FeatureAllGather();
  FeatureAllGather(FeatureAllGather&&) noexcept;
  FeatureAllGather& operator=(FeatureAllGather&&) noexcept;

  void operator()(const ExecutionSpace& space, const Matrix<const Scalar, memory_space>& local,
                  const Matrix<Scalar, memory_space>& gathered);

 private:
  struct State;
  std::unique_ptr<State> m_state;
};

/// One-shot FeatureAllGather (fresh buffers each call): hold a FeatureAllGather to gather repeatedly.
template <class ExecutionSpace, class Scalar>
void all_gather_features(const ExecutionSpace& space, const Group& shards,
                         const Matrix<const Scalar, typename ExecutionSpace::memory_space>& local,
                         const Matrix<Scalar, typename ExecutionSpace::memory_space>& gathered,
                         const TensorParallelOptions& options = {}) {
  FeatureAllGather<ExecutionSpace, Scalar>(shards, options)(space, local, gathered);
}

}  // namespace lather::comm
