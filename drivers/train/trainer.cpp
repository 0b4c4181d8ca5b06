#include "trainer.hpp"

#include "dataset.hpp"
#include "memory_estimate.hpp"
#include "language_model_trainer.hpp"
#include "optimizer_factory.hpp"
#include "progress.hpp"
#include "resume.hpp"
#include "sharded_checkpoint.hpp"
#include "training_step.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/comm.hpp>
#include <lather/core/error.hpp>
#include <lather/nn/mlp.hpp>
#include <lather/optim/shampoo.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>

namespace lather::train {

namespace {

volatile std::sig_atomic_t g_terminate = 0;  // the signal received, 0: none
extern "C" void on_terminate(int signal) {
  g_terminate = signal;
  // A second Ctrl-C is an order: the default action ends the program.
  if (signal == SIGINT) std::signal(SIGINT, SIG_DFL);
}

std::string describe_sizes(const std::vector<int>& sizes) {
  std::string s;
  for (std::size_t k = 0; k < sizes.size(); ++k) s += (k ? "-" : "") + std::to_string(sizes[k]);
  return s;
}

/// Shampoo's training metrics, summarised over this rank's statistics.
nlohmann::json optimizer_metrics(const optim::Optimizer<Space, float>& optimizer) {
  const auto* shampoo = dynamic_cast<const optim::Shampoo<Space, float>*>(&optimizer);
  if (!shampoo) return nlohmann::json::object();
  double worst = 0;
  long failures = 0;
  for (const auto& m : shampoo->metrics()) {
    worst = std::max(worst, m.error);
    failures += m.failures;
  }
  return {{"root_error_max", worst}, {"root_failures", failures}};
}

}  // namespace

bool termination_requested() { return g_terminate != 0; }
void clear_termination_request() { g_terminate = 0; }

void install_termination_handler() {
  struct sigaction action {};
  action.sa_handler = on_terminate;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

std::string termination_signal_name() { return g_terminate == SIGINT ? "SIGINT" : "SIGTERM"; }

bool termination_agreed(const comm::Group& world) {
  return world.allreduce(int(g_terminate != 0), comm::Combine::max) != 0;
}

TrainResult train(const TrainOptions& options, const comm::Group& world,
                  const std::function<void(const std::string&)>& log_sink) {
  if (options.model == ModelKind::transformer) return train_language_model(options, world, log_sink);
  options.validate();
  TrainOptions o = options;  // a checkpoint resumed may fix Shampoo's block size
  LATHER_REQUIRE(world.size() % o.weight_shards == 0, "--weight-shards ", o.weight_shards, " does not divide the ",
                 world.size(), " ranks (each replica holds --weight-shards ranks)");
  const comm::Mesh mesh(world, o.weight_shards);
  const Space space;
  ProgressLog log(o, mesh.world_rank() == 0, log_sink);
  // The hidden layers are most of an MLP: sizes that cannot fit are refused before the data
  // (half a second for Fashion-MNIST) is read, and checked again below with its real widths.
  std::vector<int> hidden_only = {1};
  hidden_only.insert(hidden_only.end(), o.hidden.begin(), o.hidden.end());
  hidden_only.push_back(1);
  check_memory(estimate_mlp_memory(o, hidden_only, mesh.replicas(), mesh.weight_shards()), world);
  const DataSets data = load_data_sets(o);
  const int replicas = mesh.replicas(), replica = mesh.replica();

  // The model, split over the shards of the replica when asked; the optimizer and the reduction
  // over the replicas holding the same shard.
  std::vector<int> sizes = {int(data.train.features)};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(std::max(data.train.classes, data.test.classes));
  // Everything checked before anything is built: the checkpoint to resume, then the memory.
  const auto checkpointer = make_checkpointer(mesh, o);
  std::optional<ResumeSource> source;
  if (o.resume && checkpointer) source = find_resume_source(*checkpointer, o, log);
  if (source) match_checkpoint(*source, o, log);
  check_memory(estimate_mlp_memory(o, sizes, replicas, mesh.weight_shards()), world);
  nn::Mlp<Space> model(space, sizes, o.seed, mesh);
  // Sharded, the optimizer updates this rank's bands of the parameters; else all of them.
  const auto shards = o.shard_parameters ? shard_parameters(space, o, mesh, model) : nullptr;
  const auto& parameters = shards ? sharded_parameters(o, *shards) : model.parameters();
  const auto optimizer = shards ? make_sharded_optimizer(space, o, parameters.specs(), mesh)
                                : make_optimizer(space, o, parameters.specs(), mesh);
  const auto reducer = make_reducer(mesh, o, model.parameter_specs());
  if (!shards) place_gradients(space, *reducer, model);
  overlap_step_gather(space, o, *optimizer, mlp_parameter_layers(model), log);
  Position start;
  if (source) {
    const auto state = shards
                           ? load_sharded_checkpoint(space, o, mesh, *source, *checkpointer, *optimizer, *shards, log)
                           : load_checkpoint(space, *source, *checkpointer, *optimizer, parameters, log);
    start = {state.epoch, state.sample_offset};
  }
  log.open_metrics(start.epoch > 0 || start.sample > 0);

  const long batch = o.batch_size;
  const long steps_per_epoch = (data.train.count + batch - 1) / batch;
  const long planned =
      o.max_steps > 0 ? std::min<long>(o.max_steps, o.epochs * steps_per_epoch) : o.epochs * steps_per_epoch;
  check_checkpoint_directory(checkpointer.get(), optimizer->step_count(), planned);
  {
    char line[512];
    std::snprintf(line, sizeof line,
                  "lather-train: %d ranks = %d replicas x %d weight shards, MLP %s, %s (lr %.3g), global batch %ld "
                  "(%ld per replica%s), %ld steps/epoch",
                  mesh.world_size(), replicas, mesh.weight_shards(), describe_sizes(sizes).c_str(),
                  to_string(o.optimizer).c_str(), o.learning_rate(), batch, batch / replicas,
                  o.accumulate > 1 ? (" in " + std::to_string(o.accumulate) + " micro-batches").c_str() : "",
                  steps_per_epoch);
    log.say(line);
    // The state memory report of every rank (they differ with shards): the largest, and rank 0's.
    const auto report = optimizer->memory_report();
    const std::int64_t largest = mesh.world().allreduce(report.total(), comm::Combine::max);
    log.say("rank 0 " + report.to_string() + "; largest on any rank " +
            std::to_string(double(largest) / 1048576.0).substr(0, 6) + " MiB");
    if (shards) log.say(describe_sharded_memory(mesh, *shards, report));
  }

  Batch staging(batch / replicas + 1, data.train.features);
  const long eval_rows = 1000;
  Batch eval_staging(eval_rows, data.test.features);
  StepParts parts{model, *reducer, *optimizer, staging, shards.get()};
  TrainResult result;
  const long first_step = optimizer->step_count();

  const auto save = [&](const Position& next) {
    if (checkpointer)
      result.last_checkpoint =
          shards ? save_sharded_checkpoint(space, o, mesh, *checkpointer, *optimizer, *shards, position_state(o, next))
                 : save_checkpoint(space, o, *checkpointer, *optimizer, parameters, next);
  };
  // Test loss and accuracy over the whole test set, each replica its share. Returns false,
  // reporting nothing, when a signal stops it (agreed after every piece: each rank takes as many
  // rounds as the largest share needs).
  const auto evaluate = [&](long epoch, bool epoch_end) {
    const double began = log.seconds();
    optimizer->values_needed(space);
    // Not structured bindings: the pass's lambda below captures them (C++17 forbids it).
    const auto mine = share(data.test.count, replicas, replica);
    const long begin = mine.first, end = mine.second;
    const long rounds = ((data.test.count + replicas - 1) / replicas + eval_rows - 1) / eval_rows;
    double sums[2] = {0, 0};
    for (long round = 0; round < rounds; ++round) {
      const long b = begin + round * eval_rows;
      evaluation_round(space, shards.get(), b < end, [&] {
        const auto [x, y] = eval_staging.load(space, data.test, nullptr, b, std::min(end, b + eval_rows));
        const auto r = model.evaluate(space, x, y, shards ? shards->needed_hook(space) : ParametersNeeded());
        sums[0] += r.loss_sum;
        sums[1] += double(r.correct);
      });
      if (termination_agreed(mesh.world())) return false;
    }
    mesh.data_parallel().allreduce(sums, 2, comm::Combine::sum);
    log.add_evaluation_time(log.seconds() - began);
    result.test_loss = sums[0] / double(data.test.count);
    result.test_accuracy = sums[1] / double(data.test.count);
    const long step = optimizer->step_count();
    if (o.target_accuracy > 0 && result.test_accuracy >= o.target_accuracy)
      result.reach_target(step, log.loop_seconds(), log.training_seconds());
    char line[256];
    std::snprintf(line, sizeof line, "%s %ld: test accuracy %.2f%%, test loss %.4f (step %ld, %s)",
                  epoch_end ? "epoch" : "eval at epoch", epoch + 1, 100 * result.test_accuracy, result.test_loss, step,
                  format_duration(log.seconds()).c_str());
    log.say(line);
    log.record({{"epoch", epoch + 1},
                {"step", step},
                {"loss", result.train_loss},
                {"seconds", log.seconds()},
                {"training_seconds", log.training_seconds()},
                {"test_accuracy", result.test_accuracy},
                {"test_loss", result.test_loss},
                {"epoch_end", epoch_end}});
    return true;
  };
  bool stop = false;
  Position next = start;  // where the next step starts
  // A signal agreed over the mesh: the checkpoint of the last completed step, and the end.
  const auto stop_on_signal = [&] {
    save(next);
    log.say(termination_signal_name() + ": checkpoint " + result.last_checkpoint + " written at step " +
            std::to_string(optimizer->step_count()) + "; continue with --resume");
    result.interrupted = true;
    stop = true;
  };
  log.start_training();
  for (long epoch = start.epoch; epoch < o.epochs && !stop; ++epoch) {
    const auto order = epoch_order(data.train.count, o.seed, epoch);
    const long first_batch = epoch == start.epoch ? start.sample / batch : 0;
    for (long b = first_batch; b < steps_per_epoch && !stop; ++b) {
      const long begin = b * batch, end = std::min(data.train.count, begin + batch);
      const StepSums local = training_step(space, o, data.train, order, begin, end, replicas, replica, parts);
      // Shards of a replica saw the same samples: the data-parallel group counts each once.
      double sums[3] = {local.loss, local.correct, local.samples};
      mesh.data_parallel().allreduce(sums, 3, comm::Combine::sum);
      log.add_step(sums);
      const long step = optimizer->step_count();
      const bool terminate = termination_agreed(mesh.world());
      const bool at_limit = o.max_steps > 0 && step >= o.max_steps;
      const bool epoch_done = b + 1 == steps_per_epoch;
      next = epoch_done ? Position{epoch + 1, 0} : Position{epoch, std::min(data.train.count, (b + 1) * batch)};
      if ((o.log_every > 0 && step % o.log_every == 0) || epoch_done || terminate || at_limit)
        result.train_loss = log.report(epoch, step, planned, first_step, optimizer_metrics(*optimizer));
      if (terminate) {
        stop_on_signal();
        break;
      }
      if (o.eval_every > 0 && step % o.eval_every == 0 && !epoch_done) {
        if (!evaluate(epoch, false)) {
          stop_on_signal();
          break;
        }
        if (result.reached_target) stop = true;
      }
      if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) save(next);
      if (at_limit) stop = true;
      if (epoch_done) {
        if (!evaluate(epoch, true)) {
          stop_on_signal();
          break;
        }
        result.epochs_completed = epoch + 1;
        if (result.reached_target) stop = true;
      }
    }
  }
  result.steps = optimizer->step_count();
  optimizer->values_needed(space);  // the values the run ends with
  // Stopped between epoch ends (--max-steps, a target reached by --eval-every): the final
  // numbers still come from the test set.
  if (!result.interrupted && result.steps > first_step && next.sample != 0 && !result.reached_target &&
      !evaluate(next.epoch, false))
    stop_on_signal();
  result.seconds = log.seconds();
  result.training_seconds = log.training_seconds();
  const bool saved = result.interrupted || (o.checkpoint_every > 0 && result.steps % o.checkpoint_every == 0);
  if (checkpointer && !saved && result.steps > first_step) save(next);
  log.record({{"epoch", result.epochs_completed},
              {"step", result.steps},
              {"loss", result.train_loss},
              {"seconds", result.seconds},
              {"training_seconds", result.training_seconds},
              {"final", true},
              {"test_accuracy", result.test_accuracy}});
  return result;
}

}  // namespace lather::train
