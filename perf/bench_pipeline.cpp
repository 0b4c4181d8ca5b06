// lather-bench pipeline: the transformer on pipeline stages, measured. For each schedule (GPipe
// first, the baseline of the ratios, then 1F1B) one training run over the MPI ranks it is
// launched with (replicas x --stages stages), and before them the same ranks as replicas alone
// (the data-parallel baseline of tokens/s). Per schedule: each stage's time in passes and its
// idle fraction over the last --steps - --warmup-steps steps, the measured bubble beside the
// bound (P - 1) / (M + P - 1) and beside the bubble its last step's pass times allow, the
// activations each stage keeps for backward (from the Views), and tokens/s.
#include "bench_common.hpp"

#include "trainer.hpp"

#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>
#include <lather/nn/pipeline_schedule.hpp>

#include <mpi.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <utility>

namespace lather::bench {
namespace {

struct PipelineOptions {
  std::string text = "/usr/share/datasets/shakespeare";
  int stages = 2;
  int micro_batches = 8;
  int n_layer = 4, n_head = 4, d_model = 128, block_size = 64, batch_size = 32;
  long steps = 30;
  long warmup_steps = 10;  ///< not measured: the first steps allocate and warm the caches
  std::string optimizer = "adamw";
  bool data_parallel_baseline = true;
};

/// The idle fraction of one step of replica 0 / shard 0 from a --pipeline-timeline file: measured
/// (1 - each stage's time in passes over the step's span, averaged over the stages), and replayed
/// (the same passes, each as long as measured, run in the schedule's order with the data between
/// stages arriving the moment it is sent). The replay is what the schedule allows with these
/// pass times; what the measured bubble has beyond it is the transfers' cost.
std::pair<double, double> step_bubbles(const std::string& file) {
  std::ifstream in(file);
  const auto timeline = nlohmann::json::parse(in);
  const int P = timeline["pipeline_stages"];
  std::vector<std::vector<nlohmann::json>> lanes(static_cast<std::size_t>(P));
  for (const auto& r : timeline["ranks"])
    if (r["replica"] == 0 && r["shard"] == 0) lanes[r["stage"].get<std::size_t>()] = r["passes"];
  std::vector<double> busy(static_cast<std::size_t>(P), 0.0), clock(static_cast<std::size_t>(P), 0.0);
  std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
  std::map<std::tuple<int, bool, int>, double> ends;  // (stage, forward, micro-batch) -> replayed end
  double measured_span = 0;
  for (int s = 0; s < P; ++s)
    for (const auto& p : lanes[std::size_t(s)]) {
      busy[std::size_t(s)] += p["end"].get<double>() - p["begin"].get<double>();
      measured_span = std::max(measured_span, p["end"].get<double>());
    }
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < P; ++s) {
      auto& k = next[std::size_t(s)];
      if (k >= lanes[std::size_t(s)].size()) continue;
      const auto& p = lanes[std::size_t(s)][k];
      const bool forward = p["pass"] == "forward";
      const int m = p["micro_batch"];
      double ready = clock[std::size_t(s)];
      const int from = forward ? s - 1 : s + 1;  // the stage whose pass this one waits for
      if (from >= 0 && from < P) {
        const auto dependency = ends.find({from, forward, m});
        if (dependency == ends.end()) continue;
        ready = std::max(ready, dependency->second);
      }
      clock[std::size_t(s)] = ready + (p["end"].get<double>() - p["begin"].get<double>());
      ends[{s, forward, m}] = clock[std::size_t(s)];
      ++k;
      progressed = true;
    }
  }
  const double replayed_span = *std::max_element(clock.begin(), clock.end());
  double measured = 0, replayed = 0;
  for (int s = 0; s < P; ++s) {
    measured += (1.0 - busy[std::size_t(s)] / std::max(measured_span, 1e-12)) / P;
    replayed += (1.0 - busy[std::size_t(s)] / std::max(replayed_span, 1e-12)) / P;
  }
  return {measured, replayed};
}

/// The metrics records of one run, read on rank 0.
std::vector<nlohmann::json> records(const std::string& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

void run_pipeline(const PipelineOptions& o) {
  const comm::Group world(MPI_COMM_WORLD);
  const int rank = world.rank(), ranks = world.size();
  LATHER_REQUIRE(o.steps > o.warmup_steps && o.warmup_steps >= 1, "--steps ", o.steps, " must exceed --warmup-steps ",
                 o.warmup_steps, " (>= 1)");
  const auto metrics =
      (std::filesystem::temp_directory_path() / ("lather-bench-pipeline-" + std::to_string(getpid()) + ".jsonl"))
          .string();
  std::string metrics_file = metrics;
  world.broadcast(metrics_file, 0);
  nlohmann::json baseline, gpipe;
  std::vector<std::string> runs;
  if (o.data_parallel_baseline) runs.push_back("replicas");
  runs.push_back("gpipe");
  runs.push_back("1f1b");
  for (const auto& run : runs) {
    train::TrainOptions t = train::model_defaults(train::ModelKind::transformer);
    t.text = o.text;
    t.n_layer = o.n_layer, t.n_head = o.n_head, t.d_model = o.d_model, t.block_size = o.block_size;
    t.batch_size = o.batch_size;
    t.optimizer = train::parse_optimizer(o.optimizer);
    if (t.optimizer != train::OptimizerKind::shampoo && t.optimizer != train::OptimizerKind::soap) t.shampoo.clear();
    t.max_steps = o.steps;
    t.log_every = o.warmup_steps;  // one window of warm-up, then the measured ones
    t.eval_every = 0;
    t.eval_windows = 8;
    t.quiet = true;
    t.metrics = metrics_file;
    const std::string timeline_file = metrics_file + ".timeline.json";
    if (run == "replicas") {
      t.accumulate = o.micro_batches;  // the same micro-batches per replica's share
    } else {
      t.pipeline_stages = o.stages;
      t.micro_batches = o.micro_batches;
      t.pipeline_schedule = run;
      t.pipeline_timeline = timeline_file;
    }
    const auto result = train::train(t, world, [](const std::string&) {});
    if (rank != 0) continue;
    // The measured steps: the windows after the first (warm-up) line.
    double busy_max = 0, busy_min = 1e300, seconds = 0, tokens = 0;
    std::vector<double> busy, schedule;
    nlohmann::json kept;
    for (const auto& r : records(metrics_file)) {
      if (r.contains("memory_kept_activations_by_stage")) kept = r["memory_kept_activations_by_stage"];
      if (!r.contains("bits_per_char") || r["step"].get<long>() <= o.warmup_steps) continue;
      const double window = r.contains("stage_busy_seconds") ? 1.0 : 0.0;
      if (window > 0) {
        const auto b = r["stage_busy_seconds"].get<std::vector<double>>();
        const auto s = r["stage_schedule_seconds"].get<std::vector<double>>();
        busy.resize(b.size(), 0.0), schedule.resize(s.size(), 0.0);
        for (std::size_t k = 0; k < b.size(); ++k) busy[k] += b[k], schedule[k] += s[k];
      }
      tokens += r["tokens_per_second"].get<double>();
      seconds += 1;
    }
    std::filesystem::remove(metrics_file);
    const double tokens_per_second = seconds > 0 ? tokens / seconds : 0;
    nlohmann::json record = {{"bench", "pipeline"},
                             {"run", run},
                             {"ranks", ranks},
                             {"stages", run == "replicas" ? 1 : o.stages},
                             {"micro_batches", o.micro_batches},
                             {"n_layer", o.n_layer},
                             {"d_model", o.d_model},
                             {"block_size", o.block_size},
                             {"batch_size", o.batch_size},
                             {"optimizer", o.optimizer},
                             {"steps_measured", o.steps - o.warmup_steps},
                             {"tokens_per_second", tokens_per_second},
                             {"final_train_loss", result.train_loss}};
    if (run != "replicas") {
      const auto idle = nn::stage_idle_fractions(busy, schedule);
      double mean = 0;
      for (std::size_t k = 0; k < busy.size(); ++k) {
        mean += idle[k] / double(busy.size());
        busy_max = std::max(busy_max, busy[k]), busy_min = std::min(busy_min, busy[k]);
      }
      const double bound = nn::bubble_bound(o.stages, o.micro_batches);
      record["stage_busy_seconds"] = busy;
      record["stage_imbalance"] = busy_min > 0 ? busy_max / busy_min - 1.0 : -1.0;
      record["stage_idle_fraction"] = idle;
      record["bubble_fraction"] = mean;
      record["bubble_bound"] = bound;
      record["bubble_minus_bound"] = mean - bound;
      const auto [last_step, replayed] = step_bubbles(timeline_file);
      std::filesystem::remove(timeline_file);
      record["last_step_bubble"] = last_step;
      record["last_step_bubble_replayed"] = replayed;
      record["kept_activations_by_stage"] = kept;
      if (run == "gpipe") gpipe = record;
      record["baseline"] = "gpipe";
      const double kept_first = kept.empty() ? 0.0 : kept[0].get<double>();
      const double gpipe_first =
          gpipe.contains("kept_activations_by_stage") && !gpipe["kept_activations_by_stage"].empty()
              ? gpipe["kept_activations_by_stage"][0].get<double>()
              : 0.0;
      record["ratio_kept_activations_first_stage"] = gpipe_first > 0 ? kept_first / gpipe_first : -1.0;
      record["kept_activations_bound_ratio"] = double(o.stages) / double(o.micro_batches);
      const double base = baseline.contains("tokens_per_second") ? baseline["tokens_per_second"].get<double>() : 0.0;
      record["ratio_tokens_per_second_to_replicas"] = base > 0 ? tokens_per_second / base : -1.0;
    } else {
      baseline = record;
    }
    emit(record);
  }
}

}  // namespace

void register_pipeline(CLI::App& app) {
  auto options = std::make_shared<PipelineOptions>();
  auto* sub = app.add_subcommand(
      "pipeline",
      "The transformer on pipeline stages: per-stage busy and idle time, the measured bubble beside "
      "(P-1)/(M+P-1), kept activations and tokens/s, for gpipe (the baseline) and 1f1b, after the same ranks "
      "as replicas alone");
  sub->add_option("--text", options->text, "The text (lather-train --text)")->capture_default_str();
  sub->add_option("--stages", options->stages, "Pipeline stages (divides the rank count)")->capture_default_str();
  sub->add_option("--micro-batches", options->micro_batches, "Micro-batches per step")->capture_default_str();
  sub->add_option("--n-layer", options->n_layer, "Blocks")->capture_default_str();
  sub->add_option("--n-head", options->n_head, "Attention heads")->capture_default_str();
  sub->add_option("--d-model", options->d_model, "Model width")->capture_default_str();
  sub->add_option("--block-size", options->block_size, "Context")->capture_default_str();
  sub->add_option("--batch-size", options->batch_size, "Windows per step")->capture_default_str();
  sub->add_option("--steps", options->steps, "Steps per run")->capture_default_str();
  sub->add_option("--warmup-steps", options->warmup_steps, "Steps not measured")->capture_default_str();
  sub->add_option("--optimizer", options->optimizer, "lather-train --optimizer")->capture_default_str();
  sub->add_flag("!--no-replicas-baseline", options->data_parallel_baseline,
                "Skip the run of the same ranks as replicas");
  sub->callback([options] { run_pipeline(*options); });
}

}  // namespace lather::bench
