// 30-step trajectories of Lather's Shampoo against the JAX reference (optax-shampoo 0.0.6), from
// tests/data/shampoo_reference/*.json, made by scripts/shampoo_reference.py (regenerate with
// scripts/regenerate-reference-data). Parameters, statistics and gradients are float32 on both
// sides and roots are computed in float64 on both sides (the reference under jax_enable_x64);
// what remains is float32 rounding in a different operation order, which stays well below the
// acceptance bound of 1e-4 relative error per parameter over 30 steps.
#include <lather/optim/shampoo.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
namespace fs = std::filesystem;

std::vector<std::string> reference_files() {
  std::vector<std::string> files;
  const fs::path dir = fs::path(LATHER_TEST_DATA_DIR) / "shampoo_reference";
  if (fs::exists(dir))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

class ReferenceTrajectory : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTrajectory, ThirtyStepsMatchJax) {
  std::ifstream in(GetParam());
  const auto doc = nlohmann::json::parse(in);
  lather::optim::ShampooOptions options;
  for (const auto& [key, value] : doc.at("options").items()) {
    // pmap's axis name only selects the reference's data-parallel code path, which is Lather's
    // only path (and the one where the reference quantizes statistics).
    if (key == "batch_axis_name") continue;
    const std::string text = value.is_null() ? "none" : value.is_string() ? value.get<std::string>() : value.dump();
    lather::optim::set_option(options, key, text);
  }
  if (!doc.value("x64_roots", true)) options.root.compute_precision = lather::linalg::Precision::float32;

  std::vector<lather::optim::ParameterSpec> specs;
  for (const auto& p : doc.at("parameters")) specs.push_back({p.at("name"), p.at("shape").get<lather::TensorShape>()});
  lather::optim::Shampoo<Space, float> shampoo(Space(), specs, options);

  // Initial parameters and gradients by the script's formulas (computed in double, rounded once).
  const std::size_t count = specs.size();
  std::vector<std::vector<float>> params(count);
  lather::TensorList<float, Mem> device_params, device_grads;
  for (std::size_t p = 0; p < count; ++p) {
    const auto n = lather::element_count(specs[p].shape);
    for (std::int64_t k = 0; k < n; ++k) params[p].push_back(float(std::cos(0.23 * (k + 1) + 0.7 * p)));
    device_params.push_back(lather::FlatTensor<float, Mem>("param", n));
    device_grads.push_back(lather::FlatTensor<float, Mem>("grad", n));
  }
  const auto& records = doc.at("records");
  ASSERT_EQ(records.at(0).at("step"), 0);
  for (std::size_t p = 0; p < count; ++p) {
    const auto want = records[0]["params"][specs[p].name].get<std::vector<float>>();
    ASSERT_EQ(want, params[p]) << "initial values of " << specs[p].name << " differ from the formula";
  }
  for (std::size_t p = 0; p < count; ++p) {
    auto host = Kokkos::create_mirror_view(device_params[p]);
    for (std::size_t k = 0; k < params[p].size(); ++k) host(k) = params[p][k];
    Kokkos::deep_copy(device_params[p], host);
  }

  std::size_t next_record = 1;
  const int steps = doc.at("steps");
  double worst = 0;
  for (int t = 0; t < steps; ++t) {
    for (std::size_t p = 0; p < count; ++p) {
      auto host_p = Kokkos::create_mirror_view(device_params[p]);
      Kokkos::deep_copy(host_p, device_params[p]);
      auto host_g = Kokkos::create_mirror_view(device_grads[p]);
      for (std::size_t k = 0; k < host_p.size(); ++k)
        host_g(k) = float(0.1 * double(host_p(k)) + std::sin(0.37 * (k + 1) + 1.3 * (t + 1) + 0.61 * p));
      Kokkos::deep_copy(device_grads[p], host_g);
    }
    shampoo.step(Space(), device_params, device_grads);
    if (next_record < records.size() && records[next_record]["step"] == t + 1) {
      for (std::size_t p = 0; p < count; ++p) {
        const auto want = records[next_record]["params"][specs[p].name].get<std::vector<double>>();
        auto host = Kokkos::create_mirror_view(device_params[p]);
        Kokkos::deep_copy(host, device_params[p]);
        double diff = 0, norm = 0;
        for (std::size_t k = 0; k < want.size(); ++k) {
          diff += (host(k) - want[k]) * (host(k) - want[k]);
          norm += want[k] * want[k];
        }
        const double relative = std::sqrt(diff / std::max(norm, 1e-300));
        worst = std::max(worst, relative);
        EXPECT_LE(relative, 1e-4) << doc.at("name") << ": parameter " << specs[p].name << " after step " << t + 1;
        if (std::getenv("LATHER_TRACE"))  // per-parameter errors, for diagnosing a failure
          std::printf("  step %d %-8s %.3g\n", t + 1, specs[p].name.c_str(), relative);
      }
      ++next_record;
    }
  }
  EXPECT_EQ(next_record, records.size()) << "not every record was compared";
  std::printf("%s: worst relative error %.3g over %d steps\n", doc.at("name").get<std::string>().c_str(), worst, steps);
}

INSTANTIATE_TEST_SUITE_P(Jax, ReferenceTrajectory, ::testing::ValuesIn(reference_files()),
                         [](const auto& info) { return fs::path(info.param).stem().string(); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ReferenceTrajectory);

TEST(ReferenceTrajectory, DataIsPresent) { EXPECT_GE(reference_files().size(), 4u); }

}  // namespace
