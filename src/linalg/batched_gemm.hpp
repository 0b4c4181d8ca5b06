#pragma once
// C(s) = A(s) * B(s) for a list of slots of [slots, n, n] stacks. The GEMMs go to Kokkos Kernels:
// one KokkosBlas::gemm per matrix (the BLAS TPL on the host, cuBLAS on CUDA) for large n, or one
// batched kernel of KokkosBatched small GEMMs for the whole list when n is small, where a library
// call per matrix would cost more than the multiplication.

#include "root_kernels.hpp"

#include <KokkosBatched_Gemm_Decl.hpp>
#include <KokkosBatched_Gemm_Serial_Impl.hpp>
#include <KokkosBatched_Gemm_Team_Impl.hpp>
#include <lather/core/impl/gemm.hpp>

#include <vector>

namespace lather::linalg::Impl {

/// Matrices up to this size use the batched small-GEMM kernel unless the caller chose otherwise.
/// Host: never -- OpenBLAS per matrix was as fast at n = 4 and 2-5x faster from n = 8 to 48
/// (`lather-bench root --n 4,8,16,32,48 --batch 256 --batched-gemm-max-size 0|64`, one core).
/// Device: one kernel launch per matrix is what batching saves; up to 128 a team holds a matrix
/// product comfortably. Not yet measured on a GPU: the option overrides it.
template <class ExecutionSpace>
int default_batched_gemm_max_size() {
  return host_accessible<typename ExecutionSpace::memory_space> ? 0 : 128;
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

template <class ExecutionSpace, class C, class MemorySpace>
void gemm_slots(const ExecutionSpace& space, const std::vector<int>& slots_host,
                const Array1<const int, MemorySpace>& slots, const Stack3<const C, MemorySpace>& a,
                const Stack3<const C, MemorySpace>& b, const Stack3<C, MemorySpace>& c, int n,
                int batched_max_size, GemmCount& count) {
  const int total = int(slots_host.size());
  if (total == 0) return;
  count.add(n, total);
  if (n <= batched_max_size) {
    if constexpr (host_accessible<MemorySpace>) {
      Kokkos::parallel_for(
          "Lather::linalg::batched_small_gemm", Kokkos::RangePolicy<ExecutionSpace>(space, 0, total),
          KOKKOS_LAMBDA(int k) {
            const int s = slots(k);
            KokkosBatched::SerialGemm<KokkosBatched::Trans::NoTranspose,
                                      KokkosBatched::Trans::NoTranspose,
                                      KokkosBatched::Algo::Gemm::Unblocked>::
                invoke(C(1), Kokkos::subview(a, s, Kokkos::ALL, Kokkos::ALL),
                       Kokkos::subview(b, s, Kokkos::ALL, Kokkos::ALL), C(0),
                       Kokkos::subview(c, s, Kokkos::ALL, Kokkos::ALL));
          });
    } else {
      using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
      Kokkos::parallel_for(
          "Lather::linalg::batched_team_gemm", per_slot_policy(space, total),
          KOKKOS_LAMBDA(const member_type& member) {
            const int s = slots(member.league_rank());
            KokkosBatched::TeamGemm<member_type, KokkosBatched::Trans::NoTranspose,
                                    KokkosBatched::Trans::NoTranspose,
                                    KokkosBatched::Algo::Gemm::Unblocked>::
                invoke(member, C(1), Kokkos::subview(a, s, Kokkos::ALL, Kokkos::ALL),
                       Kokkos::subview(b, s, Kokkos::ALL, Kokkos::ALL), C(0),
                       Kokkos::subview(c, s, Kokkos::ALL, Kokkos::ALL));
          });
    }
    return;
  }
  for (int s : slots_host) {
    gemm(space, Kokkos::subview(a, s, Kokkos::ALL, Kokkos::ALL),
         Kokkos::subview(b, s, Kokkos::ALL, Kokkos::ALL),
         Kokkos::subview(c, s, Kokkos::ALL, Kokkos::ALL));
  }
}

}  // namespace lather::linalg::Impl
