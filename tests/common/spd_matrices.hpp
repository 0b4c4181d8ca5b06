#pragma once
// Symmetric matrices with a known eigendecomposition, built with plain loops in double so that
// tests have a reference independent of BLAS, LAPACK and the code under test.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace lather::test {

/// A = Q diag(eigenvalues) Q^T with Q a product of `reflections` random Householder reflections.
struct KnownSpectrum {
  int n = 0;
  std::vector<double> q;            // n x n row-major, orthogonal
  std::vector<double> eigenvalues;  // n

  double at(int i, int j) const { return q[std::size_t(i) * n + j]; }

  /// Q diag(f(lambda_k)) Q^T, row-major.
  template <class F>
  std::vector<double> function(F f) const {
    std::vector<double> values(n), out(std::size_t(n) * n, 0.0);
    for (int k = 0; k < n; ++k) values[k] = f(eigenvalues[k]);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) {
        double sum = 0;
        for (int k = 0; k < n; ++k) sum += at(i, k) * values[k] * at(j, k);
        out[std::size_t(i) * n + j] = out[std::size_t(j) * n + i] = sum;
      }
    return out;
  }
  std::vector<double> matrix() const {
    return function([](double x) { return x; });
  }
  double lambda_max() const {
    double m = eigenvalues.empty() ? 0 : eigenvalues[0];
    for (double x : eigenvalues) m = std::max(m, x);
    return m;
  }
};

/// Eigenvalues spaced geometrically from `largest` down to `largest / condition`.
inline KnownSpectrum make_spectrum(int n, double largest, double condition, unsigned seed, int reflections = 4) {
  KnownSpectrum s;
  s.n = n;
  s.q.assign(std::size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) s.q[std::size_t(i) * n + i] = 1.0;
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> v(n), w(n);
  for (int r = 0; r < reflections && n > 1; ++r) {
    double norm2 = 0;
    for (auto& x : v) {
      x = normal(rng);
      norm2 += x * x;
    }
    // Q <- Q (I - 2 v v^T / |v|^2)
    for (int i = 0; i < n; ++i) {
      double dot = 0;
      for (int k = 0; k < n; ++k) dot += s.q[std::size_t(i) * n + k] * v[k];
      w[i] = 2.0 * dot / norm2;
    }
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k) s.q[std::size_t(i) * n + k] -= w[i] * v[k];
  }
  s.eigenvalues.resize(n);
  for (int k = 0; k < n; ++k) {
    const double t = n == 1 ? 0.0 : double(k) / (n - 1);
    s.eigenvalues[k] = largest * std::pow(condition, -t);
  }
  std::shuffle(s.eigenvalues.begin(), s.eigenvalues.end(), rng);
  return s;
}

inline double relative_frobenius_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    diff += (got[k] - want[k]) * (got[k] - want[k]);
    norm += want[k] * want[k];
  }
  return std::sqrt(diff / norm);
}

}  // namespace lather::test
