#pragma once
// Row reductions of the nn host kernels in four interleaved lanes, combined in a fixed order: the
// same result every run, without one long chain of dependent additions (which keeps a row's sum
// at the latency of one addition per element).

#include <Kokkos_Core.hpp>

// Not in an unnamed namespace: CUDA cannot launch extended lambdas from functions in one.
namespace lather::nn::Impl {

/// The largest of x[0, n), n >= 1.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar lanes_max(const Scalar* x, int n) {
  Scalar lane[4] = {x[0], x[0], x[0], x[0]};
  int i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  for (; i < n; ++i) lane[0] = x[i] > lane[0] ? x[i] : lane[0];
  const Scalar a = lane[0] > lane[1] ? lane[0] : lane[1], b = lane[2] > lane[3] ? lane[2] : lane[3];
  return a > b ? a : b;
}

/// The sum of term(j) (a double) for j in [0, n).
template <class Term>
KOKKOS_INLINE_FUNCTION double lanes_sum(int n, const Term& term) {
  double lane[4] = {0, 0, 0, 0};
  int j = 0;
  for (; j + 4 <= n; j += 4)
    for (int l = 0; l < 4; ++l) lane[l] += term(j + l);
  for (; j < n; ++j) lane[0] += term(j);
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

}  // namespace lather::nn::Impl
