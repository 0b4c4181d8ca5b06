// lather-bench step: one optimizer step (statistics, inverse roots every k steps, preconditioning,
// graft and momentum) against Adam on the same parameters, in the same run, for the parameter sets
// of perf/parameter_sets.json (which perf/jax_reference_step.py times too); Adam's own update
// beside a plain triad moving the same bytes. Under mpiexec the ranks form one data-parallel
// group and Shampoo splits its step over them (--ranks-aware figures: the slowest rank's time).
#include "bench_common.hpp"

#include <lather/comm/mesh.hpp>
#include <lather/core/error.hpp>
#include <lather/core/host_threads.hpp>
#include <lather/core/parameters.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/soap.hpp>

#include <Kokkos_Random.hpp>

#include <algorithm>

namespace lather::bench {
namespace {

/// Products in the batched GEMM baseline: of the order of the blocks that share a shape in the
/// sets (the transformer set has 492 statistics, of n <= 128).
constexpr int gemm_batch = 256;

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

struct StepBenchOptions {
  std::vector<std::string> sets = {"transformer", "cnn"};
  std::vector<std::string> root_methods = {"newton", "eigh"};
  std::vector<std::string> others = {"soap", "muon"};  // timed beside Adam and Shampoo
  std::string file;
  int windows = 2;
  std::vector<std::string> shampoo;                 // name=value overrides of the set's options
  std::string newton_schulz_precision = "float32";  // Muon's
};

/// Seconds per step of the slowest rank, averaged over `windows` windows of `window` steps after
/// one warm-up window.
template <class Optimizer>
double time_steps(const comm::Group& world, Optimizer& optimizer, const ParameterList<float, Mem>& params, long window,
                  int windows) {
  const Space space;
  for (long s = 0; s < window; ++s) optimizer.step(space, params);
  space.fence();
  world.barrier();
  Kokkos::Timer timer;
  for (long s = 0; s < window * windows; ++s) optimizer.step(space, params);
  space.fence();
  return world.allreduce(timer.seconds() / double(window * windows), comm::Combine::max);
}

/// Seconds of a triad a = b + s c moving `bytes` bytes (12 per element): the memory bandwidth a
/// streaming update of that many bytes can reach on this device. Best of 5 after a warm-up.
double triad_seconds(std::size_t bytes) {
  const std::size_t n = std::max<std::size_t>(1, bytes / 12);
  Kokkos::View<float*, Mem> a("bench::triad_a", n), b("bench::triad_b", n), c("bench::triad_c", n);
  Kokkos::deep_copy(b, 1.0f);
  Kokkos::deep_copy(c, 2.0f);
  const Space space;
  double best = 1e300;
  for (int repeat = 0; repeat < 6; ++repeat) {
    Kokkos::Timer timer;
    Kokkos::parallel_for(
        "bench::triad", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, std::int64_t(n)),
        KOKKOS_LAMBDA(std::int64_t k) { a(k) = b(k) + 0.5f * c(k); });
    space.fence();
    if (repeat > 0) best = std::min(best, timer.seconds());
  }
  return best;
}

void run_step(const StepBenchOptions& o) {
  const std::string path = o.file.empty() ? default_parameter_sets_file() : o.file;
  const auto doc = read_parameter_sets(path);
  optim::ShampooOptions shampoo_options = shampoo_options_of(doc);
  for (const auto& pair : o.shampoo) {
    const auto eq = pair.find('=');
    LATHER_REQUIRE(eq != std::string::npos, "--shampoo expects name=value, got '", pair, "'");
    optim::set_option(shampoo_options, pair.substr(0, eq), pair.substr(eq + 1));
  }
  // Every name checked before anything is timed, so a typo costs no minutes of measurement.
  for (const auto& set : o.sets) parameter_specs_of(doc, set, path);
  for (const auto& method : o.root_methods) linalg::parse_root_method(method);
  const ProductPrecision newton_schulz_precision =
      parse_product_precision(o.newton_schulz_precision, "--newton-schulz-precision");
  std::vector<std::string> others;
  for (const auto& other : o.others) {
    if (other == "none") continue;
    LATHER_REQUIRE(other == "soap" || other == "muon", "--others: unknown optimizer '", other,
                   "' (expected soap, muon or none)");
    others.push_back(other);
  }
  const long window = shampoo_options.preconditioning_compute_steps;
  const comm::Mesh mesh(world_group());
  const bool print = mesh.world_rank() == 0;
  const Space space;
  // The threads Shampoo's products take on a host backend (optim::Impl::host_threads): the GEMM
  // baseline below shares its batch out among as many.
  const int product_threads = lather::Impl::host_threads_for(space, shampoo_options.product_host_threads,
                                                             mesh.world().node_occupancy().cpu_share());

  for (const auto& set : o.sets) {
    const auto specs = parameter_specs_of(doc, set, path);
    ParameterList<float, Mem> params(space, specs);
    Kokkos::Random_XorShift64_Pool<Space> pool(2024);
    Kokkos::fill_random(params.value_buffer(), pool, -0.02f, 0.02f);
    Kokkos::fill_random(params.gradient_buffer(), pool, -1.0f, 1.0f);
    space.fence();
    const auto elements = params.gradient_buffer().extent(0);

    optim::AdamOptions adam_options;
    optim::FirstOrder<Space, float> adam(space, params, adam_options);
    const double adam_seconds = time_steps(mesh.world(), adam, params, window, o.windows);
    // Adam reads parameter, gradient and both moments and writes back three: 28 bytes a value.
    const double adam_bytes = 28.0 * double(elements);
    const double triad = triad_seconds(std::size_t(adam_bytes));
    if (print)
      emit({{"bench", "step"},
            {"set", set},
            {"optimizer", "adam"},
            {"ranks", mesh.world_size()},
            {"seconds_per_step", adam_seconds},
            {"state_bytes", adam.memory_report().total()},
            {"ratio_to_adam", 1.0},
            {"parameters", specs.size()},
            {"values", elements},
            {"update_gbps", adam_bytes / adam_seconds / 1e9},
            {"triad_gbps", adam_bytes / triad / 1e9},
            {"ratio_to_triad", triad / adam_seconds},
            {"ns_per_value", adam_seconds / double(elements) * 1e9}});
    // The BLAS's rate for GEMMs of the block size, in the statistics' precision: Shampoo's
    // products (its statistics and preconditioning) cannot take less than their flops at this rate.
    // The faster of one GEMM repeated (in cache, on a host) and a strided batch (one call on a GPU,
    // where one small GEMM at a time is launch-bound: 193 GFLOP/s at n = 128 on an H200, a rate at
    // which the transformer's products would take 16.7 ms a step; they took 0.2-0.46 ms).
    const int block = std::max(1, shampoo_options.block_size);
    const double gemm_rate_one = gemm_gflops<float>(block, 0.3);
    const double gemm_rate_batched = batched_gemm_gflops<float>(block, gemm_batch, product_threads, 0.3);
    const double gemm_rate = std::max(gemm_rate_one, gemm_rate_batched);
    for (const auto& method : o.root_methods) {
      auto options = shampoo_options;
      options.root.method = linalg::parse_root_method(method);
      optim::Shampoo<Space, float> shampoo(space, params, options, mesh);
      shampoo.measure_phases(true);
      const double seconds = time_steps(mesh.world(), shampoo, params, window, o.windows);
      double worst = 0;
      for (const auto& m : shampoo.metrics()) worst = std::max(worst, m.error);
      const auto phases = shampoo.phase_seconds();
      const double steps = double(shampoo.step_count());
      nlohmann::json breakdown;
      for (const auto& [phase, total] : phases) breakdown[phase] = total / steps;
      const auto largest_state = mesh.world().allreduce(shampoo.memory_report().total(), comm::Combine::max);
      const double product_flops = mesh.world().allreduce(shampoo.product_flops(), comm::Combine::max) / steps;
      const double product_floor = product_flops / (gemm_rate * 1e9);
      if (print)
        emit({{"bench", "step"},
              {"set", set},
              {"optimizer", "shampoo"},
              {"root_method", method},
              {"ranks", mesh.world_size()},
              {"step_mode", optim::option_value(shampoo.options(), "step_mode")},
              {"product_precision", optim::option_value(shampoo.options(), "product_precision")},
              {"seconds_per_step", seconds},
              {"state_bytes", largest_state},
              {"ratio_to_adam", seconds / adam_seconds},
              {"adam_seconds_per_step", adam_seconds},
              {"statistics", shampoo.num_statistics()},
              {"preconditioning_compute_steps", window},
              {"max_inverse_root_error", worst},
              {"seconds_per_step_by_phase", breakdown},
              {"gemm_launches_per_step", double(shampoo.gemm_launches()) / steps},
              {"product_gflop_per_step", product_flops / 1e9},
              {"gemm_gflops", gemm_rate},
              {"gemm_batch", gemm_batch},
              {"gemm_gflops_one", gemm_rate_one},
              {"gemm_gflops_batched", gemm_rate_batched},
              {"product_host_threads", lather::Impl::runs_on_host<Space> ? product_threads : 0},
              {"product_floor_seconds", product_floor},
              {"product_floor_ratio_to_adam", product_floor / adam_seconds}});
    }
    // SOAP with the set's Shampoo blocking (its bases refreshed every preconditioning_compute_steps,
    // the same window), its blocks split over the ranks; Muon, its matrices split over the ranks.
    for (const auto& other : others) {
      std::unique_ptr<optim::Optimizer<Space, float>> optimizer;
      std::string precision;  // of its products
      if (other == "soap") {
        optim::SoapOptions soap;
        soap.block_size = shampoo_options.block_size;
        soap.merge_small_dims_block_size = shampoo_options.merge_small_dims_block_size;
        soap.max_precond_dim = shampoo_options.skip_preconditioning_dim_size_gt;
        soap.precondition_frequency = window;
        soap.product_precision = shampoo_options.product_precision;
        precision = to_string(soap.product_precision);
        optimizer = std::make_unique<optim::Soap<Space, float>>(space, params, soap, mesh.world());
      } else {  // muon (the names were checked above)
        // Embeddings take AdamW, as Jordan et al. (and lather-train) do.
        optim::MuonOptions muon;
        muon.newton_schulz_precision = newton_schulz_precision;
        precision = to_string(muon.newton_schulz_precision);
        for (const auto& spec : specs)
          if (spec.name.rfind("embedding", 0) == 0) muon.adamw_parameters.push_back(spec.name);
        optimizer = std::make_unique<optim::Muon<Space, float>>(space, params, muon, mesh.world());
      }
      const double seconds = time_steps(mesh.world(), *optimizer, params, window, o.windows);
      const auto largest_state = mesh.world().allreduce(optimizer->memory_report().total(), comm::Combine::max);
      if (print)
        emit({{"bench", "step"},
              {"set", set},
              {"optimizer", other},
              {other == "soap" ? "product_precision" : "newton_schulz_precision", precision},
              {"ranks", mesh.world_size()},
              {"step_mode", mesh.world_size() > 1 ? "distributed" : "replicated"},
              {"seconds_per_step", seconds},
              {"state_bytes", largest_state},
              {"ratio_to_adam", seconds / adam_seconds},
              {"adam_seconds_per_step", adam_seconds}});
    }
  }
}

}  // namespace

void register_step(CLI::App& app) {
  auto options = std::make_shared<StepBenchOptions>();
  auto* sub = app.add_subcommand(
      "step",
      "Optimizer step time (statistics + roots every preconditioning_compute_steps + preconditioning + "
      "update) against Adam on the same parameters, same run, with Shampoo's time by phase and Adam's "
      "bandwidth against a same-run triad. Under mpiexec the ranks share Shampoo's step.");
  add_list_option(*sub, "--set", options->sets, "Parameter sets (transformer, cnn)");
  add_list_option(*sub, "--root-method", options->root_methods,
                  "Inverse-root methods to time (newton, eigh, eigh_host)");
  add_list_option(*sub, "--others", options->others,
                  "Other optimizers timed beside Adam and Shampoo (soap, muon; none: neither)");
  sub->add_option("--sets-file", options->file, "The parameter sets file (default: perf/parameter_sets.json)");
  sub->add_option("--windows", options->windows, "Timed windows of preconditioning_compute_steps steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_list_option(*sub, "--shampoo", options->shampoo,
                  "Shampoo options over the set's, name=value (e.g. step_mode=replicated); SOAP takes its "
                  "product_precision");
  sub->add_option("--newton-schulz-precision", options->newton_schulz_precision,
                  "Muon: the Newton-Schulz products' input precision (float32, tf32 or bfloat16)")
      ->capture_default_str();
  sub->callback([options] { run_step(*options); });
}

}  // namespace lather::bench
