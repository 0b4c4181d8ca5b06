#pragma once
// Kernels of the batched inverse-root solver. Every kernel works on a list of "slots" of a
// chunk workspace [slots, n, n], one team per slot, so finished matrices cost nothing.

#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <KokkosBlas2_gemv.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace lather::linalg::Impl {

namespace kmath = ::lather::Impl::kmath;
using ::lather::Impl::fence;
using ::lather::Impl::host_accessible;
using ::lather::Impl::is_finite;
using ::lather::Impl::ScopedRegion;

template <class T, class MemorySpace>
using Stack3 = Kokkos::View<T***, Kokkos::LayoutRight, MemorySpace>;
template <class T, class MemorySpace>
using Array2 = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;
template <class T, class MemorySpace>
using Array1 = Kokkos::View<T*, MemorySpace>;

/// One team per slot, one lane per thread: for kernels whose team threads take consecutive
/// elements of a flattened range (adjacent threads, adjacent addresses).
template <class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> per_slot_policy(const ExecutionSpace& space, int slots) {
  return Kokkos::TeamPolicy<ExecutionSpace>(space, slots, Kokkos::AUTO);
}

/// One team per slot for kernels that walk rows (TeamThreadRange) and the columns of a row
/// (ThreadVectorRange), coalesced on a device (core/kokkos_compat.hpp's row_team_policy, whose
/// rule for writes outside the vector loops these kernels follow).
template <class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> per_slot_row_policy(const ExecutionSpace& space, int slots) {
  return ::lather::Impl::row_team_policy(space, slots);
}

/// work(s) = C(input(matrix_of(s))) on the leading n x n block; nonfinite(s) counts NaN/Inf.
template <class ExecutionSpace, class S, class C, class MemorySpace>
void load_matrices(const ExecutionSpace& space, const Stack3<const S, MemorySpace>& input,
                   const Array1<const int, MemorySpace>& matrix_of, int slots, int n,
                   const Stack3<C, MemorySpace>& work, const Array1<int, MemorySpace>& nonfinite) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::linalg::load_matrices", per_slot_row_policy(space, slots), KOKKOS_LAMBDA(const member_type& member) {
        const int s = member.league_rank();
        const int b = matrix_of(s);
        int bad = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, n),
            [&](int i, int& count) {
              int row_bad = 0;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(member, n),
                  [&](int j, int& row_count) {
                    const C value = C(input(b, i, j));
                    work(s, i, j) = value;
                    if (!is_finite(value)) ++row_count;
                  },
                  row_bad);
              count += row_bad;
            },
            bad);
        Kokkos::single(Kokkos::PerTeam(member), [&]() { nonfinite(s) = bad; });
      });
}

/// Power iteration per slot, as the reference's `power_iteration`: start from v0, normalise,
/// s_v = A v, s = v . s_v, stop when |s_new - s| <= tolerance or after max_iterations.
template <class ExecutionSpace, class C, class MemorySpace>
void power_iteration(const ExecutionSpace& space, const Stack3<const C, MemorySpace>& matrices,
                     const Array1<const int, MemorySpace>& slot_list, int count, int n,
                     const Array1<const C, MemorySpace>& start, const Array2<C, MemorySpace>& v_work,
                     const Array2<C, MemorySpace>& av_work, int max_iterations, C tolerance,
                     const Array1<C, MemorySpace>& eigenvalue, const Array1<int, MemorySpace>& iterations) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::linalg::power_iteration", per_slot_row_policy(space, count), KOKKOS_LAMBDA(const member_type& member) {
        const int s = slot_list(member.league_rank());
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) { v_work(s, i) = start(i); });
        member.team_barrier();
        C rayleigh = 0;
        int it = 0;
        bool run = true;
        while (run && it < max_iterations) {
          C norm2 = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(member, n), [&](int i, C& sum) { sum += v_work(s, i) * v_work(s, i); }, norm2);
          if (!(norm2 > C(0))) break;  // v fell into the null space: s is already exact
          const C scale = C(1) / kmath::sqrt(norm2);
          member.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) {
            Kokkos::single(Kokkos::PerThread(member), [&]() { v_work(s, i) *= scale; });
          });
          member.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) {
            C row = 0;
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(member, n), [&](int j, C& sum) { sum += matrices(s, i, j) * v_work(s, j); },
                row);
            Kokkos::single(Kokkos::PerThread(member), [&]() { av_work(s, i) = row; });
          });
          member.team_barrier();
          C next = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(member, n), [&](int i, C& sum) { sum += v_work(s, i) * av_work(s, i); }, next);
          run = kmath::fabs(next - rayleigh) > tolerance;
          rayleigh = next;
          ++it;
          member.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) { v_work(s, i) = av_work(s, i); });
          member.team_barrier();
        }
        Kokkos::single(Kokkos::PerTeam(member), [&]() {
          eigenvalue(s) = rayleigh;
          iterations(s) = it;
        });
      });
}

/// Power iteration on the host, one matrix at a time with BLAS gemv for A v: the same arithmetic
/// as the team kernel above, which a scalar matrix-vector loop would make cost ~10% of a root.
template <class C, class MemorySpace>
void power_iteration_host(const Stack3<const C, MemorySpace>& matrices, const std::vector<int>& slots, int n,
                          const Array1<const C, MemorySpace>& start, const Array2<C, MemorySpace>& v_work,
                          const Array2<C, MemorySpace>& av_work, int max_iterations, C tolerance,
                          const Array1<C, MemorySpace>& eigenvalue, const Array1<int, MemorySpace>& iterations) {
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  for (int s : slots) {
    // A is symmetric, so its row-major storage read column-major is A itself: LayoutLeft views
    // throughout are what the BLAS TPL of KokkosBlas::gemv accepts.
    const Kokkos::View<const C**, Kokkos::LayoutLeft, Kokkos::HostSpace, Unmanaged> a(&matrices(s, 0, 0), n, n);
    const Kokkos::View<C*, Kokkos::LayoutLeft, Kokkos::HostSpace, Unmanaged> v(&v_work(s, 0), n);
    const Kokkos::View<C*, Kokkos::LayoutLeft, Kokkos::HostSpace, Unmanaged> av(&av_work(s, 0), n);
    for (int i = 0; i < n; ++i) v(i) = start(i);
    C rayleigh = 0;
    int it = 0;
    bool run = true;
    while (run && it < max_iterations) {
      C norm2 = 0;
      for (int i = 0; i < n; ++i) norm2 += v(i) * v(i);
      if (!(norm2 > C(0))) break;
      const C scale = C(1) / std::sqrt(norm2);
      for (int i = 0; i < n; ++i) v(i) *= scale;
      KokkosBlas::gemv("N", C(1), a, v, C(0), av);
      C next = 0;
      for (int i = 0; i < n; ++i) next += v(i) * av(i);
      run = std::fabs(next - rayleigh) > tolerance;
      rayleigh = next;
      ++it;
      for (int i = 0; i < n; ++i) v(i) = av(i);
    }
    eigenvalue(s) = rayleigh;
    iterations(s) = it;
  }
}

/// ridge(s) = epsilon * max(lambda(s), 1e-6) where the ridge is relative to lambda_max, else
/// epsilon; formed in double and rounded once to C, as the eigh paths form theirs.
template <class ExecutionSpace, class C, class MemorySpace>
void ridge_from_lambda(const ExecutionSpace& space, const Array1<const int, MemorySpace>& slot_list, int count,
                       double epsilon, bool relative, const Array1<const C, MemorySpace>& lambda,
                       const Array1<C, MemorySpace>& ridge) {
  Kokkos::parallel_for(
      "Lather::linalg::ridge_from_lambda", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count), KOKKOS_LAMBDA(int k) {
        const int s = slot_list(k);
        const double lambda_max = double(lambda(s));
        ridge(s) = C(relative ? epsilon * (lambda_max < 1e-6 ? 1e-6 : lambda_max) : epsilon);  // std::max's NaN rule
      });
}

/// One team's pass over slot s of a Newton step: x(i, j) = element(i, j) (which may also write
/// the slot's other matrices), t(s) = (1 - alpha) I + alpha x, and the return value max |x - I|
/// (+inf when an entry is not finite), the error that decides whether the slot goes on.
template <class Member, class C, class MemorySpace, class Element>
KOKKOS_INLINE_FUNCTION C error_and_step(const Member& member, int s, int n, C alpha, const Stack3<C, MemorySpace>& t,
                                        const Element& element) {
  C worst = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(member, n),
      [&](int i, C& local) {
        C row_worst = 0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(member, n),
            [&](int j, C& row_local) {
              const C x = element(i, j);
              t(s, i, j) = alpha * x + (i == j ? C(1) - alpha : C(0));
              C d = kmath::fabs(x - C(i == j));
              if (!is_finite(d)) d = Kokkos::Experimental::infinity<C>::value;
              if (d > row_local) row_local = d;
            },
            Kokkos::Max<C>(row_worst));
        if (row_worst > local) local = row_worst;
      },
      Kokkos::Max<C>(worst));
  return worst;
}

/// Newton start: M0 = z (A + ridge I), H0 = z^(1/p) I with z = (1 + p) / (2 ||A + ridge I||_F);
/// error(s) = max |M0 - I|, and the first step matrix T = (1 - alpha) I + alpha M0 (alpha = -1/p).
template <class ExecutionSpace, class C, class MemorySpace>
void newton_start(const ExecutionSpace& space, const Stack3<C, MemorySpace>& m, const Stack3<C, MemorySpace>& h,
                  const Stack3<C, MemorySpace>& t, const Array1<const int, MemorySpace>& slot_list, int count, int n,
                  int p, const Array1<const C, MemorySpace>& ridge, const Array1<C, MemorySpace>& error) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Kokkos::parallel_for(
      "Lather::linalg::newton_start", per_slot_row_policy(space, count), KOKKOS_LAMBDA(const member_type& member) {
        const int s = slot_list(member.league_rank());
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, n), [&](int i) {
          Kokkos::single(Kokkos::PerThread(member), [&]() { m(s, i, i) += ridge(s); });
        });
        member.team_barrier();
        C norm2 = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, n),
            [&](int i, C& sum) {
              C row = 0;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(member, n), [&](int j, C& row_sum) { row_sum += m(s, i, j) * m(s, i, j); },
                  row);
              sum += row;
            },
            norm2);
        const C z = C(1 + p) / (C(2) * kmath::sqrt(norm2));
        const C h0 = kmath::pow(z, C(1) / C(p));
        const C alpha = C(-1) / C(p);
        member.team_barrier();
        const C worst = error_and_step(member, s, n, alpha, t, [&](int i, int j) {
          const C x = m(s, i, j) * z;
          m(s, i, j) = x;
          h(s, i, j) = i == j ? h0 : C(0);
          return x;
        });
        Kokkos::single(Kokkos::PerTeam(member), [&]() { error(s) = worst; });
      });
}

/// error(s) = max |m(s) - I| (+inf when any entry is not finite), and in the same pass the next
/// step matrix t(s) = (1 - alpha) I + alpha m(s), alpha = -1/p (unused if the slot stops).
template <class ExecutionSpace, class C, class MemorySpace>
void newton_error_and_step(const ExecutionSpace& space, const Stack3<const C, MemorySpace>& m,
                           const Stack3<C, MemorySpace>& t, const Array1<const int, MemorySpace>& slot_list, int count,
                           int n, int p, const Array1<C, MemorySpace>& error) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  const C alpha = C(-1) / C(p);
  Kokkos::parallel_for(
      "Lather::linalg::newton_error_and_step", per_slot_row_policy(space, count),
      KOKKOS_LAMBDA(const member_type& member) {
        const int s = slot_list(member.league_rank());
        const C worst = error_and_step(member, s, n, alpha, t, [&](int i, int j) { return m(s, i, j); });
        Kokkos::single(Kokkos::PerTeam(member), [&]() { error(s) = worst; });
      });
}

/// out(matrix_of(s)) = S(h(s)) on the leading block, identity on the padding.
template <class ExecutionSpace, class S, class C, class MemorySpace>
void store_roots(const ExecutionSpace& space, const Stack3<const C, MemorySpace>& h,
                 const Array1<const int, MemorySpace>& slot_list, int count,
                 const Array1<const int, MemorySpace>& matrix_of, int n, const Stack3<S, MemorySpace>& out) {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  const int padded = int(out.extent(1));
  Kokkos::parallel_for(
      "Lather::linalg::store_roots", per_slot_row_policy(space, count), KOKKOS_LAMBDA(const member_type& member) {
        const int s = slot_list(member.league_rank());
        const int b = matrix_of(s);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, padded), [&](int i) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, padded),
                               [&](int j) { out(b, i, j) = (i < n && j < n) ? S(h(s, i, j)) : S(i == j); });
        });
      });
}

/// The 1x1 case in closed form: (a + ridge)^(-1/p), ridge from lambda_max = a.
template <class ExecutionSpace, class S, class C, class MemorySpace>
void scalar_roots(const ExecutionSpace& space, const Stack3<const S, MemorySpace>& input,
                  const Stack3<S, MemorySpace>& out, const Array1<const int, MemorySpace>& matrix_of,
                  const Array1<const int, MemorySpace>& exponent, int count, C ridge_epsilon, bool relative_ridge,
                  const Array1<C, MemorySpace>& lambda, const Array1<C, MemorySpace>& ridge_out,
                  const Array1<int, MemorySpace>& ok) {
  const int padded = int(out.extent(1));
  Kokkos::parallel_for(
      "Lather::linalg::scalar_roots", Kokkos::RangePolicy<ExecutionSpace>(space, 0, count), KOKKOS_LAMBDA(int t) {
        const int b = matrix_of(t);
        const C a = C(input(b, 0, 0));
        const C floor = C(1e-6);
        const C ridge = relative_ridge ? ridge_epsilon * (a > floor ? a : floor) : ridge_epsilon;
        const C root = kmath::pow(a + ridge, C(-1) / C(exponent(t)));
        lambda(t) = a;
        ridge_out(t) = ridge;
        ok(t) = is_finite(a) && is_finite(root) && a + ridge > C(0);
        if (!ok(t)) return;
        for (int i = 0; i < padded; ++i)
          for (int j = 0; j < padded; ++j) out(b, i, j) = i == j ? (i == 0 ? S(root) : S(1)) : S(0);
      });
}

}  // namespace lather::linalg::Impl
