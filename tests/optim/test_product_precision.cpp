// Reduced-precision products in the optimizers (ShampooOptions::product_precision,
// SoapOptions::product_precision, MuonOptions::newton_schulz_precision): each optimizer with its
// products' inputs rounded to TF32 or bfloat16 against the same optimizer in float32, on the
// problems and options of the reference trajectories (tests/data/*_reference), and the options'
// errors. On a host backend the rounding is emulated (lather/core/gemm.hpp), so these are the
// numerics of the option, which tests/core/test_product_precision.cpp checks product by product.
//
// What the tests compare: the first update (the parameters' displacement after one update, with
// the reduced and the float32 products, relative in the 2-norm, per parameter) and whole 30-step
// trajectories (|x - x_float32| / (|x_float32| + 0.1), the largest over elements and steps,
// against the parameters' movement on the same scale, as tests/optim/test_soap.cpp compares
// quantized SOAP).
#include <lather/core/error.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/sharded_muon.hpp>
#include <lather/optim/soap.hpp>

#include "optim/reference_options.hpp"
#include "optim/reference_problem.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using lather::ProductPrecision;
using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
namespace fs = std::filesystem;
using Values = std::vector<std::vector<float>>;  // per parameter
using Make = std::function<std::unique_ptr<Optimizer<Space, float>>(ProductPrecision)>;

double unit_roundoff(ProductPrecision precision) { return std::ldexp(1.0, -lather::significand_bits(precision)); }

/// The gradient formulas of the reference scripts: Shampoo's and Muon's (scripts/shampoo_reference.py,
/// scripts/muon_reference.py) and SOAP's (lather::test::reference_gradient_value).
enum class Gradients { sine, soap };

/// The parameters' values at the start and after each of `steps` steps.
std::vector<Values> trajectory(const std::vector<ParameterSpec>& specs, const Make& make, ProductPrecision precision,
                               Gradients formula, int steps) {
  lather::ParameterList<float, Mem> params(Space(), specs);
  for (std::size_t p = 0; p < specs.size(); ++p) {
    std::vector<float> initial(std::size_t(lather::element_count(specs[p].shape)));
    for (std::size_t k = 0; k < initial.size(); ++k)
      initial[k] = lather::test::reference_initial_value(std::int64_t(k), p);
    params.set_value(Space(), p, initial);
  }
  const auto optimizer = make(precision);
  std::vector<Values> out;
  const auto record = [&] {
    Values v;
    for (std::size_t p = 0; p < specs.size(); ++p) v.push_back(params.host_value(Space(), p));
    out.push_back(std::move(v));
  };
  record();
  for (int t = 0; t < steps; ++t) {
    for (std::size_t p = 0; p < specs.size(); ++p) {
      const auto& x = out.back()[p];
      std::vector<float> g(x.size());
      for (std::size_t k = 0; k < x.size(); ++k)
        g[k] =
            formula == Gradients::soap
                ? lather::test::reference_gradient_value(x[k], std::int64_t(k), p, t)
                : float(0.1 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
      Kokkos::deep_copy(params.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
    }
    optimizer->step(Space(), params);
    record();
  }
  return out;
}

/// The largest over parameters of ||d - d32|| / ||d32||, d the displacement from `before` to
/// `after` (parameters that did not move are skipped).
double displacement_error(const Values& before, const Values& after, const Values& after32) {
  double worst = 0;
  for (std::size_t p = 0; p < before.size(); ++p) {
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < before[p].size(); ++k) {
      const double d = double(after[p][k]) - before[p][k], d32 = double(after32[p][k]) - before[p][k];
      diff += (d - d32) * (d - d32);
      norm += d32 * d32;
    }
    if (norm > 0) worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

double distance(const std::vector<float>& x, const std::vector<float>& y) {
  double sum = 0;
  for (std::size_t k = 0; k < x.size(); ++k) sum += (double(x[k]) - y[k]) * (double(x[k]) - y[k]);
  return std::sqrt(sum);
}

struct Deviation {
  /// displacement_error of the first step that moves the parameters (SOAP's first step only
  /// builds its factors; it moves nothing).
  double first_update = 0;
  /// The largest over parameters and steps t of ||x_t - x32_t|| / (the float32 path up to t,
  /// sum of ||x32_s - x32_(s-1)|| for s <= t): the deviation against how far the parameter went.
  double trajectory = 0;
  /// max |x - x32| / (|x32| + 0.1) over elements and steps, and the float32 run's movement
  /// max |x32 - x0| / (|x0| + 0.1) on the same scale (test_soap.cpp's measure).
  double elementwise = 0, movement = 0;
};

Deviation deviation(const std::vector<Values>& run, const std::vector<Values>& run32) {
  Deviation d;
  std::size_t first = 1;
  while (first + 1 < run32.size() && run32[first] == run32[first - 1]) ++first;
  d.first_update = displacement_error(run[first - 1], run[first], run32[first]);
  for (std::size_t t = 1; t < run.size(); ++t)
    for (std::size_t p = 0; p < run[t].size(); ++p)
      for (std::size_t k = 0; k < run[t][p].size(); ++k) {
        const double x = run[t][p][k], x32 = run32[t][p][k], x0 = run32[0][p][k];
        d.elementwise = std::max(d.elementwise, std::fabs(x - x32) / (std::fabs(x32) + 0.1));
        d.movement = std::max(d.movement, std::fabs(x32 - x0) / (std::fabs(x0) + 0.1));
      }
  for (std::size_t p = 0; p < run32[0].size(); ++p) {
    double path = 0;
    for (std::size_t t = 1; t < run.size(); ++t) {
      path += distance(run32[t][p], run32[t - 1][p]);
      if (path > 0) d.trajectory = std::max(d.trajectory, distance(run[t][p], run32[t][p]) / path);
    }
  }
  return d;
}

/// Each reduced precision's deviation from float32 on one problem, {tf32, bfloat16}.
std::array<Deviation, 2> deviations(const std::string& name, const std::vector<ParameterSpec>& specs, const Make& make,
                                    Gradients formula, int steps) {
  const auto run32 = trajectory(specs, make, ProductPrecision::float32, formula, steps);
  std::array<Deviation, 2> out;
  int i = 0;
  for (const auto precision : {ProductPrecision::tf32, ProductPrecision::bfloat16}) {
    const Deviation d = deviation(trajectory(specs, make, precision, formula, steps), run32);
    const double u = unit_roundoff(precision);
    std::printf(
        "%-40s %-8s first update %.3g (%.3g u), trajectory %.3g (%.3g u) of the path, elementwise %.3g of "
        "the movement %.3g\n",
        name.c_str(), lather::to_string(precision).c_str(), d.first_update, d.first_update / u, d.trajectory,
        d.trajectory / u, d.elementwise, d.movement);
    out[std::size_t(i++)] = d;
  }
  return out;
}

std::vector<nlohmann::json> reference_sets(const char* folder) {
  std::vector<nlohmann::json> out;
  for (const auto& file : lather::test::reference_files(fs::path(LATHER_TEST_DATA_DIR) / folder)) {
    std::ifstream in(file);
    out.push_back(nlohmann::json::parse(in));
  }
  return out;
}

std::vector<ParameterSpec> specs_of(const nlohmann::json& doc) {
  std::vector<ParameterSpec> specs;
  for (const auto& p : doc.at("parameters")) specs.push_back({p.at("name"), p.at("shape").get<lather::TensorShape>()});
  return specs;
}

// ---- Shampoo -----------------------------------------------------------------------------------

ShampooOptions shampoo_options_from(const nlohmann::json& doc) {
  ShampooOptions options;
  for (const auto& [key, value] : doc.at("options").items()) {
    if (key == "batch_axis_name") continue;
    const std::string text = value.is_null() ? "none" : value.is_string() ? value.get<std::string>() : value.dump();
    set_option(options, key, text);
  }
  return options;
}

/// How much a block's preconditioners can amplify a perturbation of the block against the block
/// itself: P = (S + eps lambda_max I)^(-1/p) has eigenvalues between ((1 + eps) lambda_max)^(-1/p)
/// and (eps lambda_max)^(-1/p), so the contraction of r preconditioned dimensions scales one
/// direction by at most ((1 + eps) / eps)^(r/p) more than another. With the default exponent
/// p = 2 r that is ((1 + eps) / eps)^(1/2) for every block; with exponent_override, r is taken as
/// the largest rank among the parameters (an upper bound on a block's preconditioned dimensions).
double shampoo_amplification(const ShampooOptions& o, const std::vector<ParameterSpec>& specs) {
  EXPECT_TRUE(o.relative_matrix_epsilon);
  std::size_t rank = 1;
  for (const auto& spec : specs) rank = std::max(rank, spec.shape.size());
  const double exponent = o.exponent_override == 0 ? 0.5 : double(rank) / double(o.exponent_override);
  return std::pow((1 + o.matrix_epsilon) / o.matrix_epsilon, exponent);
}

// The first preconditioned step (start_preconditioning_step 0), reduced against float32, on the
// problems and options of the JAX reference trajectories. The argument, with u the format's unit
// roundoff and A the amplification above:
// * each rounded input is a relative perturbation of at most u; the statistics' Gram inputs
//   (the block) and the contractions' inputs (each preconditioner and the tensor it contracts);
// * the statistics from one gradient block G have G's column space as their range: a rounding of
//   G changes them at first order only inside that range and between it and its complement, so
//   their eigenvectors turn by O(u) and the near-null eigenvalues (the ridge) stay at second
//   order;
// * the direction D = P_L G P_R then differs by O(u) in every direction of G, but a perturbation
//   along the weakest directions of the statistics (the rounded G's component outside the exact
//   G's range, the turned eigenvectors) is scaled up to A times more than G's strongest
//   directions, which set |D|;
// * grafting rescales D to the graft's norm, which is exact: the displacement's relative error is
//   D's, at most doubled by the normalisation.
// The first order sum of those sources is a few u A; we allow 2 u A (the sets have eps 1e-6 to
// 1e-2, A 10 to 1000; measured: 0.075 to 0.2 u A). The rounding must show (more than u / 10;
// float32's own rounding differences are 2^-24 relative, 200 and 1600 times below), and the
// deviation must scale with the format's u: bfloat16's u is 8 times TF32's, and the ratio of the
// deviations stays within a factor 3 of 8 (measured 5.2 to 9.5) where a product rounded to the
// wrong format, or one format for both, would give 1/8 or 1.
TEST(ShampooProductPrecision, FirstPreconditionedStepWithinTheRidgeBound) {
  const auto sets = reference_sets("shampoo_reference");
  ASSERT_GE(sets.size(), 4u);
  for (const auto& doc : sets) {
    const auto specs = specs_of(doc);
    ShampooOptions base = shampoo_options_from(doc);
    base.start_preconditioning_step = 0;
    base.preconditioning_compute_steps = 1;
    base.statistics_compute_steps = 1;
    const double amplification = shampoo_amplification(base, specs);
    const Make make = [&](ProductPrecision precision) {
      ShampooOptions o = base;
      o.product_precision = precision;
      return std::make_unique<Shampoo<Space, float>>(Space(), specs, o);
    };
    const std::string name = doc.at("name");
    const auto d = deviations("shampoo first step " + name, specs, make, Gradients::sine, 1);
    const double u[2] = {unit_roundoff(ProductPrecision::tf32), unit_roundoff(ProductPrecision::bfloat16)};
    for (int i = 0; i < 2; ++i) {
      EXPECT_LE(d[i].first_update, 2 * u[i] * amplification) << name << " " << i;
      EXPECT_GT(d[i].first_update, u[i] / 10) << name << " " << i << ": the rounding did not show";
    }
    const double ratio = d[1].first_update / d[0].first_update;
    EXPECT_GT(ratio, 8.0 / 3) << name;
    EXPECT_LT(ratio, 8.0 * 3) << name;
  }
}

// 30 steps of the JAX reference problems: the deviation from float32 against the path the
// parameters took (the sum of the float32 steps' lengths). Each step's update deviates by at most
// 2 u A of its size (above), and the deviations add up along the path; what they feed back
// through the gradients (0.1 x, times the learning rate) is a small fraction of that. Measured
// at most 0.76 u A (int16 statistics, whose quantization of the perturbed statistics adds to it).
TEST(ShampooProductPrecision, FollowsFloat32OnTheJaxReferenceProblems) {
  const auto sets = reference_sets("shampoo_reference");
  ASSERT_GE(sets.size(), 4u);
  for (const auto& doc : sets) {
    const auto specs = specs_of(doc);
    const ShampooOptions base = shampoo_options_from(doc);
    const double amplification = shampoo_amplification(base, specs);
    const Make make = [&](ProductPrecision precision) {
      ShampooOptions o = base;
      o.product_precision = precision;
      return std::make_unique<Shampoo<Space, float>>(Space(), specs, o);
    };
    const std::string name = doc.at("name");
    const auto d = deviations("shampoo " + name, specs, make, Gradients::sine, doc.at("steps"));
    const double u[2] = {unit_roundoff(ProductPrecision::tf32), unit_roundoff(ProductPrecision::bfloat16)};
    for (int i = 0; i < 2; ++i) {
      EXPECT_LE(d[i].trajectory, 2 * u[i] * amplification) << name << " " << i;
      EXPECT_GT(d[i].trajectory, u[i] / 10) << name << " " << i << ": the rounding did not show";
    }
  }
}

TEST(ShampooProductPrecision, OptionsAreCheckedAndNamed) {
  ShampooOptions o;
  EXPECT_EQ(option_value(o, "product_precision"), "float32");
  set_option(o, "product_precision", "bf16");
  EXPECT_EQ(o.product_precision, ProductPrecision::bfloat16);
  EXPECT_EQ(option_value(o, "product_precision"), "bfloat16");
  try {
    set_option(o, "product_precision", "int8");
    FAIL() << "int8 was accepted";
  } catch (const lather::Error& e) {
    EXPECT_EQ(e.message(), "unknown Shampoo option product_precision 'int8' (expected float32, tf32 or bfloat16)");
  }
  // The statistics in double make the products double: the option would change nothing.
  o.statistics_precision = lather::linalg::Precision::float64;
  try {
    o.validate();
    FAIL() << "bfloat16 products with float64 statistics were accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find("ShampooOptions::product_precision bfloat16"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("statistics_precision float64"), std::string::npos) << e.message();
  }
}

// ---- SOAP --------------------------------------------------------------------------------------

// SOAP has no per-step bound in u: its bases are eigenvectors of the factors, which a
// perturbation E turns by |E| / gap within a pair of eigenvalues gap apart, and its update
// divides every rotated coordinate by its own size (m / sqrt(v): a coordinate's step has the
// same size whatever the gradient's along it). Rounding the factors' inputs is a relative
// perturbation of ~2u (TF32 1e-3, bfloat16 8e-3), as large as the relative gaps of these problems'
// closest pairs (~1e-3), so the bases of those pairs turn by O(1) and their coordinates' steps
// with them: the first update differs by 2 to 36% of its length (measured). Over the trajectory
// that stays a small part of where the parameters go, as quantized SOAP's int16 bases do
// (test_soap.cpp): on test_soap's measure, TF32 within 2.9% of the movement and bfloat16 within
// 7.9% (measured). Bounds: three times those, 10% and 25%; a basis of the wrong factor, a
// rotation left out or a product rounded to nothing is an error of the size of the update (100%).
TEST(SoapProductPrecision, FollowsFloat32OnThePytorchReferenceProblems) {
  const auto sets = reference_sets("soap_reference");
  ASSERT_GE(sets.size(), 3u);
  for (const auto& doc : sets) {
    const auto specs = specs_of(doc);
    const SoapOptions base = lather::test::soap_reference_options(doc.at("options"));
    const Make make = [&](ProductPrecision precision) {
      SoapOptions o = base;
      o.product_precision = precision;
      return std::make_unique<Soap<Space, float>>(Space(), specs, o);
    };
    const std::string name = doc.at("name");
    const auto d = deviations("soap " + name, specs, make, Gradients::soap, doc.at("steps"));
    const double bound[2] = {0.1, 0.25};
    for (int i = 0; i < 2; ++i) {
      EXPECT_LE(d[i].elementwise, bound[i] * d[i].movement) << name << " " << i;
      EXPECT_GT(d[i].elementwise, 0.0) << name << " " << i << ": the rounding did not show";
    }
    EXPECT_GE(d[0].movement, 0.1) << name;
  }
}

TEST(SoapProductPrecision, DoubleSoapRefusesReducedProducts) {
  SoapOptions o;
  o.product_precision = ProductPrecision::tf32;
  try {
    Soap<Space, double> soap(Space(), {{"w", {4, 4}}}, o);
    FAIL() << "tf32 products of a double Soap were accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find("SoapOptions::product_precision tf32"), std::string::npos) << e.message();
  }
  // float32 is no change, and the option is part of what the ranks compare and checkpoints record.
  Soap<Space, float> soap(Space(), {{"w", {4, 4}}}, o);
  const auto described = soap.describe();
  EXPECT_NE(
      std::find(described.begin(), described.end(), std::pair<std::string, std::string>("product_precision", "tf32")),
      described.end());
}

// ---- Muon --------------------------------------------------------------------------------------

// Muon's update of a matrix is lr scale NS(M), NS the Newton-Schulz iteration: 5 (or 4)
// iterations of three products, X X^T, A A and B X, each rounding its two inputs, a relative
// perturbation of at most 2u of its result. An error made in one iteration reaches the output
// through the later iterations' polynomial p(s) = a s + b s^3 + c s^5 of the iterate's singular
// values s: its slope is at most 2 in magnitude on [0.68, 1.14], where the iterates end, and up
// to a = 3.4 on singular values still small. The worst case multiplies those gains over the
// iterations; rounding errors of random signs do not line up with the directions of largest gain,
// and the first-order sum of the 15 products' 2u at gain 1 is 30u. Bound: 32u on the relative
// change of the update (measured 2.4u to 11u), and the same on the 30-step path (each update
// deviates by that much of its length and the deviations add up along the path; measured at most
// 11u). The rounding must show (more than u / 10), and as for Shampoo the deviation scales with
// the format's u (bfloat16 / TF32 within a factor 3 of 8; measured 12 to 19: bfloat16's larger
// errors meet more of the polynomial's gain).
TEST(MuonProductPrecision, FollowsFloat32OnTheOptaxReferenceProblems) {
  const auto sets = reference_sets("muon_reference");
  ASSERT_GE(sets.size(), 2u);
  for (const auto& doc : sets) {
    const auto specs = specs_of(doc);
    const MuonOptions base = lather::test::muon_reference_options(doc.at("options"));
    const Make make = [&](ProductPrecision precision) {
      MuonOptions o = base;
      o.newton_schulz_precision = precision;
      return std::make_unique<Muon<Space, float>>(Space(), specs, o);
    };
    const std::string name = doc.at("name");
    const auto d = deviations("muon " + name, specs, make, Gradients::sine, doc.at("steps"));
    const double u[2] = {unit_roundoff(ProductPrecision::tf32), unit_roundoff(ProductPrecision::bfloat16)};
    for (int i = 0; i < 2; ++i) {
      EXPECT_LE(d[i].first_update, 32 * u[i]) << name << " " << i;
      EXPECT_LE(d[i].trajectory, 32 * u[i]) << name << " " << i;
      EXPECT_GT(d[i].first_update, u[i] / 10) << name << " " << i << ": the rounding did not show";
    }
    const double ratio = d[1].first_update / d[0].first_update;
    EXPECT_GT(ratio, 8.0 / 3) << name;
    EXPECT_LT(ratio, 8.0 * 3) << name;
  }
}

// ShardedMuon orthogonalizes the same whole matrices with the same products: on one rank it is
// Muon, reduced precision included, bit for bit.
TEST(MuonProductPrecision, ShardedMuonTakesTheOptionAlike) {
  const std::vector<ParameterSpec> specs{{"w", {12, 9}}, {"b", {5}}};
  MuonOptions o;
  o.newton_schulz_precision = ProductPrecision::bfloat16;
  const Make whole = [&](ProductPrecision) { return std::make_unique<Muon<Space, float>>(Space(), specs, o); };
  const Make sharded = [&](ProductPrecision) {
    return std::make_unique<ShardedMuon<Space, float>>(Space(), specs, o, lather::comm::Group());
  };
  const auto a = trajectory(specs, whole, o.newton_schulz_precision, Gradients::sine, 3);
  const auto b = trajectory(specs, sharded, o.newton_schulz_precision, Gradients::sine, 3);
  EXPECT_EQ(a, b);
  o.newton_schulz_precision = ProductPrecision::float32;
  EXPECT_NE(trajectory(specs, whole, o.newton_schulz_precision, Gradients::sine, 3), a);
}

TEST(MuonProductPrecision, DoubleMuonRefusesReducedProducts) {
  MuonOptions o;
  o.newton_schulz_precision = ProductPrecision::bfloat16;
  try {
    Muon<Space, double> muon(Space(), {{"w", {3, 3}}}, o);
    FAIL() << "bfloat16 products of a double Muon were accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find("MuonOptions::newton_schulz_precision bfloat16"), std::string::npos) << e.message();
  }
  const auto described = describe_muon(o);
  EXPECT_EQ(described.back(), (std::pair<std::string, std::string>("newton_schulz_precision", "bfloat16")));
}

}  // namespace
