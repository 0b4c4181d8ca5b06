#include "trainer.hpp"

#include "dataset.hpp"
#include "language_model_trainer.hpp"
#include "optimizer_factory.hpp"
#include "progress.hpp"
#include "resume.hpp"
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

volatile std::sig_atomic_t g_terminate = 0;
extern "C" void on_terminate(int) { g_terminate = 1; }

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
}

TrainResult train(const TrainOptions& o, const comm::Group& world,
                  const std::function<void(const std::string&)>& log_sink) {
  if (o.model == ModelKind::transformer) return train_language_model(o, world, log_sink);
  o.validate();
  const comm::Mesh mesh(world, o.weight_shards);
  const Space space;
  ProgressLog log(o, mesh.world_rank() == 0, log_sink);
  const DataSets data = load_data_sets(o);
  const int replicas = mesh.replicas(), replica = mesh.replica();

  // The model, split over the shards of the replica when asked; the optimizer and the reduction
  // over the replicas holding the same shard.
  std::vector<int> sizes = {int(data.train.features)};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(std::max(data.train.classes, data.test.classes));
  nn::Mlp<Space> model(space, sizes, o.seed, mesh);
  const auto& parameters = model.parameters();
  const auto optimizer = make_optimizer(space, o, parameters.specs(), mesh);
  const auto reducer = make_reducer(mesh, o, parameters.specs());
  place_gradients(space, *reducer, model);
  const auto checkpointer = make_checkpointer(mesh, o);
  Position start;
  if (o.resume && checkpointer) start = resume(space, o, *checkpointer, *optimizer, parameters, log);
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
  }

  Batch staging(batch / replicas + 1, data.train.features);
  const long eval_rows = 1000;
  Batch eval_staging(eval_rows, data.test.features);
  StepParts parts{model, *reducer, *optimizer, staging};
  TrainResult result;
  const long first_step = optimizer->step_count();

  const auto save = [&](const Position& next) {
    if (checkpointer) result.last_checkpoint = save_checkpoint(space, o, *checkpointer, *optimizer, parameters, next);
  };
  // Test loss and accuracy over the whole test set, each replica its share.
  const auto evaluate = [&](long epoch, bool epoch_end) {
    const double began = log.seconds();
    const auto [begin, end] = share(data.test.count, replicas, replica);
    double sums[2] = {0, 0};
    for (long b = begin; b < end; b += eval_rows) {
      const auto [x, y] = eval_staging.load(space, data.test, nullptr, b, std::min(end, b + eval_rows));
      const auto r = model.evaluate(space, x, y);
      sums[0] += r.loss_sum;
      sums[1] += double(r.correct);
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
  };

  bool stop = false;
  Position next = start;  // where the next step starts
  log.start_training();
  for (long epoch = start.epoch; epoch < o.epochs && !stop; ++epoch) {
    const auto order = epoch_order(data.train.count, o.seed, epoch);
    const long first_batch = epoch == start.epoch ? start.sample / batch : 0;
    for (long b = first_batch; b < steps_per_epoch && !stop; ++b) {
      const long begin = b * batch, end = std::min(data.train.count, begin + batch);
      const StepSums local = training_step(space, o, data.train, order, begin, end, replicas, replica, parts);
      // Shards of a replica saw the same samples: the data-parallel group counts each once.
      double sums[4] = {local.loss, local.correct, local.samples, double(g_terminate)};
      mesh.data_parallel().allreduce(sums, 4, comm::Combine::sum);
      log.add_step(sums);
      const long step = optimizer->step_count();
      const bool terminate = sums[3] > 0;
      const bool at_limit = o.max_steps > 0 && step >= o.max_steps;
      const bool epoch_done = b + 1 == steps_per_epoch;
      if ((o.log_every > 0 && step % o.log_every == 0) || epoch_done || terminate || at_limit)
        result.train_loss = log.report(epoch, step, planned, first_step, optimizer_metrics(*optimizer));
      if (o.eval_every > 0 && step % o.eval_every == 0 && !epoch_done) {
        evaluate(epoch, false);
        if (result.reached_target) stop = true;
      }
      next = epoch_done ? Position{epoch + 1, 0} : Position{epoch, std::min(data.train.count, (b + 1) * batch)};
      if (terminate) {
        save(next);
        log.say("SIGTERM: checkpoint " + result.last_checkpoint + " written at step " + std::to_string(step) +
                "; continue with --resume");
        result.interrupted = true;
        stop = true;
        break;
      }
      if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) save(next);
      if (at_limit) stop = true;
      if (epoch_done) {
        evaluate(epoch, true);
        result.epochs_completed = epoch + 1;
        if (result.reached_target) stop = true;
      }
    }
  }
  result.steps = optimizer->step_count();
  // Stopped between epoch ends (--max-steps, SIGTERM, a target reached by --eval-every): the
  // final numbers still come from the test set.
  if (result.steps > first_step && next.sample != 0 && !result.reached_target) evaluate(next.epoch, false);
  result.seconds = log.seconds();
  result.training_seconds = log.training_seconds();
  if (checkpointer && !result.interrupted && result.steps > first_step &&
      !(o.checkpoint_every > 0 && result.steps % o.checkpoint_every == 0))
    save(next);
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
