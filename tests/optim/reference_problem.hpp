#pragma once
// The fixed problem of the Python reference scripts (scripts/soap_reference.py,
// scripts/kl_shampoo_reference.py): initial values and gradients term by term in IEEE double with
// the C library's sin/cos, rounded once to float, and the reference files of a data directory.
#include <lather/core/tensor.hpp>
#include <lather/core/parameters.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace lather::test {

inline float reference_initial_value(std::int64_t k, std::size_t pidx) {
  return float(std::cos(0.23 * double(k + 1) + 0.7 * double(pidx)));
}
inline float reference_gradient_value(float p, std::int64_t k, std::size_t pidx, int t) {
  const double kk = double(k + 1);
  return float(0.1 * double(p) + std::sin(0.37 * kk + 1.3 * double(t + 1) + 0.61 * double(pidx)) +
               0.5 * std::cos(0.173 * kk * kk + 0.7 * double(t + 1) + 0.3 * double(pidx)));
}

/// Parameters on the device with the problem's initial values and gradients.
template <class Mem>
struct ReferenceProblem {
  std::vector<lather::optim::ParameterSpec> specs;
  lather::TensorList<float, Mem> values, gradients;
  explicit ReferenceProblem(std::vector<lather::optim::ParameterSpec> s) : specs(std::move(s)) {
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const auto n = lather::element_count(specs[p].shape);
      values.push_back(lather::FlatTensor<float, Mem>("value", n));
      gradients.push_back(lather::FlatTensor<float, Mem>("gradient", n));
      auto host = Kokkos::create_mirror_view(values[p]);
      for (std::int64_t k = 0; k < n; ++k) host(k) = reference_initial_value(k, p);
      Kokkos::deep_copy(values[p], host);
    }
  }
  std::vector<float> host(std::size_t p) const {
    auto mirror = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values[p]);
    return std::vector<float>(mirror.data(), mirror.data() + mirror.size());
  }
  /// Gradients of step t from the current values (pidx may differ from p: a test may give one
  /// reference parameter's blocks as parameters of their own).
  void set_gradients(int t, const std::vector<std::size_t>& pidx = {}) {
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const auto x = host(p);
      auto g = Kokkos::create_mirror_view(gradients[p]);
      for (std::size_t k = 0; k < x.size(); ++k)
        g(k) = reference_gradient_value(x[k], std::int64_t(k), pidx.empty() ? p : pidx[p], t);
      Kokkos::deep_copy(gradients[p], g);
    }
  }
  template <class Optimizer>
  void step(Optimizer& optimizer, int t) {
    set_gradients(t);
    optimizer.step(typename Mem::execution_space(), values, gradients);
  }
};

/// The .json files of `dir`, sorted.
inline std::vector<std::string> reference_files(const std::filesystem::path& dir) {
  std::vector<std::string> files;
  if (std::filesystem::exists(dir))
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace lather::test
