// lather-bench step: one optimizer step (statistics, inverse roots every k steps, preconditioning,
// graft and momentum) against Adam on the same parameters, in the same run, for the parameter sets
// of perf/parameter_sets.json (which perf/jax_reference_step.py times too).
#include "bench_common.hpp"

#include <lather/core/error.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/shampoo.hpp>

#include <Kokkos_Random.hpp>

#include <fstream>

namespace lather::bench {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

struct StepBenchOptions {
  std::vector<std::string> sets = {"transformer", "cnn"};
  std::vector<std::string> root_methods = {"newton", "eigh"};
  std::string file;
  int windows = 2;
};

/// Seconds per step, averaged over `windows` windows of `window` steps after one warm-up window.
template <class Optimizer>
double time_steps(Optimizer& optimizer, const TensorList<float, Mem>& params, const TensorList<float, Mem>& grads,
                  long window, int windows) {
  const Space space;
  for (long s = 0; s < window; ++s) optimizer.step(space, params, grads);
  space.fence();
  Kokkos::Timer timer;
  for (long s = 0; s < window * windows; ++s) optimizer.step(space, params, grads);
  space.fence();
  return timer.seconds() / double(window * windows);
}

void run_step(const StepBenchOptions& o) {
  const std::string path = o.file.empty() ? default_parameter_sets_file() : o.file;
  const auto doc = read_parameter_sets(path);
  const optim::ShampooOptions shampoo_options = shampoo_options_of(doc);
  const long window = shampoo_options.preconditioning_compute_steps;

  for (const auto& set : o.sets) {
    const auto specs = parameter_specs_of(doc, set, path);
    TensorList<float, Mem> params, grads;
    Kokkos::Random_XorShift64_Pool<Space> pool(2024);
    for (const auto& spec : specs) {
      const auto n = element_count(spec.shape);
      FlatTensor<float, Mem> x("bench::param", n), g("bench::grad", n);
      Kokkos::fill_random(x, pool, -0.02f, 0.02f);
      Kokkos::fill_random(g, pool, -1.0f, 1.0f);
      params.push_back(x);
      grads.push_back(g);
    }
    optim::AdamOptions adam_options;
    optim::FirstOrder<Space, float> adam(Space(), specs, adam_options);
    const double adam_seconds = time_steps(adam, params, grads, window, o.windows);
    const auto adam_bytes = adam.memory_report().total();
    emit({{"bench", "step"}, {"set", set}, {"optimizer", "adam"}, {"seconds_per_step", adam_seconds},
          {"state_bytes", adam_bytes}, {"ratio_to_adam", 1.0}, {"parameters", specs.size()}});
    for (const auto& method : o.root_methods) {
      auto options = shampoo_options;
      options.root.method = linalg::parse_root_method(method);
      optim::Shampoo<Space, float> shampoo(Space(), specs, options);
      const double seconds = time_steps(shampoo, params, grads, window, o.windows);
      double worst = 0;
      for (const auto& m : shampoo.metrics()) worst = std::max(worst, m.error);
      emit({{"bench", "step"},
            {"set", set},
            {"optimizer", "shampoo"},
            {"root_method", method},
            {"seconds_per_step", seconds},
            {"state_bytes", shampoo.memory_report().total()},
            {"ratio_to_adam", seconds / adam_seconds},
            {"adam_seconds_per_step", adam_seconds},
            {"statistics", shampoo.num_statistics()},
            {"preconditioning_compute_steps", window},
            {"max_inverse_root_error", worst}});
    }
  }
}

}  // namespace

void register_step(CLI::App& app) {
  auto options = std::make_shared<StepBenchOptions>();
  auto* sub = app.add_subcommand(
      "step",
      "Optimizer step time (statistics + roots every preconditioning_compute_steps + "
      "preconditioning + update) against Adam on the same parameters, same run.");
  add_list_option(*sub, "--set", options->sets, "Parameter sets (transformer, cnn)");
  add_list_option(*sub, "--root-method", options->root_methods, "Inverse-root methods to time (newton, eigh)");
  sub->add_option("--sets-file", options->file, "The parameter sets file (default: perf/parameter_sets.json)");
  sub->add_option("--windows", options->windows, "Timed windows of preconditioning_compute_steps steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->callback([options] { run_step(*options); });
}

}  // namespace lather::bench
