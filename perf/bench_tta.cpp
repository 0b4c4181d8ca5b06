// lather-bench tta: time to accuracy on Fashion-MNIST -- optimizer steps and wall-clock seconds
// until the test accuracy first reaches a target, for Shampoo and for Adam (the same-run
// baseline), each with the learning rate of the sweep in docs/reference/driver.md -- or, with
// --model transformer, until the character transformer's validation loss reaches --target-loss,
// with its tokens/s and model FLOP utilisation. Runs over the
// MPI ranks it is launched with (data parallel), like lather-train.
#include "bench_common.hpp"

#include "trainer.hpp"

#include <lather/comm/group.hpp>

#include <mpi.h>

#include <cstdlib>

namespace lather::bench {
namespace {

struct TtaOptions {
  std::vector<std::string> optimizers = {"adam", "shampoo", "soap", "muon"};
  double target = 0.88;
  long eval_every = 50;
  int epochs = 5;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::vector<std::string> shampoo;         ///< name=value over lather-train's Shampoo defaults (a sweep)
  std::vector<std::string> learning_rates;  ///< optimizer=value: peak rates other than lather-train's
  std::string model = "mlp";
  std::string text = "/usr/share/datasets/shakespeare";
  double target_loss = 1.8;  ///< transformer: validation nats/char
  long max_steps = 0;        ///< transformer: give up after this many steps (0: lather-train's default)
  unsigned seed = 0;         ///< lather-train --seed: initial weights and data order
  /// The products' inputs: Shampoo's and SOAP's product_precision, Muon's newton_schulz_precision.
  std::string product_precision = "float32";
};

void run_tta(const TtaOptions& o) {
  const comm::Group world(MPI_COMM_WORLD);
  const int rank = world.rank(), ranks = world.size();
  double baseline_steps = 0, baseline_seconds = 0;
  const ProductPrecision precision = parse_product_precision(o.product_precision, "--product-precision");
  for (const auto& name : o.optimizers) {
    const train::OptimizerKind optimizer = train::parse_optimizer(name);
    train::TrainOptions t;
    const bool transformer = o.model == "transformer";
    if (transformer) {
      // lather-train --model transformer's defaults, then this optimizer at its default rate.
      t = train::model_defaults(train::ModelKind::transformer);
      t.text = o.text;
      t.target_loss = o.target_loss;
      if (o.max_steps > 0) t.max_steps = o.max_steps;
      t.lr = train::default_transformer_learning_rate(optimizer);
      // apply_model_defaults() chose Shampoo's block size for lather-train's default optimizer;
      // the optimizers that take no Shampoo options refuse it.
      if (optimizer != train::OptimizerKind::shampoo && optimizer != train::OptimizerKind::soap) t.shampoo.clear();
    } else {
      t.data = o.data;
      t.epochs = o.epochs;
      t.target_accuracy = o.target;
    }
    t.optimizer = optimizer;
    t.seed = o.seed;
    t.eval_every = o.eval_every;
    t.quiet = true;
    if (optimizer == train::OptimizerKind::shampoo)
      t.shampoo.insert(t.shampoo.end(), o.shampoo.begin(), o.shampoo.end());
    std::string products = "float32";  // what this optimizer's products' inputs are rounded to
    if (optimizer == train::OptimizerKind::shampoo || optimizer == train::OptimizerKind::soap) {
      if (precision != ProductPrecision::float32) t.shampoo.push_back("product_precision=" + to_string(precision));
      products = to_string(precision);
    } else if (optimizer == train::OptimizerKind::muon) {
      t.newton_schulz_precision = precision;
      products = to_string(precision);
    }
    for (const auto& pair : o.learning_rates) {
      const auto eq = pair.find('=');
      LATHER_REQUIRE(eq != std::string::npos, "--lr expects optimizer=value, got '", pair, "'");
      if (pair.substr(0, eq) != name) continue;
      char* end = nullptr;
      const std::string value = pair.substr(eq + 1);
      const double lr = std::strtod(value.c_str(), &end);
      LATHER_REQUIRE(!value.empty() && *end == '\0' && lr > 0, "--lr ", name, ": expected a positive number, got '",
                     value, "'");
      t.lr = lr;
    }
    const auto result = train::train(t, world, [](const std::string&) {});
    const double steps = result.reached_target ? double(result.target_step) : -1.0;
    // Training seconds exclude the evaluations (a test pass every --eval-every steps); the
    // seconds with them are reported beside.
    const double seconds = result.reached_target ? result.target_training_seconds : -1.0;
    const double with_evaluations = result.reached_target ? result.target_seconds : -1.0;
    if (name == o.optimizers.front()) baseline_steps = steps, baseline_seconds = seconds;
    const double samples = double(result.steps) * double(t.batch_size) * (transformer ? t.block_size : 1);
    std::string overrides;
    for (const auto& pair : t.shampoo) overrides += (overrides.empty() ? "" : " ") + pair;
    if (rank == 0)
      emit({{"bench", "tta"},
            {"model", o.model},
            {"optimizer", name},
            {"target", transformer ? o.target_loss : o.target},
            {"target_kind", transformer ? "validation_loss_nats_per_char" : "test_accuracy"},
            {"reached", result.reached_target},
            {"steps", steps},
            {"seconds", seconds},
            {"seconds_with_evaluations", with_evaluations},
            {"samples_per_second", result.training_seconds > 0 ? samples / result.training_seconds : 0.0},
            {"learning_rate", t.learning_rate()},
            {"schedule", t.schedule},
            {"batch_size", t.batch_size},
            {"ranks", ranks},
            {"product_precision", products},
            {"seed", o.seed},
            {"eval_every", o.eval_every},
            {"final_test_accuracy", result.test_accuracy},
            {"final_validation_loss", transformer ? result.test_loss : -1.0},
            {"tokens_per_second", result.tokens_per_second},
            {"model_flop_utilization", result.model_flop_utilization},
            {"baseline", o.optimizers.front()},
            {"ratio_steps", steps > 0 && baseline_steps > 0 ? steps / baseline_steps : -1.0},
            {"ratio_seconds", seconds > 0 && baseline_seconds > 0 ? seconds / baseline_seconds : -1.0},
            {"shampoo_overrides", optimizer == train::OptimizerKind::shampoo ? overrides : std::string()}});
  }
}

}  // namespace

void register_tta(CLI::App& app) {
  auto options = std::make_shared<TtaOptions>();
  auto* sub = app.add_subcommand(
      "tta",
      "Time to accuracy on Fashion-MNIST: steps and seconds to reach --target test accuracy, for each "
      "optimizer with lather-train's defaults (the first optimizer listed is the baseline of the ratios)");
  add_list_option(*sub, "--optimizers", options->optimizers, "Optimizers, baseline first");
  sub->add_option("--target", options->target, "Target test accuracy")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--eval-every", options->eval_every, "Evaluate the test accuracy every N steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--epochs", options->epochs, "Give up after this many epochs")->capture_default_str();
  sub->add_option("--data", options->data, "Fashion-MNIST directory")->capture_default_str();
  sub->add_option("--model", options->model,
                  "mlp (Fashion-MNIST, --target accuracy) or transformer (--text, --target-loss validation nats/char)")
      ->check(CLI::IsMember({"mlp", "transformer"}))
      ->capture_default_str();
  sub->add_option("--text", options->text, "transformer: the text (lather-train --text)")->capture_default_str();
  sub->add_option("--target-loss", options->target_loss, "transformer: target validation loss, nats/char")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-steps", options->max_steps,
                  "transformer: give up after this many steps (0: lather-train's run)")
      ->capture_default_str();
  sub->add_option("--seed", options->seed, "Seed of the initial weights and the data order (lather-train --seed)")
      ->capture_default_str();
  add_list_option(*sub, "--shampoo", options->shampoo,
                  "Shampoo options over lather-train's defaults, name=value (e.g. preconditioning_compute_steps=50)");
  sub->add_option("--product-precision", options->product_precision,
                  "The optimizers' products' inputs: float32, tf32 or bfloat16 (Shampoo's and SOAP's "
                  "product_precision, Muon's newton_schulz_precision; tensor cores on CUDA)")
      ->capture_default_str();
  add_list_option(*sub, "--lr", options->learning_rates,
                  "Peak learning rates other than lather-train's defaults, optimizer=value (e.g. shampoo=0.005)");
  sub->callback([options] { run_tta(*options); });
}

}  // namespace lather::bench
