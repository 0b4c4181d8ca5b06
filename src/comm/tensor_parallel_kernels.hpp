#pragma once
// Kernels of the tensor-parallel collectives (free functions: their lambdas are device-safe); products
// go through Lather's one GEMM call.

#include <lather/core/kokkos_compat.hpp>

#include <lather/core/gemm.hpp>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace lather::comm::Impl {

namespace kmath = ::lather::Impl::kmath;

template <class T, class MemorySpace>
using Rows = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;

using ::lather::Impl::gemm;

/// gathered(i, begin_d + j) = packed[offset_d + i * count_d + j] for every shard d: the shards'
/// row-major blocks, as MPI_Allgatherv lays them one after the other, placed side by side.
template <class ExecutionSpace, class S, class MemorySpace>
void place_blocks(const ExecutionSpace& space, const Kokkos::View<const S*, MemorySpace>& packed,
                  const Kokkos::View<const int*, MemorySpace>& column_of_block_start, int shards,
                  const Rows<S, MemorySpace>& gathered) {
  const int batch = int(gathered.extent(0)), features = int(gathered.extent(1));
  Kokkos::parallel_for(
      "Lather::comm::place_blocks",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {std::int64_t(0), std::int64_t(0)},
                                                             {std::int64_t(batch), std::int64_t(features)}),
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t col) {
        const int i = int(row), column = int(col);
        int d = 0;  // the shard owning `column`: the last block starting at or before it
        while (d + 1 < shards && column_of_block_start(d + 1) <= column) ++d;
        const int begin = column_of_block_start(d);
        const int count = column_of_block_start(d + 1) - begin;
        gathered(i, column) = packed(std::size_t(begin) * batch + std::size_t(i) * count + (column - begin));
      });
}

}  // namespace lather::comm::Impl
