#include "language_model_trainer.hpp"

#include "dataset.hpp"
#include "memory_estimate.hpp"
#include "optimizer_factory.hpp"
#include "progress.hpp"
#include "resume.hpp"
#include "sharded_checkpoint.hpp"
#include "training_step.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/comm.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/gemm.hpp>
#include <lather/data/text.hpp>
#include <lather/nn/transformer.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>

namespace lather::train {

namespace {

using Model = nn::Transformer<Space, float>;
constexpr int padded_vocabulary_multiple = 128;

/// Host staging of a micro-batch of windows: inputs tokens[o, o + time), targets one further.
class WindowBatch {
 public:
  explicit WindowBatch(std::size_t capacity)
      : m_inputs(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather-train::inputs"), capacity),
        m_targets(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather-train::targets"), capacity),
        m_host_inputs(Kokkos::create_mirror_view(m_inputs)),
        m_host_targets(Kokkos::create_mirror_view(m_targets)) {}

  void load(const Space& space, const std::vector<std::int32_t>& tokens, const std::int64_t* offsets, int windows,
            int time) {
    for (int w = 0; w < windows; ++w)
      for (int t = 0; t < time; ++t) {
        const std::size_t at = std::size_t(offsets[w] + t);
        m_host_inputs(std::size_t(w) * time + t) = tokens[at];
        m_host_targets(std::size_t(w) * time + t) = tokens[at + 1];
      }
    Kokkos::deep_copy(space, m_inputs, m_host_inputs);
    Kokkos::deep_copy(space, m_targets, m_host_targets);
  }
  const Model::Tokens& inputs() const { return m_inputs; }
  const Model::Tokens& targets() const { return m_targets; }

 private:
  Model::Tokens m_inputs, m_targets;
  typename Model::Tokens::HostMirror m_host_inputs, m_host_targets;
};

/// The same-run GEMM throughput of this backend (flop/s) at the model's largest product shape:
/// the denominator of the model FLOP utilisation.
double gemm_flops_per_second(const Space& space, int m, int k, int n) {
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;
  Matrix a("lather-train::gemm_a", m, k), b("lather-train::gemm_b", k, n), c("lather-train::gemm_c", m, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  const auto run = [&] { ::lather::Impl::gemm(space, "N", "N", 1.0f, a, b, 0.0f, c); };
  run();
  Impl::fence(space, "lather-train: GEMM warm-up");
  // The best of five 0.1 s windows: the throughput this backend reaches on this machine, which a
  // busy neighbour can only lower.
  double best = 0;
  for (int window = 0; window < 5; ++window) {
    int reps = 0;
    const auto began = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < 0.1 || reps < 2) {
      run();
      Impl::fence(space, "lather-train: GEMM timed");
      ++reps;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    }
    best = std::max(best, 2.0 * double(m) * double(k) * double(n) * reps / elapsed);
  }
  return best;
}

std::string mib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", double(bytes) / 1048576.0);
  return text;
}

/// Picks the next character from logits at `temperature` with one uniform draw.
std::int32_t sample_from(const std::vector<double>& logits, double temperature, std::mt19937_64& rng) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  double total = 0;
  for (std::size_t v = 0; v < logits.size(); ++v) total += weights[v] = std::exp((logits[v] - top) / temperature);
  double u = double(rng() >> 11) * 0x1.0p-53 * total;
  for (std::size_t v = 0; v < weights.size(); ++v) {
    if (u < weights[v]) return std::int32_t(v);
    u -= weights[v];
  }
  return std::int32_t(weights.size() - 1);
}

/// Every rank's passes of one step, gathered to rank 0 and written as JSON (a schedule's timeline,
/// which scripts/pipeline-timeline draws). Collective over the mesh.
void write_pipeline_timeline(const std::string& file, const comm::Mesh& mesh, const TrainOptions& o,
                             const std::vector<nn::PipelineEvent>& events) {
  std::vector<double> mine;
  for (const auto& e : events) mine.insert(mine.end(), {e.forward ? 1.0 : 0.0, double(e.micro_batch), e.begin, e.end});
  const int n = mesh.world_size();
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
  const std::int64_t mine_count = std::int64_t(mine.size());
  mesh.world().allgather(&mine_count, 1, counts.data());
  const std::vector<std::size_t> sizes(counts.begin(), counts.end());
  std::size_t total = 0;
  for (auto c : sizes) total += c;
  std::vector<double> all(total);
  mesh.world().allgatherv(mine.data(), all.data(), sizes);
  mesh.world().run_agreed("--pipeline-timeline", [&] {
    if (mesh.world_rank() != 0) return;
    const int S = mesh.weight_shards(), P = mesh.pipeline_stages();
    nlohmann::json ranks = nlohmann::json::array();
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      nlohmann::json passes = nlohmann::json::array();
      for (std::size_t k = 0; k < sizes[std::size_t(r)]; k += 4, at += 4)
        passes.push_back({{"pass", all[at] > 0 ? "forward" : "backward"},
                          {"micro_batch", int(all[at + 1])},
                          {"begin", all[at + 2]},
                          {"end", all[at + 3]}});
      ranks.push_back(
          {{"rank", r}, {"replica", r / (S * P)}, {"stage", (r / S) % P}, {"shard", r % S}, {"passes", passes}});
    }
    const nlohmann::json timeline = {{"schedule", o.pipeline_schedule},
                                     {"pipeline_stages", P},
                                     {"weight_shards", S},
                                     {"micro_batches", o.micro_batches},
                                     {"accumulate", o.accumulate},
                                     {"bubble_bound", nn::bubble_bound(P, o.micro_batches)},
                                     {"ranks", ranks}};
    std::ofstream out(file);
    LATHER_REQUIRE(out, "--pipeline-timeline '", file, "' cannot be written");
    out << timeline.dump(1) << "\n";
    LATHER_REQUIRE(out.good(), "--pipeline-timeline '", file, "': the write failed");
  });
}

}  // namespace

TrainResult train_language_model(const TrainOptions& options, const comm::Group& world,
                                 const std::function<void(const std::string&)>& log_sink) {
  options.validate();
  LATHER_REQUIRE(options.pipeline_stages > 1 || world.size() % options.weight_shards == 0, "--weight-shards ",
                 options.weight_shards, " does not divide the ", world.size(),
                 " ranks (each replica holds --weight-shards ranks)");
  LATHER_REQUIRE(world.size() % (options.weight_shards * options.pipeline_stages) == 0, "--pipeline-stages ",
                 options.pipeline_stages, " x --weight-shards ", options.weight_shards, " does not divide the ",
                 world.size(), " ranks (each replica holds stages x shards ranks)");
  const comm::Mesh mesh(world, options.weight_shards, options.pipeline_stages);
  const nn::PipelineSchedule schedule = nn::parse_pipeline_schedule(options.pipeline_schedule);
  const int stages = mesh.pipeline_stages();
  const Space space;
  const data::TextCorpus corpus = data::load_text_corpus(options.text);
  const int replicas = mesh.replicas(), replica = mesh.replica();
  const int block = options.block_size;
  LATHER_REQUIRE(corpus.train.size() > std::size_t(block) && corpus.validation.size() > std::size_t(block), "--text '",
                 options.text, "': ", corpus.train.size(), " training and ", corpus.validation.size(),
                 " validation characters; each needs more than --block-size ", block);

  const long batch = options.batch_size;
  const long tokens_per_step = batch * block;
  const long steps_per_epoch = std::max<long>(1, long(corpus.train.size()) / tokens_per_step);
  const long planned = options.max_steps > 0 ? std::min<long>(options.max_steps, options.epochs * steps_per_epoch)
                                             : options.epochs * steps_per_epoch;
  TrainOptions o = options;
  o.schedule_steps = std::max(1L, planned);  // the learning-rate schedule spans this run
  ProgressLog log(o, mesh.world_rank() == 0, log_sink);

  // What sampling reads is checked now, not after the training it follows.
  if (o.sample > 0)
    LATHER_REQUIRE(!corpus.vocabulary.encode(o.prompt, "--prompt").empty(),
                   "--prompt is empty: give at least one character to continue");

  // Everything checked before anything is built: the checkpoint to resume (which may fix
  // Shampoo's block size), then the memory.
  const auto checkpointer = make_checkpointer(mesh, o);
  const std::string vocabulary = corpus.vocabulary.to_string();
  std::optional<ResumeSource> source;
  if (o.resume && checkpointer) source = find_resume_source(*checkpointer, o, log);
  if (source) {
    match_checkpoint(*source, o, log);
    const auto& strings = source->attributes.strings;
    const auto stored = strings.find("vocabulary");
    LATHER_REQUIRE(stored != strings.end() && stored->second == vocabulary, "checkpoint ", source->file,
                   " was trained on a vocabulary of ",
                   stored == strings.end() ? 0 : data::Vocabulary::from_string(stored->second).size(),
                   " characters that differs from the ", corpus.vocabulary.size(), " of --text '", o.text, "'");
  }

  nn::TransformerConfig config;
  // The vocabulary is padded to a multiple of 128 (Megatron's make-vocab-size-divisible-by): the
  // shards' slices of the embedding and the head then align with Shampoo's blocks on any shard
  // count up to 128 / block_size, and the shapes, hence checkpoints, do not depend on the shard
  // count. No text token maps to a padding id; their logits only learn to stay low.
  const int characters = corpus.vocabulary.size();
  config.vocab_size =
      (characters + padded_vocabulary_multiple - 1) / padded_vocabulary_multiple * padded_vocabulary_multiple;
  config.n_layer = o.n_layer;
  config.n_head = o.n_head;
  config.d_model = o.d_model;
  config.block_size = block;
  config.z_loss = o.z_loss;
  // The largest micro-batch of any replica (share() gives the first ones one window more): the
  // staging, and the evaluation's pieces, so that evaluating never grows the model's activations.
  // A step is o.accumulate rounds of o.micro_batches micro-batches (one pipeline schedule each).
  const long micro_steps = long(o.accumulate) * o.micro_batches;
  const long micro_windows = std::max(1L, ((batch + replicas - 1) / replicas + micro_steps - 1) / micro_steps);
  const MemoryEstimate estimate =
      estimate_transformer_memory(o, config.vocab_size, replicas, mesh.weight_shards(), micro_windows,
                                  nn::activation_slots(schedule, stages, 0, o.micro_batches));
  check_memory(estimate, world);
  Model model(space, config, o.seed, mesh);
  // Sharded, the optimizer updates this rank's bands of the parameters; else all of them.
  const auto shards = o.shard_parameters ? shard_parameters(space, o, mesh, model) : nullptr;
  const auto& parameters = shards ? sharded_parameters(o, *shards) : model.parameters();
  const auto optimizer = shards ? make_sharded_optimizer(space, o, parameters.specs(), mesh)
                                : make_optimizer(space, o, parameters.specs(), mesh);
  const auto reducer = make_reducer(mesh, o, model.parameter_specs());
  if (!shards) place_gradients(space, *reducer, model);
  overlap_step_gather(space, o, *optimizer, model.parameter_layers(), log);
  if (source) {
    if (shards)
      load_sharded_checkpoint(space, o, mesh, *source, *checkpointer, *optimizer, *shards, log);
    else
      load_checkpoint(space, *source, *checkpointer, *optimizer, parameters, log);
  }
  const long first_step = optimizer->step_count();
  check_checkpoint_directory(checkpointer.get(), first_step, planned);
  log.open_metrics(first_step > 0);
  {
    char line[512];
    std::snprintf(
        line, sizeof line,
        "lather-train: %d ranks = %d replicas x %s%d weight shards, transformer %d layers x %d heads, "
        "d_model %d, context %d, vocabulary %d padded to %d (%.2fM parameters), %s (lr %.3g), %ld windows per step "
        "(%ld per replica%s), %ld steps",
        mesh.world_size(), replicas,
        stages > 1 ? (std::to_string(stages) + " pipeline stages (" + o.pipeline_schedule + ") x ").c_str() : "",
        mesh.weight_shards(), config.n_layer, config.n_head, config.d_model, block, characters, config.vocab_size,
        double(config.parameter_count()) / 1e6, to_string(o.optimizer).c_str(), o.learning_rate(), batch,
        batch / replicas, micro_steps > 1 ? (" in " + std::to_string(micro_steps) + " micro-batches").c_str() : "",
        planned);
    log.say(line);
    log.say("text " + corpus.source + ": " + std::to_string(corpus.train.size()) + " training and " +
            std::to_string(corpus.validation.size()) + " validation characters");
    if (shards) log.say(describe_sharded_memory(mesh, *shards, optimizer->memory_report()));
  }

  // One staging per micro-batch of a pipeline round: a schedule reads them all.
  std::vector<WindowBatch> stagings;
  for (int m = 0; m < o.micro_batches; ++m) stagings.emplace_back(std::size_t(micro_windows * block));
  WindowBatch& staging = stagings[0];
  TrainResult result;

  // Validation: the same windows every time, each replica its share, in micro-batches.
  const auto validation_offsets =
      data::window_offsets(o.seed ^ 0x5EEDULL, -1, int(o.eval_windows), std::int64_t(corpus.validation.size()), block);
  // Returns false, reporting nothing, when a signal stops it: agreed after every micro-batch, each
  // rank taking as many rounds as the largest share needs.
  const auto evaluate = [&](long step) {
    const double began = log.seconds();
    optimizer->values_needed(space);  // the last step's values, where the forward left any in flight
    const long windows_total = long(validation_offsets.size());
    // Not structured bindings: the round's lambda below captures them (C++17 forbids it; clang
    // refuses).
    const auto mine = share(windows_total, replicas, replica);
    const long begin = mine.first, end = mine.second;
    const long rounds = ((windows_total + replicas - 1) / replicas + micro_windows - 1) / micro_windows;
    double sums[3] = {0, 0, 0};
    for (long round = 0; round < rounds; ++round) {
      const long w = begin + round * micro_windows;
      evaluation_round(space, shards.get(), w < end, [&] {
        const int windows = int(std::min(end - w, micro_windows));
        staging.load(space, corpus.validation, validation_offsets.data() + w, windows, block);
        const auto r = model.evaluate(space, windows, block, staging.inputs(), staging.targets(),
                                      shards ? shards->needed_hook(space) : ParametersNeeded());
        sums[0] += r.loss, sums[1] += double(r.correct), sums[2] += double(r.tokens);
      });
      if (termination_agreed(mesh.world())) return false;
    }
    mesh.data_parallel().allreduce(sums, 3, comm::Combine::sum);
    if (stages > 1) mesh.pipeline().allreduce(sums, 3, comm::Combine::sum);  // the last stage's
    log.add_evaluation_time(log.seconds() - began);
    result.test_loss = sums[0] / sums[2];
    result.test_accuracy = sums[1] / sums[2];
    if (o.target_loss > 0 && result.test_loss <= o.target_loss)
      result.reach_target(step, log.loop_seconds(), log.training_seconds());
    char line[256];
    std::snprintf(line, sizeof line, "step %ld: validation loss %.4f nats/char (%.3f bits/char), accuracy %.2f%% (%s)",
                  step, result.test_loss, result.test_loss / std::log(2.0), 100 * result.test_accuracy,
                  format_duration(log.seconds()).c_str());
    log.say(line);
    log.record({{"step", step},
                {"seconds", log.seconds()},
                {"training_seconds", log.training_seconds()},
                {"validation_loss", result.test_loss},
                {"validation_accuracy", result.test_accuracy},
                {"train_loss", result.train_loss}});
    return true;
  };
  const auto save = [&]() {
    if (!checkpointer) return;
    checkpoint::TrainingState state;
    state.rng = {o.seed};
    describe_run(o, state);
    state.extra.strings["vocabulary"] = vocabulary;
    result.last_checkpoint = shards ? save_sharded_checkpoint(space, o, mesh, *checkpointer, *optimizer, *shards, state)
                                    : checkpointer->save(space, *optimizer, parameters, state);
  };
  // A signal agreed over the mesh: the checkpoint of the last completed step, and the end.
  const auto stop_on_signal = [&] {
    save();
    log.say(termination_signal_name() + ": checkpoint " + result.last_checkpoint + " written at step " +
            std::to_string(optimizer->step_count()) + "; continue with --resume");
    result.interrupted = true;
  };

  double window[3] = {0, 0, 0};  // loss, correct and tokens since the last progress line
  log.start_training();
  double last_line_seconds = log.training_seconds();
  long trained_tokens = 0;
  // Pipeline time since the last progress line: in passes, and in whole schedules.
  double busy_seconds = 0, schedule_seconds = 0;
  std::vector<nn::PipelineEvent> last_step_events;
  for (long step = first_step; step < planned; ++step) {
    const auto offsets = data::window_offsets(o.seed, step, int(batch), std::int64_t(corpus.train.size()), block);
    // Not structured bindings: the passes' lambda below captures them (C++17 forbids it; clang
    // refuses).
    const auto mine = share(batch, replicas, replica);
    const long mine_begin = mine.first, mine_end = mine.second;
    nn::LanguageModelSums local;  // the last stage's sums
    long step_tokens = 0;         // this replica's tokens, known on every stage
    bool written = false;         // gradients written by an earlier round of this step
    double step_schedule = 0;
    last_step_events.clear();
    if (shards) {
      // Each micro-batch's gradients are reduce-scattered layer by layer into the owned bands.
      sharded_step(space, *shards, int(micro_steps), *optimizer, parameters,
                   [&](int k, const GradientsReady& ready, const ParametersNeeded& needed) {
                     const auto [m0, m1] = share(mine_end - mine_begin, micro_steps, k);
                     if (m1 == m0) return 0.0;
                     staging.load(space, corpus.train, offsets.data() + mine_begin + m0, int(m1 - m0), block);
                     const auto r = model.train_batch(space, int(m1 - m0), block, staging.inputs(), staging.targets(),
                                                      false, ready, needed);
                     local.loss += r.loss, local.correct += r.correct, local.tokens += r.tokens;
                     step_tokens += (m1 - m0) * block;
                     return double(r.tokens);
                   });
    } else {
      const GradientsReady ready =
          start_reduction(space, o, *reducer, parameters, double((mine_end - mine_begin) * block));
      const long last_piece = last_nonempty_share(mine_end - mine_begin, micro_steps);
      const ParametersNeeded needed = step_gather_hook(space, o, *optimizer);
      run_passes(space, *reducer, [&] {
        for (int round = 0; round < o.accumulate; ++round) {
          std::vector<Model::MicroBatch> micro_batches;
          for (int j = 0; j < o.micro_batches; ++j) {
            const auto [m0, m1] = share(mine_end - mine_begin, micro_steps, long(round) * o.micro_batches + j);
            if (m1 == m0) continue;
            auto& into = stagings[micro_batches.size()];
            into.load(space, corpus.train, offsets.data() + mine_begin + m0, int(m1 - m0), block);
            micro_batches.push_back({int(m1 - m0), block, into.inputs(), into.targets()});
            step_tokens += (m1 - m0) * block;
          }
          if (micro_batches.empty()) continue;
          nn::PipelineTimes times;
          // The passes' times (a fence after each) only where they are reported.
          const bool timing = stages > 1 || !o.pipeline_timeline.empty();
          // The hook in the round of the step's last micro-batch, whose backward is the last.
          const bool last_round = last_piece / o.micro_batches == round;
          const auto r = model.train_micro_batches(space, schedule, micro_batches, written, timing ? &times : nullptr,
                                                   last_round ? ready : GradientsReady(), needed);
          written = true;
          local.loss += r.loss, local.correct += r.correct, local.tokens += r.tokens;
          busy_seconds += times.busy, schedule_seconds += times.seconds;
          for (auto e : times.events) {  // the rounds one after the other
            e.begin += step_schedule, e.end += step_schedule;
            last_step_events.push_back(e);
          }
          step_schedule += times.seconds;
        }
      });
      reduce_and_step(space, o, *reducer, *optimizer, parameters, double(step_tokens));
    }
    // Over the whole mesh, so that a signal seen by any rank stops every rank after this step;
    // the shards of a replica hold the same sums, counted once by dividing by their number.
    double sums[4] = {local.loss, double(local.correct), double(local.tokens), double(termination_requested())};
    mesh.world().allreduce(sums, 4, comm::Combine::sum);
    for (int i = 0; i < 3; ++i) sums[i] /= mesh.weight_shards();
    for (int i = 0; i < 3; ++i) window[i] += sums[i];
    trained_tokens += long(sums[2]);
    const long done = step + 1;
    if (step == first_step) {
      // What each rank holds, measured from the Views the run allocated (activations exist now).
      auto memory = model.memory();
      if (shards) {  // the model reads the gather buffers: the owned bands and those buffers
        const auto m = shards->memory();
        memory.parameters = m.owned_values + m.gather_values;
        memory.gradients = m.owned_gradients + m.gather_gradients;
      }
      const auto state = optimizer->memory_report().total();
      const std::int64_t total =
          memory.parameters + memory.gradients + state + memory.activations + memory.communication;
      const std::int64_t largest = mesh.world().allreduce(total, comm::Combine::max);
      log.say("memory on rank 0: parameters " + mib(memory.parameters) + ", gradients " + mib(memory.gradients) +
              ", optimizer state " + mib(state) + ", activations " + mib(memory.activations) +
              ", communication buffers " + mib(memory.communication) + "; total " + mib(total) +
              " (largest on any rank " + mib(largest) + "; estimated before the run " + mib(estimate.total()) + ")");
      log.record({{"memory_parameters", memory.parameters},
                  {"memory_gradients", memory.gradients},
                  {"memory_optimizer_state", state},
                  {"memory_activations", memory.activations},
                  {"memory_communication", memory.communication},
                  {"memory_kept_activations", memory.kept_activations},
                  {"memory_total_largest", largest}});
      if (stages > 1) {
        // Every stage's activations kept for backward, the first stage's bounding the schedule.
        std::vector<std::int64_t> kept(static_cast<std::size_t>(stages));
        mesh.pipeline().allgather(&memory.kept_activations, 1, kept.data());
        log.record({{"step", done}, {"memory_kept_activations_by_stage", kept}});
      }
    }
    const bool terminate = sums[3] > 0;
    if ((o.log_every > 0 && done % o.log_every == 0) || done == planned || terminate) {
      const double now = log.training_seconds();
      const double rate = window[2] / std::max(now - last_line_seconds, 1e-9);
      const double loss = window[0] / std::max(window[2], 1.0);
      const double eta = double(planned - done) * log.loop_seconds() / double(std::max(1L, done - first_step));
      result.train_loss = loss;
      char line[256];
      std::snprintf(line, sizeof line, "step %ld/%ld loss %.4f nats/char (%.3f bits/char) %.0f tokens/s ETA %s", done,
                    planned, loss, loss / std::log(2.0), rate, format_duration(eta).c_str());
      nlohmann::json record = {{"step", done},
                               {"loss", loss},
                               {"bits_per_char", loss / std::log(2.0)},
                               {"train_accuracy", window[1] / std::max(window[2], 1.0)},
                               {"tokens_per_second", rate},
                               {"seconds", log.seconds()},
                               {"training_seconds", now},
                               {"learning_rate", o.learning_rate()}};
      if (stages > 1) {
        // Each stage's time in passes and in whole schedules since the last line (replica 0's on
        // rank 0): the idle fraction is the measured bubble.
        const double mine[2] = {busy_seconds, schedule_seconds};
        std::vector<double> all(2 * std::size_t(stages));
        mesh.pipeline().allgather(mine, 2, all.data());
        std::vector<double> busy, total;
        for (int st = 0; st < stages; ++st) {
          busy.push_back(all[2 * std::size_t(st)]);
          total.push_back(all[2 * std::size_t(st) + 1]);
        }
        const auto bubble = nn::stage_idle_fractions(busy, total);
        double bubble_mean = 0;
        for (double b : bubble) bubble_mean += b / stages;
        const double bound = nn::bubble_bound(stages, o.micro_batches);
        record["stage_busy_seconds"] = busy;
        record["stage_schedule_seconds"] = total;
        record["stage_bubble_fraction"] = bubble;
        record["bubble_fraction"] = bubble_mean;
        record["bubble_bound"] = bound;
        const std::size_t used = std::strlen(line);
        std::snprintf(line + used, sizeof line - used, " bubble %.3f (bound %.3f)", bubble_mean, bound);
        busy_seconds = schedule_seconds = 0;
      }
      if (!o.quiet) log.say(line);
      log.record(record);
      window[0] = window[1] = window[2] = 0;
      last_line_seconds = now;
    }
    if (terminate) {
      stop_on_signal();
      break;
    }
    if (o.eval_every > 0 && done % o.eval_every == 0 && done != planned) {
      if (!evaluate(done)) {
        stop_on_signal();
        break;
      }
      if (result.reached_target) break;
    }
    if (o.checkpoint_every > 0 && done % o.checkpoint_every == 0) save();
  }
  result.steps = optimizer->step_count();
  result.training_seconds = log.training_seconds();
  if (!result.interrupted) {
    const bool saved = o.checkpoint_every > 0 && result.steps % o.checkpoint_every == 0;
    if (!result.reached_target && !evaluate(result.steps)) {
      if (result.steps > first_step && !saved) {
        stop_on_signal();
      } else {
        log.say(termination_signal_name() + ": stopped");
        result.interrupted = true;
      }
    } else if (checkpointer && result.steps > first_step && !saved) {
      save();
    }
  }
  if (!o.pipeline_timeline.empty()) write_pipeline_timeline(o.pipeline_timeline, mesh, o, last_step_events);
  result.seconds = log.seconds();
  if (result.steps > first_step && !result.interrupted) {
    // Model FLOP utilisation: the model's training flops per rank per second over the same-run
    // GEMM throughput of this backend.
    // Measured after training, and only when there was some: a sampling run pays nothing.
    const double gemm_rate =
        gemm_flops_per_second(space, int(micro_windows * block), config.d_model, 4 * config.d_model);
    const double tokens_per_second = double(trained_tokens) / std::max(result.training_seconds, 1e-9);
    const double achieved = tokens_per_second * config.training_flops_per_token(block) / mesh.world_size();
    result.tokens_per_second = tokens_per_second;
    result.model_flop_utilization = achieved / gemm_rate;
    char line[256];
    std::snprintf(line, sizeof line,
                  "throughput: %.0f tokens/s, %.2f GFLOP/s per rank = %.2f of this backend's GEMM (%.2f GFLOP/s)",
                  tokens_per_second, achieved / 1e9, achieved / gemm_rate, gemm_rate / 1e9);
    log.say(line);
    log.record({{"step", result.steps},
                {"final", true},
                {"seconds", result.seconds},
                {"training_seconds", result.training_seconds},
                {"validation_loss", result.test_loss},
                {"tokens_per_second", tokens_per_second},
                {"model_flops_per_second_per_rank", achieved},
                {"gemm_flops_per_second", gemm_rate},
                {"model_flop_utilization", achieved / gemm_rate}});
  }

  optimizer->values_needed(space);  // the values the run ends with (sampling reads them)
  if (o.sample > 0 && !result.interrupted) {
    // Sharded, the model reads the whole parameters, gathered once, for sampling.
    std::optional<ParameterList<float, Memory>> whole;
    if (shards) {
      whole.emplace(space, shards->specs());
      shards->gather_values(space, whole->values());
      model.adopt_parameters(*whole);
    }
    // Every rank draws the same characters: the logits are gathered to every shard and every
    // replica holds the same model, and the generator is seeded alike.
    std::vector<std::int32_t> context = corpus.vocabulary.encode(o.prompt, "--prompt");
    LATHER_REQUIRE(!context.empty(), "--prompt is empty: give at least one character to continue");
    std::mt19937_64 rng(o.seed + 0x5A3D1E);
    std::vector<std::int32_t> generated;
    for (long c = 0; c < o.sample; ++c) {
      // A signal ends the sample where it is (what was drawn is printed): agreed every character.
      if (termination_agreed(mesh.world())) {
        result.interrupted = true;
        break;
      }
      auto logits = model.next_token_logits(space, context);
      logits.resize(std::size_t(characters));  // never a padding id
      const auto next = sample_from(logits, o.temperature, rng);
      context.push_back(next);
      generated.push_back(next);
    }
    log.say("sample (temperature " + std::to_string(o.temperature).substr(0, 4) + "):\n" + o.prompt +
            corpus.vocabulary.decode(generated));
    if (result.interrupted)
      log.say(termination_signal_name() + ": sampling stopped after " + std::to_string(generated.size()) +
              " characters");
  }
  return result;
}

}  // namespace lather::train
