#include <lather/comm/agreement.hpp>
#include <lather/comm/impl/support.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/comm/transport.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/shape_checks.hpp>

#include "tensor_parallel_kernels.hpp"

#include <climits>

namespace lather::comm {

using ::lather::Impl::expect_shape;
using ::lather::Impl::prepare_locally;

ShardRange shard_range(int total, int shards, int shard) {
  LATHER_REQUIRE(total >= 0 && shards >= 1 && shard >= 0 && shard < shards, "shard_range: shard ", shard, " of ",
                 shards, " shards of ", total, " features is not a valid shard");
  const int base = total / shards, extra = total % shards;
  return ShardRange{shard * base + std::min(shard, extra), base + (shard < extra ? 1 : 0)};
}

// ---- all-gather ---------------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
struct FeatureAllGather<ExecutionSpace, Scalar>::State {
  Group shards;
  TensorParallelOptions options;
  Transport<ExecutionSpace, Scalar> transport;
  /// Column where each shard's block starts (+ the total), for the feature count last gathered.
  int features = -1;
  Kokkos::View<int*, memory_space> starts;
  Kokkos::View<Scalar*, memory_space> block, packed;
};

template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>::FeatureAllGather(const Group& shards, const TensorParallelOptions& options)
    : m_state(std::make_unique<State>()) {
  m_state->shards = shards;
  m_state->options = options;
  m_state->transport = Transport<ExecutionSpace, Scalar>(shards, std::size_t(1) << 24, "Lather::FeatureAllGather");
}

template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>::~FeatureAllGather() = default;
template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>::FeatureAllGather(FeatureAllGather&&) noexcept = default;
template <class ExecutionSpace, class Scalar>
FeatureAllGather<ExecutionSpace, Scalar>& FeatureAllGather<ExecutionSpace, Scalar>::operator=(
    FeatureAllGather&&) noexcept = default;

template <class ExecutionSpace, class Scalar>
void FeatureAllGather<ExecutionSpace, Scalar>::operator()(const ExecutionSpace& space,
                                                          const Matrix<const Scalar, memory_space>& local,
                                                          const Matrix<Scalar, memory_space>& gathered) {
  Impl::ScopedRegion region("Lather::FeatureAllGather");
  auto& st = *m_state;
  const int shards = st.shards.size(), shard = st.shards.rank();
  const int features = int(gathered.extent(1)), batch = int(gathered.extent(0));
  const auto mine = shard_range(features, shards, shard);
  auto error = expect_shape("the local block", local, std::size_t(batch), std::size_t(mine.count));
  if (error.empty() && std::int64_t(batch) * features > std::int64_t(INT_MAX))
    error = "the gathered activation has more than INT_MAX elements (MPI counts are int)";
  const std::size_t total = std::size_t(batch) * features, own = std::size_t(batch) * mine.count;
  // The buffers, before the agreement: a shard that cannot allocate them tells the others.
  prepare_locally("tensor_parallel.all_gather", error, [&] {
    if (st.features != features) {
      auto starts_host = Kokkos::View<int*, Kokkos::HostSpace>("Lather::FeatureAllGather::starts", shards + 1);
      for (int d = 0; d < shards; ++d) starts_host(d) = shard_range(features, shards, d).begin;
      starts_host(shards) = features;
      st.starts = Kokkos::View<int*, memory_space>("Lather::FeatureAllGather::starts", shards + 1);
      Kokkos::deep_copy(space, st.starts, starts_host);
      ::lather::Impl::fence(space, "Lather::FeatureAllGather: block starts uploaded");
      st.features = features;
    }
    if (st.packed.extent(0) < total)
      st.packed = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::FeatureAllGather::packed"), total);
    if (st.block.extent(0) < own)
      st.block = Kokkos::View<Scalar*, memory_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "Lather::FeatureAllGather::block"), own);
  });
  agree_on_call(st.shards, st.options.verify_shapes, "all_gather_features", batch, error,
                {{"gathered feature count", features}});
  std::vector<std::size_t> counts(shards);
  for (int d = 0; d < shards; ++d) counts[d] = std::size_t(shard_range(features, shards, d).count) * batch;
  // The local block (possibly a strided subview) becomes contiguous row-major [batch, count].
  const Matrix<Scalar, memory_space> block(st.block.data(), std::size_t(batch), std::size_t(mine.count));
  Kokkos::deep_copy(space, block, local);
  st.transport.allgatherv(space, Kokkos::subview(st.block, std::make_pair(std::size_t(0), own)),
                          Kokkos::subview(st.packed, std::make_pair(std::size_t(0), total)), counts);
  Impl::place_blocks(space, Kokkos::View<const Scalar*, memory_space>(st.packed),
                     Kokkos::View<const int*, memory_space>(st.starts), shards, gathered);
}

#define LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(SPACE, SCALAR) template class FeatureAllGather<SPACE, SCALAR>;

LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_COMM_TENSOR_PARALLEL_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::comm
