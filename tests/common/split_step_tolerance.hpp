#pragma once
// How closely an optimizer step split across ranks (or resumed on another rank count) must match
// one rank's, by the memory space the optimizer runs in.
//
// Host builds: BLAS computes each block's products one matrix at a time, so which rank owns a
// block, and which other blocks share its batched call, changes no bit; what remains is reduction
// order, a few float ulps: 1e-6 relative.
// Device builds: cuBLAS chooses its algorithm (tiling, split-K) by the batch count, and a block
// batched with all blocks of its shape on one rank is batched with fewer when the blocks are
// split, so its products differ in their last bits, which the steps carry further. How far
// depends on the problem, not on the split:
// - well conditioned (unquantized Shampoo, SOAP with full-rank factors): measured on an H100
//   (CUDA 13, 25 November 2026) up to 3.7e-5 of 1 + |x| after 5 steps; 1e-4 is above that and
//   far below what a stale, misplaced or twice-applied block makes (of the step size, >= 1e-3);
// - discontinuous or ill-posed: an int8/int16 code of quantized state that a last bit flips
//   moves its element by a whole code (1/127 of its scale), and the eigenbasis of a
//   rank-deficient factor (SOAP's first refresh of a non-square block) is arbitrary in its null
//   space, so the last bits choose it. The H100 measured 4e-3 to 5.5e-3 (quantized Shampoo) and
//   0.12 (SOAP's 20 x 12 parameter with 8 x 4 blocks, on 3 and 4 ranks).
// Both reproduce on the host when every batched product's last bits are made to depend on its
// batch count (an experiment, not committed; docs/portability.md has the figures), so a device
// build measures the second kind where it runs the test: it runs one rank's steps again with
// every gradient element moved by one ulp (nudge_last_bits, two patterns) and allows a split run
// four times the largest deviation those reruns show (rounding_sensitivity), never less than the
// floor above. In that emulation, split quantized Shampoo reached 0.25 of its allowance and
// SOAP's "dense" 0.22; so the device check of these cases guards against gross errors only (the
// quantized allowance is ~2e-2), while the host suite holds every case to equal bits.
#include <lather/optim/optimizer.hpp>

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace lather::test {

template <class MemorySpace>
inline constexpr bool bits_reproduce_across_splits =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

/// Relative tolerance (on 1 + |expected|) of a split step against one rank's, before any
/// measured sensitivity.
template <class MemorySpace>
inline constexpr float split_step_tolerance = bits_reproduce_across_splits<MemorySpace> ? 1e-6f : 1e-4f;

/// What a split run is held to where a device build measured how far one rank's own result moves
/// under last-bit changes of its inputs (`sensitivity`, in the units of the comparison): the
/// split perturbs every product, the reruns only the inputs, hence the factor.
template <class MemorySpace>
double split_allowance(double floor, double sensitivity) {
  return bits_reproduce_across_splits<MemorySpace> ? floor : std::max(floor, 4 * sensitivity);
}

/// The patterns of the nudged reruns (nudge_last_bits' salts are made from them): two, so that
/// one rerun's luck in missing a flip is less likely to set the allowance.
inline constexpr std::uint64_t nudge_patterns[] = {1, 2};

/// Moves every element of `values` by one ulp, up or down by a pattern that `salt` picks.
template <class T, std::enable_if_t<std::is_floating_point<T>::value, int> = 0>
void nudge_last_bits(std::vector<T>& values, std::uint64_t salt) {
  for (std::size_t k = 0; k < values.size(); ++k) {
    std::uint64_t h = (salt + 1) * 0x9E3779B97F4A7C15ull ^ std::uint64_t(k);
    h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
    values[k] =
        std::nextafter(values[k], (h & 1) ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
  }
}

/// nudge_last_bits on every tensor of a list (any memory space), tensor p with salt `salt` + p.
template <class T, class... Properties>
void nudge_last_bits(const std::vector<Kokkos::View<T*, Properties...>>& tensors, std::uint64_t salt) {
  for (std::size_t p = 0; p < tensors.size(); ++p) {
    auto h = Kokkos::create_mirror_view(tensors[p]);
    Kokkos::deep_copy(h, tensors[p]);
    std::vector<T> v(h.data(), h.data() + h.size());
    nudge_last_bits(v, salt * 1000003u + p);
    std::copy(v.begin(), v.end(), h.data());
    Kokkos::deep_copy(tensors[p], h);
  }
}

/// The largest |got - want| / (1 + |want|) over the elements, and where (what the device builds
/// print, so that their tolerance stays a measured figure).
template <class T>
std::pair<double, std::size_t> largest_deviation(const std::vector<T>& got, const std::vector<T>& want) {
  std::pair<double, std::size_t> worst{0.0, 0};
  for (std::size_t k = 0; k < std::min(got.size(), want.size()); ++k) {
    const double d = std::fabs(double(got[k]) - double(want[k])) / (1 + std::fabs(double(want[k])));
    if (std::isnan(d)) return {d, k};  // a NaN is the worst, and fails any comparison
    if (d > worst.first) worst = {d, k};
  }
  return worst;
}

/// How far one rank's results moved under last-bit changes of its gradients: for each parameter
/// the largest deviation of any nudged rerun from the plain run (`want`). With `model_wide`,
/// every parameter gets the whole model's largest: a quantized code flips as a rare event, so a
/// parameter whose reruns flipped none may flip one in the split run (on the host emulation,
/// quantized Shampoo's "tall" moved 2.3e-4 in the reruns and 5.4e-3 split), while the model's
/// largest says what one flip does.
template <class T>
std::vector<double> rounding_sensitivity(const std::vector<std::vector<std::vector<T>>>& nudged_runs,
                                         const std::vector<std::vector<T>>& want, bool model_wide) {
  std::vector<double> worst(want.size(), 0.0);
  for (const auto& run : nudged_runs)
    for (std::size_t p = 0; p < std::min(run.size(), want.size()); ++p)
      worst[p] = std::max(worst[p], largest_deviation(run[p], want[p]).first);
  if (model_wide && !worst.empty())
    std::fill(worst.begin(), worst.end(), *std::max_element(worst.begin(), worst.end()));
  return worst;
}

/// Values of a split run against one rank's within split_allowance (relative to 1 + |want|).
template <class MemorySpace, class T>
void expect_split_close(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                        double sensitivity = 0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto [deviation, at] = largest_deviation(got, want);
  const double allowed = split_allowance<MemorySpace>(split_step_tolerance<MemorySpace>, sensitivity);
  if (!bits_reproduce_across_splits<MemorySpace>)
    std::printf("split-step deviation, %s: %.3g (allowed %.3g)\n", what.c_str(), deviation, allowed);
  EXPECT_LE(deviation, allowed) << what << " element " << at << ": " << got[at] << " against " << want[at];
}

/// The values of a split run against one rank's: equal bits where they reproduce, else within
/// split_allowance.
template <class MemorySpace, class T>
void expect_same_values(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                        double sensitivity = 0) {
  if (bits_reproduce_across_splits<MemorySpace>)
    EXPECT_EQ(got, want) << what;
  else
    expect_split_close<MemorySpace>(got, want, what, sensitivity);
}

/// How far one state array's bytes are from another's: for floats the largest |got - want| /
/// (1 + |want|), for quantized codes the largest difference in codes; 0 or infinity for others
/// (equal or not).
inline double state_deviation(const std::vector<char>& got, const std::vector<char>& want, optim::DType dtype) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  const auto values = [](const std::vector<char>& bytes, auto zero) {
    std::vector<decltype(zero)> v(bytes.size() / sizeof(zero));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(zero));
    return v;
  };
  const auto codes = [](const auto& g, const auto& w) {
    double worst = 0;
    for (std::size_t k = 0; k < g.size(); ++k) worst = std::max(worst, std::fabs(double(g[k]) - double(w[k])));
    return worst;
  };
  switch (dtype) {
    case optim::DType::float32:
      return largest_deviation(values(got, float()), values(want, float())).first;
    case optim::DType::float64:
      return largest_deviation(values(got, double()), values(want, double())).first;
    case optim::DType::int8:
      return codes(values(got, std::int8_t()), values(want, std::int8_t()));
    case optim::DType::int16:
      return codes(values(got, std::int16_t()), values(want, std::int16_t()));
    default:
      return got == want ? 0.0 : std::numeric_limits<double>::infinity();
  }
}

/// One state array's bytes of a split run against one rank's: equal bytes where bits reproduce;
/// else floats within split_allowance, quantized codes within one code or four times the nudged
/// reruns' difference (`sensitivity`, state_deviation of those reruns), other types equal.
template <class MemorySpace>
void expect_same_state(const std::vector<char>& got, const std::vector<char>& want, optim::DType dtype,
                       const std::string& what, double sensitivity = 0) {
  if (bits_reproduce_across_splits<MemorySpace>) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  const bool codes = dtype == optim::DType::int8 || dtype == optim::DType::int16;
  const double deviation = state_deviation(got, want, dtype);
  const double allowed =
      split_allowance<MemorySpace>(codes ? 1.0 : double(split_step_tolerance<MemorySpace>), sensitivity);
  std::printf("split-step state deviation, %s: %.3g (allowed %.3g)\n", what.c_str(), deviation, allowed);
  EXPECT_LE(deviation, allowed) << what;
}

}  // namespace lather::test
