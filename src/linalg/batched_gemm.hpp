#pragma once
// C(s) = A(s) * B(s) for a list of slots of [slots, n, n] stacks. The GEMMs go to Kokkos Kernels:
// one KokkosBlas::gemm per matrix (the BLAS TPL on the host, cuBLAS on CUDA) for large n, or one
// batched kernel of KokkosBatched small GEMMs for the whole list when n is small, where a library
// call per matrix would cost more than the multiplication.

#include "root_kernels.hpp"

#include <KokkosBatched_Gemm_Decl.hpp>
#include <KokkosBatched_Gemm_Serial_Impl.hpp>
#include <KokkosBatched_Gemm_Team_Impl.hpp>
#include <lather/core/error.hpp>
#include <lather/core/gemm.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace lather::linalg::Impl {

/// Whether the batched path of `ExecutionSpace` is cuBLAS's strided-batched GEMM (one call per run
/// of consecutive slots) rather than the KokkosBatched team kernel (one team per matrix).
template <class ExecutionSpace>
constexpr bool batched_gemm_is_cublas() {
#if LATHER_BATCHED_GEMM_CUBLAS
  return std::is_same<ExecutionSpace, Kokkos::Cuda>::value;
#else
  return false;
#endif
}

/// Matrices up to this size use the batched path unless the caller chose otherwise.
/// Host: never -- OpenBLAS per matrix is as fast at n = 4 and up to several times faster from
/// n = 8 to 48 (`lather-bench root --n 4,8,16,32,48 --batch 256 --batched-gemm-max-size 0|64`,
/// one core). CUDA with cuBLAS: every size, as cuBLAS's strided-batched GEMM, which runs Newton
/// roots several times as fast as the team kernel or one cuBLAS GEMM per matrix
/// (docs/reference/linalg.md). Other devices: the team kernel up to 128, where a team holds a
/// matrix product comfortably; the option overrides both.
template <class ExecutionSpace>
int default_batched_gemm_max_size() {
  if (host_accessible<typename ExecutionSpace::memory_space>) return 0;
  return batched_gemm_is_cublas<ExecutionSpace>() ? std::numeric_limits<int>::max() : 128;
}

/// One GEMM, C = A * B, through Lather's one GEMM call.
template <class ExecutionSpace, class AView, class BView, class CView>
void gemm(const ExecutionSpace& space, const AView& a, const BView& b, const CView& c) {
  using value_type = typename CView::non_const_value_type;
  ::lather::Impl::gemm(space, "N", "N", value_type(1), a, b, value_type(0), c);
}

struct GemmCount {
  double flops = 0;
  long calls = 0;
  void add(int n, long count) {
    flops += 2.0 * double(n) * double(n) * double(n) * double(count);
    calls += count;
  }
};

/// The runs of consecutive numbers in `slots`, in order, as (first, length): {3, 4, 5, 9, 2, 3}
/// gives (3, 3), (9, 1), (2, 2). One strided-batched call serves each.
inline std::vector<std::pair<int, int>> consecutive_runs(const std::vector<int>& slots) {
  std::vector<std::pair<int, int>> runs;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (k > 0 && slots[k] == slots[k - 1] + 1)
      ++runs.back().second;
    else
      runs.emplace_back(slots[k], 1);
  }
  return runs;
}

template <class ExecutionSpace, class C, class MemorySpace>
void gemm_slots(const ExecutionSpace& space, const std::vector<int>& slots_host,
                const Array1<const int, MemorySpace>& slots, const Stack3<const C, MemorySpace>& a,
                const Stack3<const C, MemorySpace>& b, const Stack3<C, MemorySpace>& c, int n, int batched_max_size,
                GemmCount& count) {
  const int total = int(slots_host.size());
  if (total == 0) return;
  count.add(n, total);
  if (n <= batched_max_size) {
    if constexpr (batched_gemm_is_cublas<ExecutionSpace>()) {
      // The stacks are [slots, n, n]: a run of consecutive slots is one strided-batched call.
      LATHER_REQUIRE(int(a.extent(1)) == n && int(a.extent(2)) == n && int(b.extent(1)) == n && int(b.extent(2)) == n &&
                         int(c.extent(1)) == n && int(c.extent(2)) == n,
                     "gemm_slots: the stacks must be [slots, ", n, ", ", n, "]");
      const std::int64_t stride = std::int64_t(n) * n;
      for (const auto& [first, length] : consecutive_runs(slots_host)) {
        const std::int64_t offset = std::int64_t(first) * stride;
        ::lather::Impl::gemm_strided_batched(space, 'N', 'N', n, n, n, C(1), a.data() + offset, stride,
                                             b.data() + offset, stride, C(0), c.data() + offset, stride, length);
      }
      return;
    } else if constexpr (host_accessible<MemorySpace>) {
      Kokkos::parallel_for(
          "Lather::linalg::batched_small_gemm", Kokkos::RangePolicy<ExecutionSpace>(space, 0, total),
          KOKKOS_LAMBDA(int k) {
            const int s = slots(k);
            KokkosBatched::SerialGemm<KokkosBatched::Trans::NoTranspose, KokkosBatched::Trans::NoTranspose,
                                      KokkosBatched::Algo::Gemm::Unblocked>::invoke(C(1),
                                                                                    Kokkos::subview(a, s, Kokkos::ALL,
                                                                                                    Kokkos::ALL),
                                                                                    Kokkos::subview(b, s, Kokkos::ALL,
                                                                                                    Kokkos::ALL),
                                                                                    C(0),
                                                                                    Kokkos::subview(c, s, Kokkos::ALL,
                                                                                                    Kokkos::ALL));
          });
    } else {
      using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
      Kokkos::parallel_for(
          "Lather::linalg::batched_team_gemm", per_slot_policy(space, total), KOKKOS_LAMBDA(const member_type& member) {
            const int s = slots(member.league_rank());
            KokkosBatched::TeamGemm<member_type, KokkosBatched::Trans::NoTranspose, KokkosBatched::Trans::NoTranspose,
                                    KokkosBatched::Algo::Gemm::Unblocked>::invoke(member, C(1),
                                                                                  Kokkos::subview(a, s, Kokkos::ALL,
                                                                                                  Kokkos::ALL),
                                                                                  Kokkos::subview(b, s, Kokkos::ALL,
                                                                                                  Kokkos::ALL),
                                                                                  C(0),
                                                                                  Kokkos::subview(c, s, Kokkos::ALL,
                                                                                                  Kokkos::ALL));
          });
    }
    return;
  }
  for (int s : slots_host) {
    gemm(space, Kokkos::subview(a, s, Kokkos::ALL, Kokkos::ALL), Kokkos::subview(b, s, Kokkos::ALL, Kokkos::ALL),
         Kokkos::subview(c, s, Kokkos::ALL, Kokkos::ALL));
  }
}

}  // namespace lather::linalg::Impl
