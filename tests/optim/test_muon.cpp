// Muon on one rank: the Newton-Schulz orthogonalization against an SVD (closed form), 30-step
// trajectories against optax.contrib.muon (tests/data/muon_reference/*.json, made by
// scripts/muon_reference.py), the matrix/AdamW plan, a checkpoint round trip and the options'
// errors.
#include <lather/optim/impl/muon_impl.hpp>
#include <lather/optim/muon.hpp>

#include "common/state_bytes.hpp"
#include "optim/reference_options.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

// LAPACK's SVD (column-major), with the hidden string-length arguments of gfortran and ifort.
extern "C" void dgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, double* a, const int* lda,
                        double* s, double* u, const int* ldu, double* vt, const int* ldvt, double* work,
                        const int* lwork, int* info, std::size_t jobu_len, std::size_t jobvt_len);

namespace {

using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
namespace fs = std::filesystem;

/// Thin SVD of the column-major m x n matrix `a`: u (m x r), s (r), vt (r x n), column-major.
struct Svd {
  std::vector<double> u, s, vt;
};
Svd svd(std::vector<double> a, int m, int n) {
  const int r = std::min(m, n);
  Svd out{std::vector<double>(std::size_t(m) * r), std::vector<double>(r), std::vector<double>(std::size_t(r) * n)};
  int lwork = -1, info = 0;
  double query = 0;
  dgesvd_("S", "S", &m, &n, a.data(), &m, out.s.data(), out.u.data(), &m, out.vt.data(), &r, &query, &lwork, &info, 1,
          1);
  lwork = int(query);
  std::vector<double> work(std::size_t(std::max(lwork, 1)));
  dgesvd_("S", "S", &m, &n, a.data(), &m, out.s.data(), out.u.data(), &m, out.vt.data(), &r, work.data(), &lwork, &info,
          1, 1);
  EXPECT_EQ(info, 0);
  return out;
}

/// Row-major U diag(d) V^T from a thin SVD (column-major factors).
std::vector<double> compose(const Svd& f, const std::vector<double>& d, int m, int n) {
  const int r = int(d.size());
  std::vector<double> out(std::size_t(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < r; ++k)
        out[std::size_t(i) * n + j] += f.u[std::size_t(k) * m + i] * d[k] * f.vt[std::size_t(j) * r + k];
  return out;
}

double relative_difference(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t k = 0; k < want.size(); ++k)
    diff += (got[k] - want[k]) * (got[k] - want[k]), norm += want[k] * want[k];
  return std::sqrt(diff / std::max(norm, 1e-300));
}

template <class Scalar>
class NewtonSchulz : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(NewtonSchulz, Scalars);

// Reference: for X0 = U S V^T the iteration only acts on the singular values (every step is an
// odd polynomial in X: X -> U p(S) V^T), so NS(X0) = U q(S / (||S||_F + eps)) V^T with q the
// 5-fold composition of p(s) = a s + b s^3 + c s^5, evaluated in double. That closed form is
// exact; the only differences are the GEMMs' rounding in Scalar and the rounding of X0 to
// Scalar. The quintic with Jordan's coefficients does not converge to U V^T: its fixed points
// oscillate, and five steps from any s in [0.01, 1] land in [0.6818, 1.1344] (evaluated on a
// grid of 2e5 points). Tolerance: in float a GEMM of inner size <= 40 has relative error
// <= ~40 * 6e-8 = 2.4e-6 per entry in the worst case (typically ~1e-7), the polynomial's slope
// is at most a = 3.44 in magnitude, and 15 GEMMs follow each other: the measured error is
// ~1e-6, we allow 2e-5; in double the same argument gives ~1e-14, we allow 1e-12.
TYPED_TEST(NewtonSchulz, MatchesTheSingularValuePolynomial) {
  using Scalar = TypeParam;
  const double tolerance = std::is_same<Scalar, float>::value ? 2e-5 : 1e-12;
  const std::array<double, 3> abc{3.4445, -4.7750, 2.0315};
  Impl::NewtonSchulzWorkspace<Space, Scalar> ws;
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{{12, 9}, {9, 12}, {16, 16}, {5, 40}, {40, 3}, {1, 7}}) {
    // Random singular vectors (the SVD of a deterministic matrix), singular values 0.3 .. 1.
    std::vector<double> g(std::size_t(m) * n);
    for (std::size_t k = 0; k < g.size(); ++k)
      g[k] = std::sin(1.7 * double(k) + 0.3 * m) + 0.5 * std::cos(0.9 * double(k * k % 97));
    const auto factors = svd(g, m, n);
    const int r = std::min(m, n);
    std::vector<double> s(r);
    for (int k = 0; k < r; ++k) s[k] = r == 1 ? 1.0 : 0.3 + 0.7 * double(k) / double(r - 1);
    const auto x0 = compose(factors, s, m, n);
    Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> x("x", m, n), out("out", m, n);
    auto host = Kokkos::create_mirror_view(x);
    double norm2 = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        host(i, j) = Scalar(x0[std::size_t(i) * n + j]);
        norm2 += double(host(i, j)) * double(host(i, j));
      }
    Kokkos::deep_copy(x, host);
    Impl::newton_schulz<Space, Scalar>(Space(), x, out, abc, 5, 1e-8, ws);
    Kokkos::deep_copy(host, out);
    std::vector<double> got(std::size_t(m) * n);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) got[std::size_t(i) * n + j] = double(host(i, j));

    std::vector<double> q(r);
    for (int k = 0; k < r; ++k) {
      double v = s[k] / (std::sqrt(norm2) + 1e-8);
      for (int step = 0; step < 5; ++step) v = abc[0] * v + abc[1] * v * v * v + abc[2] * v * v * v * v * v;
      q[k] = v;
    }
    const double error = relative_difference(got, compose(factors, q, m, n));
    EXPECT_LE(error, tolerance) << m << " x " << n;
    std::printf("Newton-Schulz %d x %d (%s): relative error vs U q(S) V^T %.3g\n", m, n,
                std::is_same<Scalar, float>::value ? "float" : "double", error);

    // Not U V^T, but the same singular vectors with singular values in the quintic's band.
    std::vector<double> column_major(got.size());
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) column_major[std::size_t(j) * m + i] = got[std::size_t(i) * n + j];
    const auto out_svd = svd(column_major, m, n);
    for (double v : out_svd.s) {
      EXPECT_GE(v, 0.68) << m << " x " << n;
      EXPECT_LE(v, 1.135) << m << " x " << n;
    }
  }
}

TEST(NewtonSchulz, ZeroStaysZero) {  // eps keeps 0 / (0 + eps) finite
  Impl::NewtonSchulzWorkspace<Space, float> ws;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("x", 3, 4);
  Impl::newton_schulz<Space, float>(Space(), x, x, {3.4445, -4.7750, 2.0315}, 5, 1e-8, ws);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(host(i, j), 0.0f);
}

// ---- optax.contrib.muon trajectories --------------------------------------------------------------

std::vector<std::string> reference_files() {
  std::vector<std::string> files;
  const fs::path dir = fs::path(LATHER_TEST_DATA_DIR) / "muon_reference";
  if (fs::exists(dir))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

class ReferenceTrajectory : public ::testing::TestWithParam<std::string> {};

// The reference runs in float32 as we do; what differs is the order of float32 operations (BLAS
// versus XLA GEMMs and sums, the bias corrections). The script reruns each set in float64: the
// float32 trajectory is within 1.3e-6 (relative, per parameter) of that one after 30 steps, so
// float32 rounding moves a trajectory by ~1e-6 and does not grow chaotically over these 30 steps.
// Two float32 implementations should then agree to a few 1e-6 (measured: <= 3.4e-7); 1e-4
// leaves a factor ~50 for unlucky accumulation while still catching formula differences: the
// Nesterov bias correction off by one step (1 - beta^t for 1 - beta^(t+1)) gives 3.5e-3 and
// 5.8e-3 on the two Nesterov sets.
TEST_P(ReferenceTrajectory, ThirtyStepsMatchOptax) {
  std::ifstream in(GetParam());
  const auto doc = nlohmann::json::parse(in);
  const auto options = lather::test::muon_reference_options(doc.at("options"));
  std::vector<ParameterSpec> specs;
  for (const auto& p : doc.at("parameters")) specs.push_back({p.at("name"), p.at("shape").get<lather::TensorShape>()});
  lather::ParameterList<float, Mem> params(Space(), specs);
  Muon<Space, float> muon(Space(), params, options);

  // The optimizer takes the same parameters for Muon as the reference did.
  std::vector<std::string> matrices;
  for (std::size_t p = 0; p < specs.size(); ++p)
    if (muon.plan()[p].matrix) matrices.push_back(specs[p].name);
  EXPECT_EQ(matrices, doc.at("muon_parameters").get<std::vector<std::string>>());

  const std::size_t count = specs.size();
  const auto& records = doc.at("records");
  for (std::size_t p = 0; p < count; ++p) {
    std::vector<float> initial(std::size_t(lather::element_count(specs[p].shape)));
    for (std::size_t k = 0; k < initial.size(); ++k)
      initial[k] = float(std::cos(0.23 * double(k + 1) + 0.7 * double(p)));
    ASSERT_EQ(records[0]["params"][specs[p].name].get<std::vector<float>>(), initial) << specs[p].name;
    params.set_value(Space(), p, initial);
  }
  std::size_t next_record = 1;
  const int steps = doc.at("steps");
  double worst = 0;
  for (int t = 0; t < steps; ++t) {
    for (std::size_t p = 0; p < count; ++p) {
      const auto x = params.host_value(Space(), p);
      std::vector<float> g(x.size());
      for (std::size_t k = 0; k < x.size(); ++k)
        g[k] = float(0.1 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
      Kokkos::deep_copy(params.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
    }
    muon.step(Space(), params);
    if (next_record < records.size() && records[next_record]["step"] == t + 1) {
      for (std::size_t p = 0; p < count; ++p) {
        const auto want = records[next_record]["params"][specs[p].name].get<std::vector<double>>();
        const auto got = params.host_value(Space(), p);
        const double relative = relative_difference(std::vector<double>(got.begin(), got.end()), want);
        worst = std::max(worst, relative);
        EXPECT_LE(relative, 1e-4) << doc.at("name") << ": parameter " << specs[p].name << " after step " << t + 1;
        if (std::getenv("LATHER_TRACE")) std::printf("  step %d %-9s %.3g\n", t + 1, specs[p].name.c_str(), relative);
      }
      ++next_record;
    }
  }
  EXPECT_EQ(next_record, records.size()) << "not every record was compared";
  std::printf("%s: worst relative error vs optax %.3g over %d steps\n", doc.at("name").get<std::string>().c_str(),
              worst, steps);
}

INSTANTIATE_TEST_SUITE_P(Optax, ReferenceTrajectory, ::testing::ValuesIn(reference_files()),
                         [](const auto& info) { return fs::path(info.param).stem().string(); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ReferenceTrajectory);

TEST(ReferenceTrajectory, DataIsPresent) { EXPECT_GE(reference_files().size(), 2u); }

// ---- plan, state, options ----------------------------------------------------------------------------

TEST(Muon, PlanFlattensAndBalances) {
  MuonOptions options;
  options.adamw_parameters = {"embedding"};
  const std::vector<ParameterSpec> specs{{"bias", {7}},          {"scalar", {}},         {"dense", {12, 9}},
                                         {"conv", {3, 3, 4, 5}}, {"embedding", {50, 8}}, {"big", {32, 32}}};
  const auto plan = plan_muon(specs, options, 2);
  EXPECT_FALSE(plan[0].matrix);
  EXPECT_FALSE(plan[1].matrix);
  EXPECT_FALSE(plan[4].matrix);
  ASSERT_TRUE(plan[3].matrix);
  EXPECT_EQ(plan[3].rows, 3);
  EXPECT_EQ(plan[3].columns, 60);
  EXPECT_EQ(plan[3].cost(), 3.0 * 60 * 3);
  // "big" (32^3) alone on one rank, "dense" (12*9*9) and "conv" (540) on the other.
  EXPECT_EQ(plan[5].owner, 0);
  EXPECT_EQ(plan[2].owner, 1);
  EXPECT_EQ(plan[3].owner, 1);
  options.adamw_parameters = {"missing"};
  EXPECT_THROW(plan_muon(specs, options, 2), lather::Error);
}

TEST(Muon, CheckpointRoundTrip) {
  const std::vector<ParameterSpec> specs{{"bias", {5}}, {"w", {6, 4}}, {"conv", {2, 3, 4}}};
  MuonOptions options;
  options.learning_rate = 0.05;
  const auto run = [&](Muon<Space, float>& muon, lather::ParameterList<float, Mem>& params, int first, int steps) {
    for (int t = first; t < first + steps; ++t) {
      for (std::size_t p = 0; p < specs.size(); ++p) {
        std::vector<float> g(params.value(p).extent(0));
        for (std::size_t k = 0; k < g.size(); ++k) g[k] = float(std::sin(0.5 * double(k) + t + 2.0 * double(p)));
        Kokkos::deep_copy(params.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
      }
      muon.step(Space(), params);
    }
  };
  lather::ParameterList<float, Mem> a(Space(), specs), b(Space(), specs);
  Muon<Space, float> first(Space(), a, options);
  run(first, a, 0, 3);
  // Save: the arrays' bytes on the host.
  const auto saved = lather::test::state_bytes(first.state_arrays(Space()));
  first.state_released();
  // Restore into a fresh optimizer with the same parameter values, then both go on alike.
  Muon<Space, float> second(Space(), b, options);
  for (std::size_t p = 0; p < specs.size(); ++p) b.set_value(Space(), p, a.host_value(Space(), p));
  const auto arrays = second.state_arrays(Space());
  ASSERT_EQ(arrays.size(), saved.size());
  EXPECT_EQ(arrays.size(), 1u + 2u + 1u + 1u);  // step, bias mu/nu, w and conv momentum
  lather::test::fill_state(arrays, saved);
  second.state_restored(Space(), 3);
  EXPECT_EQ(second.step_count(), 3);
  run(first, a, 3, 4);
  run(second, b, 3, 4);
  for (std::size_t p = 0; p < specs.size(); ++p)
    EXPECT_EQ(a.host_value(Space(), p), b.host_value(Space(), p)) << specs[p].name;
}

TEST(Muon, ReportsAndDescribes) {
  Muon<Space, float> muon(Space(), {{"b", {3}}, {"w", {4, 6}}}, MuonOptions());
  EXPECT_EQ(muon.name(), "muon");
  const auto report = muon.memory_report();
  EXPECT_EQ(report.local_bytes, std::int64_t((2 * 3 + 24) * sizeof(float)));
  EXPECT_EQ(report.workspace_bytes, std::int64_t((2 * 24 + 2 * 16) * sizeof(float)));  // 4 x 6: X, Y, A, B
  const auto d = muon.describe();
  EXPECT_EQ(d.front(), (std::pair<std::string, std::string>{"optimizer", "muon"}));
}

TEST(Muon, BadOptionsAreNamed) {
  using Change = void (*)(MuonOptions&);
  const std::vector<std::pair<std::string, Change>> cases{
      {"MuonOptions::beta", [](MuonOptions& o) { o.beta = 1.0; }},
      {"MuonOptions::ns_steps", [](MuonOptions& o) { o.ns_steps = -1; }},
      {"MuonOptions::ns_coefficients[1]", [](MuonOptions& o) { o.ns_coefficients[1] = std::nan(""); }},
      {"MuonOptions::epsilon", [](MuonOptions& o) { o.epsilon = 0; }},
      {"MuonOptions::weight_decay", [](MuonOptions& o) { o.weight_decay = -0.1; }},
      {"MuonOptions::adam_beta2", [](MuonOptions& o) { o.adam_beta2 = 1.5; }},
      {"MuonOptions::adam_epsilon", [](MuonOptions& o) { o.adam_epsilon = -1; }},
      {"MuonOptions::adamw_parameters", [](MuonOptions& o) { o.adamw_parameters = {"v"}; }},  // not a parameter
      {"MuonOptions::adamw_parameters",
       [](MuonOptions& o) {
         o.adamw_parameters = {"w", "w"};
       }},
      {"learning rate", [](MuonOptions& o) { o.learning_rate = -1.0; }},
  };
  for (const auto& [field, change] : cases) {
    MuonOptions o;
    change(o);
    try {
      Muon<Space, float> muon(Space(), {{"w", {3, 3}}}, o);
      ADD_FAILURE() << field << " was accepted";
    } catch (const lather::Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

}  // namespace
