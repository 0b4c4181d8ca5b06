// Shampoo against an independent plain model of the JAX reference (reference_shampoo.hpp), option
// by option, plus hand-checkable closed forms and the failure rules.
#include <lather/core/gemm.hpp>
#include <lather/core/host_blas_threads.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/optim/shampoo.hpp>

#include "common/host_copies.hpp"
#include "optim/reference_shampoo.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace {

using lather::optim::GraftType;
using lather::optim::ParameterSpec;
using lather::optim::PreconditionerType;
using lather::optim::Shampoo;
using lather::optim::ShampooOptions;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Shape = std::vector<std::int64_t>;

template <class T>
lather::TensorList<T, Mem> to_device(const std::vector<std::vector<double>>& host) {
  lather::TensorList<T, Mem> out;
  for (const auto& x : host) {
    Kokkos::View<T*, Mem> v("tensor", x.size());
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t k = 0; k < x.size(); ++k) h(k) = T(x[k]);
    Kokkos::deep_copy(v, h);
    out.push_back(v);
  }
  return out;
}

/// Parameters of either precision, in double for the reference.
template <class T>
std::vector<std::vector<double>> to_host(const lather::TensorList<T, Mem>& tensors) {
  return lather::test::host_vectors<double>(tensors);
}

/// Deterministic gradients that depend on the parameters, so errors would compound.
std::vector<std::vector<double>> gradients(const std::vector<std::vector<double>>& params, int t) {
  std::vector<std::vector<double>> g(params.size());
  for (std::size_t p = 0; p < params.size(); ++p)
    for (std::size_t k = 0; k < params[p].size(); ++k)
      g[p].push_back(0.1 * params[p][k] + std::sin(0.37 * (k + 1) + 1.3 * (t + 1) + 0.61 * p));
  return g;
}

std::vector<std::vector<double>> initial(const std::vector<Shape>& shapes) {
  std::vector<std::vector<double>> x(shapes.size());
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    std::int64_t n = 1;
    for (auto d : shapes[p]) n *= d;
    for (std::int64_t k = 0; k < n; ++k) x[p].push_back(std::cos(0.23 * (k + 1) + 0.7 * p));
  }
  return x;
}

const std::vector<Shape> mixed_shapes = {{}, {5}, {6, 4}, {3, 4, 2}, {2, 3, 2, 2}, {9, 5}, {12, 2}};

ShampooOptions to_shampoo(const lather::test::ReferenceOptions& r) {
  ShampooOptions o;
  o.learning_rate = lather::optim::LearningRateSchedule::constant(r.learning_rate);
  o.block_size = int(r.block_size);
  o.beta1 = r.beta1;
  o.beta2 = r.beta2;
  o.diagonal_epsilon = r.diagonal_epsilon;
  o.matrix_epsilon = r.matrix_epsilon;
  o.weight_decay = r.weight_decay;
  o.start_preconditioning_step = r.start_preconditioning_step;
  o.preconditioning_compute_steps = r.preconditioning_compute_steps;
  o.statistics_compute_steps = r.statistics_compute_steps;
  o.best_effort_shape_interpretation = r.best_effort_shape_interpretation;
  o.graft_type = GraftType(r.graft_type);
  o.nesterov = r.nesterov;
  o.exponent_override = r.exponent_override;
  o.moving_average_for_momentum = r.moving_average_for_momentum;
  o.skip_preconditioning_dim_size_gt = r.skip_preconditioning_dim_size_gt;
  o.clip_by_scaled_gradient_norm = r.clip_by_scaled_gradient_norm;
  o.merge_small_dims_block_size = r.merge_small_dims_block_size;
  o.skip_preconditioning_rank_lt = r.skip_preconditioning_rank_lt;
  o.decoupled_learning_rate = r.decoupled_learning_rate;
  o.decoupled_weight_decay = r.decoupled_weight_decay;
  o.inverse_failure_threshold = r.inverse_failure_threshold;
  o.root.tolerance = r.root_tolerance;
  o.root.max_iterations = r.root_max_iterations;
  o.statistics_precision = lather::linalg::Precision::float64;
  o.preconditioner_type = r.preconditioner_side == 1   ? lather::optim::PreconditionerType::input
                          : r.preconditioner_side == 2 ? lather::optim::PreconditionerType::output
                                                       : lather::optim::PreconditionerType::all;
  o.unpreconditioned_block_size = r.unpreconditioned_block_size;
  return o;
}

struct OptionCase {
  std::string name;
  std::function<void(lather::test::ReferenceOptions&)> set;
};

lather::test::ReferenceOptions base_options() {
  lather::test::ReferenceOptions r;
  r.learning_rate = 0.05;
  r.block_size = 4;
  r.merge_small_dims_block_size = 4;  // keeps the 3-D and 4-D shapes as they are
  r.skip_preconditioning_dim_size_gt = 10;
  r.start_preconditioning_step = 1;
  return r;
}

class AgainstModel : public ::testing::TestWithParam<OptionCase> {};

// Double parameters, statistics and roots: the model and Lather run the same algorithm with
// different summation orders (BLAS vs loops), ~1e-15 relative per operation; the roots amplify
// that by the condition of the ridged statistics (<= ~1e6 here) to ~1e-10, and ten steps of a
// smooth map keep it far below 1e-7.
TEST_P(AgainstModel, TenStepsAgree) {
  auto r = base_options();
  GetParam().set(r);
  const auto shapes = mixed_shapes;
  std::vector<ParameterSpec> specs;
  for (std::size_t p = 0; p < shapes.size(); ++p) specs.push_back({"p" + std::to_string(p), shapes[p]});
  Shampoo<Space, double> shampoo(Space(), specs, to_shampoo(r));
  lather::test::ReferenceShampoo model(shapes, r);
  auto params_model = initial(shapes);
  auto params = to_device<double>(params_model);
  for (int t = 0; t < 10; ++t) {
    const auto g = gradients(params_model, t);
    model.step(params_model, g);
    shampoo.step(Space(), params, to_device<double>(g));
    const auto got = to_host(params);
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      double diff = 0, norm = 0;
      for (std::size_t k = 0; k < got[p].size(); ++k) {
        diff = std::max(diff, std::fabs(got[p][k] - params_model[p][k]));
        norm = std::max(norm, std::fabs(params_model[p][k]));
      }
      ASSERT_LE(diff, 1e-7 * std::max(norm, 1.0)) << GetParam().name << " step " << t << " parameter " << p;
    }
    params_model = got;  // continue both from identical parameters
  }
}

const OptionCase option_cases[] = {
    {"sgd_graft_nesterov", [](auto&) {}},
    {"adagrad_graft", [](auto& r) { r.graft_type = 1; }},
    {"rmsprop_graft_clipped",
     [](auto& r) {
       r.graft_type = 2;
       r.clip_by_scaled_gradient_norm = 0.5;
       r.beta2 = 0.9;
     }},
    {"rmsprop_normalized_graft",
     [](auto& r) {
       r.graft_type = 3;
       r.beta2 = 0.99;
     }},
    {"sqrt_n_graft", [](auto& r) { r.graft_type = 4; }},
    {"adagrad_normalized_graft", [](auto& r) { r.graft_type = 5; }},
    {"nesterov_off", [](auto& r) { r.nesterov = false; }},
    {"moving_average_momentum",
     [](auto& r) {
       r.moving_average_for_momentum = true;
       r.beta1 = 0.8;
     }},
    {"weight_decay_coupled", [](auto& r) { r.weight_decay = 0.01; }},
    {"weight_decay_decoupled",
     [](auto& r) {
       r.weight_decay = 0.01;
       r.decoupled_weight_decay = true;
     }},
    {"coupled_learning_rate",
     [](auto& r) {
       r.decoupled_learning_rate = false;
       r.graft_type = 1;
     }},
    {"compute_steps",
     [](auto& r) {
       r.statistics_compute_steps = 2;
       r.preconditioning_compute_steps = 3;
     }},
    {"beta2_sum_and_exponent_override",
     [](auto& r) {
       r.beta2 = 1.0;
       r.exponent_override = 4;
     }},
    {"late_start",
     [](auto& r) {
       r.start_preconditioning_step = 4;
       r.graft_type = 2;
     }},
    {"no_shape_interpretation_big_blocks",
     [](auto& r) {
       r.best_effort_shape_interpretation = false;
       r.block_size = 128;
     }},
    {"merged_shapes",
     [](auto& r) {
       r.merge_small_dims_block_size = 4096;
       r.block_size = 128;
     }},
    {"biases_on_graft_path", [](auto& r) { r.skip_preconditioning_rank_lt = 2; }},
    {"one_sided_input", [](auto& r) { r.preconditioner_side = 1; }},
    {"one_sided_output",
     [](auto& r) {
       r.preconditioner_side = 2;
       r.graft_type = 1;
     }},
    // Blocks cut at 2 along the dimensions with a statistic and at 3 along the last ([6, 4] into
    // 2 x 3 and 2 x 1 blocks, [9, 5] into 2 x 3, 2 x 2 and 1 x 3, 1 x 2 ones).
    {"one_sided_input_own_extent",
     [](auto& r) {
       r.preconditioner_side = 1;
       r.block_size = 2;
       r.unpreconditioned_block_size = 3;
     }},
    // OUTPUT keeps a statistic of the last dimension only, so the blocks of [6, 4], [9, 5] and
    // [12, 2] span all 6, 9 and 12 rows, where the reference cuts 4 + 2, 4 + 4 + 1 and 4 + 4 + 4.
    {"one_sided_output_whole_blocks",
     [](auto& r) {
       r.preconditioner_side = 2;
       r.unpreconditioned_block_size = 1000;
       r.graft_type = 3;
       r.beta2 = 0.99;
     }},
};

INSTANTIATE_TEST_SUITE_P(Options, AgainstModel, ::testing::ValuesIn(option_cases),
                         [](const auto& info) { return info.param.name; });

std::vector<ParameterSpec> specs_for(const std::vector<Shape>& shapes) {
  std::vector<ParameterSpec> specs;
  for (std::size_t p = 0; p < shapes.size(); ++p) specs.push_back({"p" + std::to_string(p), shapes[p]});
  return specs;
}

// Statistics of rank 1..4 tensors after one step with beta2 = 1 (a sum): eps I + mode-j Gram
// matrices computed with plain loops by the model.
TEST(Shampoo, StatisticsOfRankOneToFour) {
  const std::vector<Shape> shapes = {{5}, {4, 3}, {2, 3, 4}, {2, 2, 3, 2}};
  auto r = base_options();
  r.beta2 = 1.0;
  r.block_size = 128;
  r.best_effort_shape_interpretation = false;
  Shampoo<Space, double> shampoo(Space(), specs_for(shapes), to_shampoo(r));
  lather::test::ReferenceShampoo model(shapes, r);
  auto params = initial(shapes);
  const auto g = gradients(params, 0);
  auto device = to_device<double>(params);
  shampoo.step(Space(), device, to_device<double>(g));
  model.step(params, g);
  int s = 0;
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    EXPECT_EQ(shampoo.partition(int(p)).rank(), int(shapes[p].size()));
    for (const auto& want : model.statistics(p)) {
      const auto got = shampoo.statistic(Space(), s++);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-12 * (1 + std::fabs(want[k])));
    }
  }
  EXPECT_EQ(s, shampoo.num_statistics());
}

// One-sided Shampoo keeps the statistics of the chosen side only, each equal to the model's
// statistic of that dimension, with p = 2 x (dimensions kept); rank-1 tensors keep theirs.
TEST(Shampoo, OneSidedKeepsTheStatisticsOfOneSide) {
  const std::vector<Shape> shapes = {{5}, {4, 3}, {2, 3, 4}};
  auto r = base_options();
  r.beta2 = 1.0;
  r.block_size = 128;
  r.best_effort_shape_interpretation = false;
  for (auto side : {PreconditionerType::input, PreconditionerType::output}) {
    auto options = to_shampoo(r);
    options.preconditioner_type = side;
    Shampoo<Space, double> shampoo(Space(), specs_for(shapes), options);
    lather::test::ReferenceShampoo model(shapes, r);
    auto params = initial(shapes);
    const auto g = gradients(params, 0);
    auto device = to_device<double>(params);
    shampoo.step(Space(), device, to_device<double>(g));
    model.step(params, g);
    int s = 0;
    const auto metrics = shampoo.metrics();
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      const auto dims = lather::optim::preconditioned_dimensions(int(shapes[p].size()), side);
      const auto all = model.statistics(p);
      for (int d : dims) {
        const auto& want = all[std::size_t(d)];
        const auto got = shampoo.statistic(Space(), s);
        ASSERT_EQ(got.size(), want.size()) << to_string(side) << " parameter " << p << " dimension " << d;
        for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-12 * (1 + std::fabs(want[k])));
        EXPECT_EQ(metrics[std::size_t(s)].exponent, 2 * int(dims.size()));
        ++s;
      }
    }
    EXPECT_EQ(s, shampoo.num_statistics()) << to_string(side);
    EXPECT_EQ(s, side == PreconditionerType::input ? 1 + 1 + 2 : 1 + 1 + 1);
  }
}

// eigh roots taken by several host threads (root_host_threads; 0 picks from the node) leave the
// trajectory bit for bit what one thread gives, whether the BLAS runs 1 or 2 threads per call
// (OpenBLAS on 2 rounds dsyevd's products otherwise than on 1; the roots run on 1): 12 steps
// with roots every 3, blocks of mixed sizes.
TEST(Shampoo, RootHostThreadsDoNotChangeTheTrajectory) {
  const std::vector<Shape> shapes = {{7}, {9, 5}, {12, 8}, {3, 4, 6}};
  auto r = base_options();
  r.block_size = 6;
  r.preconditioning_compute_steps = 3;
  std::vector<std::vector<double>> first;
  const int found_blas_threads = lather::host_blas_threads();
  for (int blas_threads : {1, 2}) {
    if (!lather::set_host_blas_threads(blas_threads) && blas_threads > 1) continue;  // a BLAS of one thread
    for (int threads : {1, 0, 3}) {
      auto options = to_shampoo(r);
      options.root.method = lather::linalg::RootMethod::eigh;
      options.root.host_threads = threads;
      Shampoo<Space, double> shampoo(Space(), specs_for(shapes), options);
      auto params = initial(shapes);
      auto device = to_device<double>(params);
      for (int t = 0; t < 12; ++t) {
        shampoo.step(Space(), device, to_device<double>(gradients(to_host(device), t)));
      }
      const auto got = to_host(device);
      if (first.empty())
        first = got;
      else
        EXPECT_EQ(got, first) << threads << " host threads, BLAS on " << blas_threads;
      EXPECT_GT(shampoo.num_statistics(), 4);
    }
  }
  if (found_blas_threads > 0) lather::set_host_blas_threads(found_blas_threads);
}

// The blocks' statistics and preconditioning products shared out among host threads
// (product_host_threads; 0 picks from the node) leave the trajectory bit for bit what one thread
// gives, whatever the BLAS's own thread count where the BLAS gives a product the same bits on any
// of its thread counts (else to rounding): each block's products are the same BLAS calls
// whichever thread makes them. So do the element-wise passes (pack, graft, update), whose units
// the same threads share out on a serial backend (run_units): a unit's runs and sums are those
// of a team of one. 8 steps, one-sided and not, of two models: blocks of mixed small
// sizes (statistics of the stack's full size and smaller ones, in place in their slots) with a
// rank-3 tensor (the products over its middle dimension loop over the leading index); and blocks
// of 128 and 72, sizes at which OpenBLAS splits a product over its threads; dense and quantized
// stores (whose statistics' products go through gemm_strided_batched's host threads).
/// Whether the host BLAS gives a GEMM the same bits on 2 threads as on 1, for products of the
/// shapes below (OpenBLAS's Zen and Haswell kernels do; its SkylakeX and Cooperlake kernels give
/// some shapes other bits on 2 threads).
bool blas_products_reproduce_across_its_threads() {
  const int found = lather::host_blas_threads();
  bool same = true;
  for (const auto& [m, n, k] : {std::array<int, 3>{72, 72, 200}, {128, 200, 128}, {200, 200, 128}}) {
    std::vector<double> a(std::size_t(m) * k), b(std::size_t(k) * n);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37 * double(i)) + 0.1;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11 * double(i));
    std::vector<std::vector<double>> c;
    for (int threads : {1, 2}) {
      if (!lather::set_host_blas_threads(threads)) return true;  // a BLAS of one thread
      c.emplace_back(std::size_t(m) * n, 0.0);
      lather::Impl::host_gemm('N', 'N', m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, c.back().data(), n);
    }
    same = same && c[0] == c[1];
  }
  if (found > 0) lather::set_host_blas_threads(found);
  return same;
}

TEST(Shampoo, ProductHostThreadsDoNotChangeTheTrajectory) {
  struct Model {
    std::vector<Shape> shapes;
    int block_size;
  };
  const Model models[] = {{{{7}, {9, 5}, {12, 8}, {3, 4, 6}}, 6}, {{{256, 200}}, 128}};
  const bool blas_reproduces = blas_products_reproduce_across_its_threads();
  const int found_blas_threads = lather::host_blas_threads();
  for (const Model& model : models) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool quantized = variant >= 2;
      const PreconditionerType side = variant % 2 == 0 ? PreconditionerType::all : PreconditionerType::input;
      auto r = base_options();
      r.block_size = model.block_size;
      r.skip_preconditioning_dim_size_gt = 4096;
      r.preconditioning_compute_steps = 3;
      std::vector<std::vector<double>> first;
      for (int blas_threads : {1, 2}) {
        if (!lather::set_host_blas_threads(blas_threads) && blas_threads > 1) continue;  // a BLAS of one thread
        for (int threads : {1, 0, 3}) {
          auto options = to_shampoo(r);
          options.preconditioner_type = side;
          options.product_host_threads = threads;
          options.best_effort_memory_usage_reduction = quantized;
          options.root.method = lather::linalg::RootMethod::eigh;  // the fast roots: the products are tested
          Shampoo<Space, double> shampoo(Space(), specs_for(model.shapes), options);
          auto params = initial(model.shapes);
          auto device = to_device<double>(params);
          for (int t = 0; t < 8; ++t) shampoo.step(Space(), device, to_device<double>(gradients(to_host(device), t)));
          const auto got = to_host(device);
          const auto what = [&] {
            return std::to_string(threads) + " host threads, BLAS on " + std::to_string(blas_threads) + ", " +
                   to_string(side) + ", blocks of " + std::to_string(model.block_size) +
                   (quantized ? ", quantized" : "");
          };
          if (first.empty()) {
            first = got;
          } else if (blas_reproduces || blas_threads == 1) {
            EXPECT_EQ(got, first) << what();
          } else {
            // A BLAS whose products on 2 threads round otherwise (one thread's products keep its
            // thread count; those shared among host threads take one BLAS thread each): double
            // rounding (1e-16) carried through 8 steps and 3 inverse fourth roots of statistics
            // whose smallest eigenvalues are near the ridge, which amplify it to 1e-8 of the
            // values at most (measured: 9.4e-9 on OpenBLAS's Cooperlake kernels). A product lost
            // or applied twice moves them by percents.
            double largest = 0;
            for (std::size_t p = 0; p < got.size(); ++p)
              for (std::size_t k = 0; k < got[p].size(); ++k)
                largest = std::max(largest, std::abs(got[p][k] - first[p][k]) / (1.0 + std::abs(first[p][k])));
            EXPECT_LT(largest, 1e-7) << what();
          }
          EXPECT_NE(got, params);
        }
      }
    }
  }
  if (found_blas_threads > 0) lather::set_host_blas_threads(found_blas_threads);
}

// How many host threads share out a phase's products: the count asked for, no more than the
// blocks, and when automatic no more than one per 20 MFLOP (a thread costs tens of microseconds
// to start).
TEST(Shampoo, ProductThreadsFollowTheWork) {
  const auto product_threads = lather::Impl::host_threads_for_products;
  EXPECT_EQ(product_threads(2, true, 492, 1.0e9), 2);  // the transformer's statistics
  EXPECT_EQ(product_threads(16, true, 492, 1.0e8), 5);
  EXPECT_EQ(product_threads(16, true, 492, 1.0e6), 1);  // the tests' small models
  EXPECT_EQ(product_threads(16, true, 3, 1.0e12), 3);
  EXPECT_EQ(product_threads(3, false, 100, 10.0), 3);  // a count that is set is used as it is
  EXPECT_EQ(product_threads(3, false, 2, 10.0), 2);
  EXPECT_EQ(product_threads(3, false, 0, 0.0), 1);
  // The element-wise passes: one thread per 65,536 values when automatic.
  const auto pass_threads = [](int threads, bool by_work, std::size_t units, double values) {
    return lather::Impl::host_threads_for_work(threads, by_work, units, values, lather::Impl::values_per_host_thread);
  };
  EXPECT_EQ(pass_threads(2, true, 400, 5256704), 2);  // the transformer set
  EXPECT_EQ(pass_threads(16, true, 400, 535818), 8);  // the MLP
  EXPECT_EQ(pass_threads(16, true, 400, 4000), 1);    // the tests' small models
  EXPECT_EQ(pass_threads(3, false, 400, 4000), 3);    // asked for: as asked
  EXPECT_EQ(pass_threads(3, false, 2, 4000), 2);      // no more than the units
}

// Skipped parameters follow the graft in closed form. First step, SGD graft, beta1 = 0.9,
// Nesterov: update = -lr (g + 0.9 g) (momentum starts at 0, w = 1); without Nesterov -lr g.
TEST(Shampoo, ScalarFollowsGraftInClosedForm) {
  for (bool nesterov : {true, false}) {
    ShampooOptions o;
    o.learning_rate = lather::optim::LearningRateSchedule::constant(0.1);
    o.nesterov = nesterov;
    Shampoo<Space, float> shampoo(Space(), {{"scale", {}}}, o);
    auto params = to_device<float>({{2.0}});
    shampoo.step(Space(), params, to_device<float>({{0.5}}));
    const double g = 0.5, want = 2.0 - 0.1 * (nesterov ? 1.9 * g : g);
    // The graft multiplier |g| / (|g| + 1e-16) is 1 in float.
    EXPECT_FLOAT_EQ(float(to_host(params)[0][0]), float(want));
    EXPECT_FALSE(shampoo.is_preconditioned(0));
    EXPECT_EQ(shampoo.num_statistics(), 0);
  }
}

// Statistics are computed every statistics_compute_steps, roots every
// preconditioning_compute_steps (at steps t with t % k == 0, counting from 0).
TEST(Shampoo, StepGating) {
  auto r = base_options();
  r.statistics_compute_steps = 2;
  r.preconditioning_compute_steps = 3;
  Shampoo<Space, double> shampoo(Space(), specs_for({{3, 3}}), to_shampoo(r));
  auto params = to_device<double>(initial({{3, 3}}));
  std::vector<double> last_stat = shampoo.statistic(Space(), 0), last_root = shampoo.preconditioner(Space(), 0);
  for (int t = 0; t < 7; ++t) {
    shampoo.step(Space(), params, to_device<double>(gradients(to_host(params), t)));
    const auto stat = shampoo.statistic(Space(), 0), root = shampoo.preconditioner(Space(), 0);
    EXPECT_EQ(stat != last_stat, t % 2 == 0) << "step " << t;
    EXPECT_EQ(root != last_root, t % 3 == 0) << "step " << t;
    last_stat = stat;
    last_root = root;
  }
  EXPECT_EQ(shampoo.step_count(), 7);
}

// A root whose error reaches inverse_failure_threshold is rejected: the previous preconditioner
// (identity at first) stays; failures are counted; after max_consecutive_root_failures the step
// throws naming the parameter.
TEST(Shampoo, FailedRootsKeepThePreviousPreconditioner) {
  auto o = to_shampoo(base_options());
  o.inverse_failure_threshold = 1e-300;  // every root "fails"
  o.root.tolerance = 1e-6;
  o.max_consecutive_root_failures = 3;
  Shampoo<Space, double> shampoo(Space(), {{"dense_1/kernel", {3, 2}}}, o);
  auto params = to_device<double>(initial({{3, 2}}));
  for (int t = 0; t < 2; ++t) shampoo.step(Space(), params, to_device<double>(gradients(to_host(params), t)));
  const auto root = shampoo.preconditioner(Space(), 0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(root[i * 3 + j], i == j ? 1.0 : 0.0);
  const auto metrics = shampoo.metrics();
  EXPECT_EQ(metrics[0].consecutive_failures, 2);
  EXPECT_EQ(metrics[0].failures, 2);
  EXPECT_GT(metrics[0].error, 0.0);
  try {
    shampoo.step(Space(), params, to_device<double>(gradients(to_host(params), 2)));
    FAIL() << "expected an error after 3 consecutive failures";
  } catch (const lather::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dense_1/kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("inverse_failure_threshold"), std::string::npos) << what;
  }
}

// A float root that fails is retried in double before it is rejected.
TEST(Shampoo, FloatRootsRetryInDouble) {
  auto o = to_shampoo(base_options());
  o.root.compute_precision = lather::linalg::Precision::float32;
  o.root.tolerance = 1e-6;
  o.inverse_failure_threshold = 1e-9;  // unreachable in float, reachable in double
  o.matrix_epsilon = 1e-3;
  Shampoo<Space, double> shampoo(Space(), {{"w", {4, 3}}}, o);
  auto params = to_device<double>(initial({{4, 3}}));
  shampoo.step(Space(), params, to_device<double>(gradients(to_host(params), 0)));
  for (const auto& m : shampoo.metrics()) {
    EXPECT_EQ(m.failures, 0) << "error " << m.error;
    EXPECT_LT(m.error, 1e-9);
  }
  o.retry_failed_roots_in_double = false;
  Shampoo<Space, double> no_retry(Space(), {{"w", {4, 3}}}, o);
  auto params2 = to_device<double>(initial({{4, 3}}));
  no_retry.step(Space(), params2, to_device<double>(gradients(to_host(params2), 0)));
  long failures = 0;
  for (const auto& m : no_retry.metrics()) failures += m.failures;
  EXPECT_GT(failures, 0);
}

// NaN or Inf in a gradient is refused with the parameter's name, and nothing changes.
TEST(Shampoo, NonFiniteGradientIsRefusedAndStateUntouched) {
  Shampoo<Space, float> shampoo(Space(), {{"a", {2, 2}}, {"b", {3}}}, ShampooOptions{});
  auto params = to_device<float>({{1, 2, 3, 4}, {5, 6, 7}});
  const auto before = to_host(params);
  const auto stat_before = shampoo.statistic(Space(), 0);
  try {
    shampoo.step(Space(), params,
                 to_device<float>({{0.1, 0.2, 0.3, 0.4}, {1, std::numeric_limits<double>::quiet_NaN(), 0}}));
    FAIL();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b' contains NaN or Inf"), std::string::npos) << e.what();
  }
  EXPECT_EQ(to_host(params), before);
  EXPECT_EQ(shampoo.statistic(Space(), 0), stat_before);
  EXPECT_EQ(shampoo.step_count(), 0);
}

TEST(Shampoo, BadArgumentsAreNamed) {
  ShampooOptions o;
  o.block_size = 0;
  EXPECT_THROW((Shampoo<Space, float>(Space(), {{"w", {2}}}, o)), lather::Error);
  Shampoo<Space, float> shampoo(Space(), {{"w", {2, 2}}}, ShampooOptions{});
  auto params = to_device<float>({{1, 2, 3, 4}});
  try {
    shampoo.step(Space(), params, to_device<float>({{1, 2, 3}}));
    FAIL();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient of 'w' has 3 elements, expected 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW((Shampoo<Space, float>(Space(), {{"w", {2}}, {"w", {3}}}, ShampooOptions{})), lather::Error);
}

// product_flops counts the statistics' and the preconditioning's products block by block, by
// hand from the shapes: [6, 4] in blocks of 4 is a 4x4 and a 2x4 block, [3] one block of 3, every
// dimension preconditioned. A Gram matrix along a dimension of size n of a block of E elements is
// 2 n E flops by a device's GEMM and (n + 1) E by the host's syrk (the upper triangle, written in
// place whatever the statistic's size); a contraction is 2 n E. Statistics every other step: the
// second step adds the preconditioning.
TEST(Shampoo, ProductFlopsCountEveryBlocksProducts) {
  ShampooOptions o;
  o.block_size = 4;
  o.best_effort_shape_interpretation = false;
  o.statistics_compute_steps = 2;
  const std::vector<Shape> shapes = {{6, 4}, {3}};
  Shampoo<Space, double> shampoo(Space(), specs_for(shapes), o);
  auto params = initial(shapes);
  auto device = to_device<double>(params);
  // (n, E) of every preconditioned dimension of every block.
  const std::vector<std::pair<double, double>> dims = {{4, 16}, {4, 16}, {2, 8}, {4, 8}, {3, 3}};
  double gram = 0, contraction = 0;
  for (const auto& [n, e] : dims) {
    gram += lather::Impl::runs_on_host<Space> ? (n + 1) * e : 2 * n * e;
    contraction += 2 * n * e;
  }
  EXPECT_EQ(shampoo.product_flops(), 0.0);
  shampoo.step(Space(), device, to_device<double>(gradients(params, 0)));
  EXPECT_EQ(shampoo.product_flops(), gram + contraction);
  shampoo.step(Space(), device, to_device<double>(gradients(params, 1)));
  EXPECT_EQ(shampoo.product_flops(), gram + 2 * contraction);
}

// The memory report adds up the stacks and the local state: float stacks [N, max, max] twice,
// momentum and diagonal momentum per element, diagonal statistics for an AdaGrad graft.
TEST(Shampoo, MemoryReportCountsState) {
  ShampooOptions o;
  o.graft_type = GraftType::adagrad;
  o.block_size = 4;
  o.best_effort_shape_interpretation = false;
  Shampoo<Space, float> shampoo(Space(), {{"w", {6, 4}}, {"b", {3}}}, o);
  const auto report = shampoo.memory_report();
  const int n = shampoo.num_statistics();  // [6,4] -> blocks 2x1 -> 4 statistics; [3] -> 1
  EXPECT_EQ(n, 5);
  EXPECT_EQ(report.stack_bytes, 2 * 5 * 4 * 4 * 4);
  EXPECT_EQ(report.local_bytes, 3 * (24 + 3) * 4);
  EXPECT_EQ(report.quantized_bytes, 0);
  o.best_effort_memory_usage_reduction = true;
  Shampoo<Space, float> small(Space(), {{"w", {6, 4}}, {"b", {3}}}, o);
  const auto q = small.memory_report();
  EXPECT_EQ(q.stack_bytes, 0);
  // int16 stacks + float diagonals and scales; int8 momenta with float column scales for w.
  EXPECT_EQ(q.quantized_bytes, 2 * (5 * 16 * 2 + 2 * 5 * 4 * 4) + 2 * (24 + 4 * 4));
  EXPECT_EQ(q.local_bytes, (24 + 3) * 4 + 2 * 3 * 4);
}

// Per-block grafting (Meta's DistributedShampoo) is the reference's per-tensor grafting applied
// to each block as a tensor of its own: a [8, 6] parameter in blocks of 4 ([4, 4] and [4, 2],
// twice) follows, step by step, the four blocks given as four parameters with per-tensor
// grafting, for each graft it takes. Per-tensor grafting of the same parameter moves elsewhere
// (the test can tell the two apart).
TEST(Shampoo, BlockGraftingIsTensorGraftingPerBlock) {
  using lather::optim::GraftGranularity;
  const std::int64_t rows = 8, columns = 6, block = 4;
  // Element (i, j) of the whole parameter, and where it sits in the block parameters.
  struct Place {
    int block;
    std::size_t index;
  };
  const auto place = [&](std::int64_t i, std::int64_t j) {
    const std::int64_t bi = i / block, bj = j / block, width = std::min(block, columns - bj * block);
    return Place{int(bi * 2 + bj), std::size_t((i % block) * width + j % block)};
  };
  const std::vector<Shape> block_shapes = {{4, 4}, {4, 2}, {4, 4}, {4, 2}};
  const auto gradient_of = [&](double x, std::int64_t i, std::int64_t j, int t) {
    return 0.1 * x + std::sin(0.37 * double(i * columns + j + 1) + 1.3 * (t + 1)) * (1.0 + 0.5 * double(j / block));
  };
  for (GraftType graft : {GraftType::adagrad, GraftType::sgd, GraftType::rmsprop, GraftType::sqrt_n}) {
    ShampooOptions o;
    o.graft_type = graft;
    o.block_size = int(block);
    o.best_effort_shape_interpretation = false;  // no merging: the blocks keep their shapes
    o.start_preconditioning_step = 2;
    o.preconditioning_compute_steps = 2;
    o.learning_rate = lather::optim::LearningRateSchedule::constant(0.05);
    // Statistics kept in float64: in float32 (the default) a last-bit difference of two sums
    // rounds to a different float (1e-7 relative), which the roots carry into the updates.
    o.statistics_precision = lather::linalg::Precision::float64;
    auto per_block = o;
    per_block.graft_granularity = GraftGranularity::block;
    Shampoo<Space, double> whole(Space(), {{"w", {rows, columns}}}, per_block);
    Shampoo<Space, double> tensor(Space(), {{"w", {rows, columns}}}, o);
    Shampoo<Space, double> parts(Space(), specs_for(block_shapes), o);
    std::vector<double> x0(std::size_t(rows * columns));
    for (std::size_t k = 0; k < x0.size(); ++k) x0[k] = 0.3 * std::cos(0.7 * double(k));
    std::vector<std::vector<double>> split(4);
    for (int b = 0; b < 4; ++b) split[b].resize(std::size_t(block_shapes[b][0] * block_shapes[b][1]));
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < columns; ++j) split[place(i, j).block][place(i, j).index] = x0[i * columns + j];
    auto whole_x = to_device<double>({x0}), tensor_x = to_device<double>({x0}), parts_x = to_device<double>(split);
    for (int t = 0; t < 8; ++t) {
      const auto w = to_host(whole_x), p = to_host(parts_x), tx = to_host(tensor_x);
      std::vector<std::vector<double>> gw(1, std::vector<double>(x0.size())), gt = gw, gp = split;
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < columns; ++j) {
          const auto at = place(i, j);
          gw[0][i * columns + j] = gradient_of(w[0][i * columns + j], i, j, t);
          gt[0][i * columns + j] = gradient_of(tx[0][i * columns + j], i, j, t);
          gp[at.block][at.index] = gradient_of(p[at.block][at.index], i, j, t);
        }
      whole.step(Space(), whole_x, to_device<double>(gw));
      tensor.step(Space(), tensor_x, to_device<double>(gt));
      parts.step(Space(), parts_x, to_device<double>(gp));
    }
    const auto w = to_host(whole_x), p = to_host(parts_x), tx = to_host(tensor_x);
    double apart = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < columns; ++j) {
        const auto at = place(i, j);
        // The same double arithmetic in another packing and batching order (the statistics'
        // products of the whole parameter's blocks are one batched call, the parts' one call
        // each): differences of rounding, below 1e-13 here on values of order 1 after 8 steps;
        // the roots of the rank-2 statistics of the [4, 2] blocks could amplify them by up to
        // the inverse ridge (1e6), hence 1e-11. Per-tensor grafting differs by more than 1e-4.
        EXPECT_NEAR(w[0][i * columns + j], p[at.block][at.index], 1e-11)
            << lather::optim::to_string(graft) << " at (" << i << ", " << j << ")";
        apart = std::max(apart, std::abs(tx[0][i * columns + j] - p[at.block][at.index]));
      }
    EXPECT_GT(apart, 1e-4) << lather::optim::to_string(graft) << ": per-tensor grafting moved the same way";
  }
}

/// y = x contracted along dimension `d` of `shape` with the symmetric n x n matrix m (row-major):
/// y[.., a, ..] = sum_b m[a][b] x[.., b, ..], plain loops.
std::vector<double> contract_along(const std::vector<double>& x, const Shape& shape, int d,
                                   const std::vector<double>& m) {
  std::int64_t before = 1, after = 1;
  for (int i = 0; i < d; ++i) before *= shape[std::size_t(i)];
  for (std::size_t i = std::size_t(d) + 1; i < shape.size(); ++i) after *= shape[i];
  const std::int64_t n = shape[std::size_t(d)];
  std::vector<double> y(x.size(), 0.0);
  for (std::int64_t u = 0; u < before; ++u)
    for (std::int64_t a = 0; a < n; ++a)
      for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t v = 0; v < after; ++v)
          y[std::size_t((u * n + a) * after + v)] +=
              m[std::size_t(a * n + b)] * x[std::size_t((u * n + b) * after + v)];
  return y;
}

/// The Gram matrix of x along dimension `d` of `shape`: sum over the other indices of x_a x_b.
std::vector<double> gram_along(const std::vector<double>& x, const Shape& shape, int d) {
  std::int64_t before = 1, after = 1;
  for (int i = 0; i < d; ++i) before *= shape[std::size_t(i)];
  for (std::size_t i = std::size_t(d) + 1; i < shape.size(); ++i) after *= shape[i];
  const std::int64_t n = shape[std::size_t(d)];
  std::vector<double> c(std::size_t(n * n), 0.0);
  for (std::int64_t u = 0; u < before; ++u)
    for (std::int64_t a = 0; a < n; ++a)
      for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t v = 0; v < after; ++v)
          c[std::size_t(a * n + b)] +=
              x[std::size_t((u * n + a) * after + v)] * x[std::size_t((u * n + b) * after + v)];
  return c;
}

// KL-Shampoo's statistics, against plain loops: on the first step the preconditioners are the
// identity, so the statistics are Shampoo's; on the second, the statistic of dimension k blends
// the Gram matrix along k of the gradient contracted along the other dimensions with the
// preconditioners the first step computed (read back before the second). Tensors of rank 1 to 3,
// one block each; double throughout, so only the summation order differs (BLAS against loops,
// ~1e-16 relative per operation on sums of ~30 terms).
TEST(Shampoo, KlStatisticsAreGramsOfTheBlockPreconditionedAlongTheOthers) {
  const std::vector<Shape> shapes = {{5}, {4, 3}, {2, 3, 4}};
  ShampooOptions o;
  o.block_size = 128;
  o.best_effort_shape_interpretation = false;
  o.beta2 = 0.9;
  o.start_preconditioning_step = 0;
  o.statistics_precision = lather::linalg::Precision::float64;
  o.root.method = lather::linalg::RootMethod::eigh;
  auto kl = o;
  kl.kl_shampoo = true;
  Shampoo<Space, double> shampoo(Space(), specs_for(shapes), o), kl_shampoo(Space(), specs_for(shapes), kl);
  auto params = initial(shapes);
  auto x = to_device<double>(params), y = to_device<double>(params);
  const auto g0 = gradients(params, 0);
  shampoo.step(Space(), x, to_device<double>(g0));
  kl_shampoo.step(Space(), y, to_device<double>(g0));
  ASSERT_EQ(kl_shampoo.num_statistics(), 1 + 2 + 3);
  std::vector<std::vector<double>> before, preconditioners;
  for (int s = 0; s < kl_shampoo.num_statistics(); ++s) {
    const auto want = shampoo.statistic(Space(), s), got = kl_shampoo.statistic(Space(), s);
    for (std::size_t k = 0; k < want.size(); ++k) EXPECT_EQ(got[k], want[k]) << "statistic " << s << " step 0";
    before.push_back(got);
    preconditioners.push_back(kl_shampoo.preconditioner(Space(), s));
  }
  const auto g1 = gradients(to_host(y), 1);
  kl_shampoo.step(Space(), y, to_device<double>(g1));
  double moved = 0;
  for (std::size_t p = 0, s = 0; p < shapes.size(); ++p) {
    const int rank = int(shapes[p].size());
    for (int k = 0; k < rank; ++k, ++s) {
      std::vector<double> z = g1[p];
      for (int j = 0; j < rank; ++j)
        if (j != k)
          z = contract_along(z, shapes[p], j, preconditioners[std::size_t(s) - std::size_t(k) + std::size_t(j)]);
      const auto gram = gram_along(z, shapes[p], k);
      const auto got = kl_shampoo.statistic(Space(), int(s));
      ASSERT_EQ(got.size(), gram.size());
      for (std::size_t e = 0; e < gram.size(); ++e) {
        const double want = 0.9 * before[s][e] + 0.1 * gram[e];
        EXPECT_NEAR(got[e], want, 1e-13 * (1 + std::fabs(want))) << "parameter " << p << " dimension " << k;
        // Rank 1: nothing to contract, the update is Shampoo's.
        if (rank > 1)
          moved = std::max(moved, std::fabs(want - (0.9 * before[s][e] + 0.1 * gram_along(g1[p], shapes[p], k)[e])));
      }
    }
  }
  EXPECT_GT(moved, 1e-3) << "the preconditioners changed nothing: the test cannot tell KL from Shampoo";
}

// graft_type none: the update is the preconditioned direction itself times the learning rate
// (beta1 0: no momentum), and the gradient before start_preconditioning_step. One [4, 3] tensor;
// the direction is recomputed from the preconditioners read back, with plain loops.
TEST(Shampoo, NoGraftUsesTheDirectionAsItIs) {
  const Shape shape = {4, 3};
  ShampooOptions o;
  o.block_size = 128;
  o.best_effort_shape_interpretation = false;
  o.beta1 = 0.0;
  o.graft_type = GraftType::none;
  o.start_preconditioning_step = 1;
  o.statistics_precision = lather::linalg::Precision::float64;
  o.root.method = lather::linalg::RootMethod::eigh;
  o.learning_rate = lather::optim::LearningRateSchedule::constant(0.1);
  Shampoo<Space, double> shampoo(Space(), specs_for({shape}), o);
  auto params = initial({shape});
  auto x = to_device<double>(params);
  for (int t = 0; t < 3; ++t) {
    const auto before = to_host(x);
    const auto g = gradients(before, t);
    shampoo.step(Space(), x, to_device<double>(g));
    std::vector<double> direction = g[0];
    if (t >= 1)
      for (int d = 0; d < 2; ++d) direction = contract_along(direction, shape, d, shampoo.preconditioner(Space(), d));
    const auto after = to_host(x);
    for (std::size_t k = 0; k < direction.size(); ++k)
      EXPECT_NEAR(after[0][k], before[0][k] - 0.1 * direction[k], 1e-13) << "step " << t << " element " << k;
  }
}

}  // namespace
