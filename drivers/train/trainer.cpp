#include "trainer.hpp"

#include <lather/checkpoint/training_state.hpp>
#include <lather/comm/comm.hpp>
#include <lather/comm/work_group.hpp>
#include <lather/core/error.hpp>
#include <lather/data/idx.hpp>
#include <lather/nn/mlp.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/shampoo.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>

namespace lather::train {

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
using Labels = Kokkos::View<std::int32_t*, Mem>;

volatile std::sig_atomic_t g_terminate = 0;
extern "C" void on_terminate(int) { g_terminate = 1; }

/// The global sample order of an epoch: the same permutation on every rank.
std::vector<std::int32_t> epoch_order(long samples, std::uint64_t seed, long epoch) {
  std::vector<std::int32_t> order(samples);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 1000003ull + std::uint64_t(epoch) + 1);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

/// [begin, end) of the part `index` of `parts` equal parts of `count` (the first count % parts
/// parts one larger).
std::pair<long, long> share(long count, long parts, long index) {
  const long base = count / parts, extra = count % parts;
  const long begin = index * base + std::min(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

/// Host staging of selected rows of a data set onto the device.
class Batch {
 public:
  Batch(long capacity, long features) {
    m_x = Matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather-train::x"), std::max(1L, capacity), features);
    m_y = Labels(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather-train::y"), std::max(1L, capacity));
    m_hx = Kokkos::create_mirror_view(m_x);
    m_hy = Kokkos::create_mirror_view(m_y);
  }
  /// Rows data[index[k]] for k in [begin, end).
  std::pair<Matrix, Labels> load(const data::LabelledImages& data, const std::int32_t* index, long begin, long end) {
    const long rows = end - begin, features = data.features;
    for (long k = 0; k < rows; ++k) {
      const long sample = index ? index[begin + k] : begin + k;
      std::copy_n(&data.images[std::size_t(sample) * features], features, &m_hx(k, 0));
      m_hy(k) = data.labels[sample];
    }
    Kokkos::deep_copy(m_x, m_hx);
    Kokkos::deep_copy(m_y, m_hy);
    return {Kokkos::subview(m_x, std::pair<long, long>(0, rows), Kokkos::ALL),
            Kokkos::subview(m_y, std::pair<long, long>(0, rows))};
  }

 private:
  Matrix m_x;
  Labels m_y;
  typename Matrix::HostMirror m_hx;
  typename Labels::HostMirror m_hy;
};

std::string format_duration(double seconds) {
  const long s = long(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%02ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return text;
}

}  // namespace

void install_termination_handler() {
  struct sigaction action {};
  action.sa_handler = on_terminate;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

TrainResult train(const TrainOptions& o, MPI_Comm world, const std::function<void(const std::string&)>& log_sink) {
  o.validate();
  comm::Mesh mesh(world, o.weight_shards);
  const int world_rank = mesh.world_rank();
  const bool root = world_rank == 0;
  const auto say = [&](const std::string& line) {
    if (!root) return;
    if (log_sink)
      log_sink(line);
    else
      std::printf("%s\n", line.c_str()), std::fflush(stdout);
  };
  const Space space;

  // Data: every rank holds both sets (the batches it needs move with the shuffle).
  data::LabelledImages train_set = data::load_mnist_like(o.data, "train");
  data::LabelledImages test_set = data::load_mnist_like(o.data, "t10k");
  if (o.train_samples > 0) train_set.count = std::min<long>(train_set.count, o.train_samples);
  if (o.test_samples > 0) test_set.count = std::min<long>(test_set.count, o.test_samples);
  // Standardize the pixels with the training set's mean and deviation (the same on every rank).
  {
    double sum = 0, squares = 0;
    const std::size_t n = std::size_t(train_set.count * train_set.features);
    for (std::size_t k = 0; k < n; ++k) sum += train_set.images[k], squares += double(train_set.images[k]) * train_set.images[k];
    const double mean = sum / double(n), deviation = std::sqrt(std::max(squares / double(n) - mean * mean, 1e-12));
    for (auto* set : {&train_set, &test_set})
      for (auto& x : set->images) x = float((x - mean) / deviation);
  }
  const int replicas = mesh.replicas(), replica = mesh.replica();

  // Model, split over the shards of the replica when asked.
  std::vector<int> sizes = {int(train_set.features)};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(std::max(train_set.classes, test_set.classes));
  nn::ShardGroup<Mem> shard_group;
  std::unique_ptr<comm::GradientReducer<Space, float>> shard_reducer;
  if (o.weight_shards > 1) {
    comm::ReduceOptions exact;
    exact.verify_layout = false;  // every shard passes the same activation shapes by construction
    shard_reducer = std::make_unique<comm::GradientReducer<Space, float>>(mesh.shards(), exact);
    shard_group.shards = mesh.weight_shards();
    shard_group.shard = mesh.shard();
    shard_group.sum = [&](const Kokkos::View<float**, Kokkos::LayoutRight, Mem>& x) {
      shard_reducer->sum(space, {FlatTensor<float, Mem>(x.data(), x.size())});
    };
    shard_group.all_gather = [&](const Kokkos::View<const float**, Kokkos::LayoutRight, Mem>& in,
                                 const Kokkos::View<float**, Kokkos::LayoutRight, Mem>& out) {
      comm::all_gather_features<Space, float>(space, mesh.shards(), in, out);
    };
  }
  nn::Mlp<Space> model(space, sizes, o.seed, shard_group);
  const auto& params = model.parameters();
  const auto& grads = model.gradients();

  // Optimizer: Shampoo's root work is shared by the replicas of a shard.
  std::unique_ptr<optim::Optimizer<Space, float>> optimizer;
  if (o.optimizer == "shampoo")
    optimizer = std::make_unique<optim::Shampoo<Space, float>>(
        space, model.parameter_specs(), o.shampoo_options(), comm::make_work_group(mesh.data_parallel()),
        mesh.weight_shards() > 1 ? comm::make_work_group(mesh.shards()) : nullptr);
  else if (o.optimizer == "sgd")
    optimizer = std::make_unique<optim::FirstOrder<Space, float>>(space, model.parameter_specs(), o.sgd_options());
  else if (o.optimizer == "adagrad")
    optimizer = std::make_unique<optim::FirstOrder<Space, float>>(space, model.parameter_specs(), o.adagrad_options());
  else
    optimizer = std::make_unique<optim::FirstOrder<Space, float>>(space, model.parameter_specs(), o.adam_options());

  comm::ReduceOptions reduce_options;
  reduce_options.wire_precision = comm::parse_wire_precision(o.wire_precision);
  comm::GradientReducer<Space, float> reducer(mesh.data_parallel(), reduce_options);

  // Checkpoints.
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  if (!o.checkpoint_dir.empty()) {
    checkpoint::CheckpointOptions c;
    c.directory = o.checkpoint_dir;
    c.keep_last = o.keep_checkpoints;
    checkpointer = std::make_unique<checkpoint::Checkpointer>(mesh.world(), c);
  }
  const checkpoint::WriterRoles roles{root, replica == 0, mesh.shard()};
  long start_epoch = 0, start_sample = 0;
  if (o.resume && checkpointer) {
    std::vector<std::string> skipped;
    const std::string latest = checkpointer->latest(&skipped);
    // A damaged newer checkpoint must not be passed over in silence: the run goes back further.
    for (const auto& why : skipped) say("warning: resume skips an unreadable checkpoint: " + why);
    if (latest.empty()) {
      say("resume: no checkpoint in " + o.checkpoint_dir + ", starting from scratch");
    } else {
      const auto state = checkpoint::load_training_state(*checkpointer, latest, *optimizer, params);
      start_epoch = state.epoch;
      start_sample = state.sample_offset;
      say("resumed from " + latest + " (step " + std::to_string(optimizer->step_count()) + ", epoch " +
          std::to_string(start_epoch + 1) + ", sample " + std::to_string(start_sample) + "; written by " +
          std::to_string(state.world_size) + " ranks with " + std::to_string(state.weight_shards) + " weight shards)");
    }
  }

  // Metrics.
  std::ofstream metrics;
  if (root && !o.metrics.empty()) {
    metrics.open(o.metrics, start_epoch > 0 || start_sample > 0 ? std::ios::app : std::ios::trunc);
    LATHER_REQUIRE(bool(metrics), "cannot write --metrics file '", o.metrics, "'");
  }
  const auto record = [&](nlohmann::json line) {
    if (metrics.is_open()) metrics << line.dump() << '\n' << std::flush;
  };

  const long batch = o.batch_size;
  const long steps_per_epoch = (train_set.count + batch - 1) / batch;
  const long planned = o.max_steps > 0 ? std::min<long>(o.max_steps, o.epochs * steps_per_epoch) : o.epochs * steps_per_epoch;
  {
    char line[512];
    std::snprintf(line, sizeof line,
                  "lather-train: %d ranks = %d replicas x %d weight shards, MLP %s, %s (lr %.3g), global batch %ld "
                  "(%ld per replica%s), %ld steps/epoch",
                  mesh.world_size(), replicas, mesh.weight_shards(),
                  [&] {
                    std::string s;
                    for (std::size_t k = 0; k < sizes.size(); ++k) s += (k ? "-" : "") + std::to_string(sizes[k]);
                    return s;
                  }()
                      .c_str(),
                  o.optimizer.c_str(), o.learning_rate(), batch, batch / replicas,
                  o.accumulate > 1 ? (" in " + std::to_string(o.accumulate) + " micro-batches").c_str() : "",
                  steps_per_epoch);
    say(line);
    // The state memory report of every rank (they differ with shards): the largest, and rank 0's.
    const auto report = optimizer->memory_report();
    std::int64_t mine = report.total(), largest = 0;
    MPI_Allreduce(&mine, &largest, 1, MPI_INT64_T, MPI_MAX, mesh.world());
    say("rank 0 " + report.to_string() + "; largest on any rank " + std::to_string(largest / 1048576.0).substr(0, 6) +
        " MiB");
  }

  Batch staging(batch / replicas + 1, train_set.features);
  const long eval_rows = 1000;
  Batch eval_staging(eval_rows, test_set.features);
  const auto evaluate = [&]() {
    const auto [begin, end] = share(test_set.count, replicas, replica);
    double sums[2] = {0, 0};
    for (long b = begin; b < end; b += eval_rows) {
      const auto [x, y] = eval_staging.load(test_set, nullptr, b, std::min(end, b + eval_rows));
      const auto r = model.evaluate(x, y);
      sums[0] += r.loss_sum;
      sums[1] += double(r.correct);
    }
    double total[2];
    MPI_Allreduce(sums, total, 2, MPI_DOUBLE, MPI_SUM, mesh.data_parallel());
    return std::pair<double, double>(total[0] / double(test_set.count), total[1] / double(test_set.count));
  };

  TrainResult result;
  const auto started = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  const long first_step = optimizer->step_count();
  double window[3] = {0, 0, 0};  // loss sum, correct, samples since the last progress line

  const auto save = [&](long epoch, long sample) {
    if (!checkpointer) return;
    checkpoint::TrainingState state;
    state.epoch = epoch;
    state.sample_offset = sample;
    state.rng = {o.seed};
    state.weight_shards = mesh.weight_shards();
    state.extra.strings["model"] = "mlp";
    result.last_checkpoint = checkpoint::save_training_state(*checkpointer, *optimizer, params, state, roles);
  };
  const auto evaluation_line = [&](long epoch, bool epoch_end) {
    const auto [loss, accuracy] = evaluate();
    result.test_loss = loss;
    result.test_accuracy = accuracy;
    const long step = optimizer->step_count();
    if (o.target_accuracy > 0 && accuracy >= o.target_accuracy && !result.reached_target) {
      result.reached_target = true;
      result.target_step = step;
      result.target_seconds = elapsed();
    }
    char line[256];
    std::snprintf(line, sizeof line, "%s %ld: test accuracy %.2f%%, test loss %.4f (step %ld, %s)",
                  epoch_end ? "epoch" : "eval at epoch", epoch + 1, 100 * accuracy, loss, step,
                  format_duration(elapsed()).c_str());
    say(line);
    record({{"epoch", epoch + 1}, {"step", step}, {"loss", result.train_loss}, {"seconds", elapsed()},
            {"test_accuracy", accuracy}, {"test_loss", loss}, {"epoch_end", epoch_end}});
  };

  bool stop = false;
  long position_epoch = start_epoch, position_sample = start_sample;  // where the next step starts
  for (long epoch = start_epoch; epoch < o.epochs && !stop; ++epoch) {
    const auto order = epoch_order(train_set.count, o.seed, epoch);
    const long first_batch = epoch == start_epoch ? start_sample / batch : 0;
    for (long b = first_batch; b < steps_per_epoch && !stop; ++b) {
      const long batch_begin = b * batch, batch_end = std::min(train_set.count, batch_begin + batch);
      const auto [mine_begin, mine_end] = share(batch_end - batch_begin, replicas, replica);
      double local[4] = {0, 0, 0, double(g_terminate)};
      for (int k = 0; k < o.accumulate; ++k) {
        const auto [m0, m1] = share(mine_end - mine_begin, o.accumulate, k);
        if (m1 == m0) continue;
        const auto [x, y] = staging.load(train_set, order.data(), batch_begin + mine_begin + m0, batch_begin + mine_begin + m1);
        const auto r = model.train_batch(x, y, local[2] > 0);
        local[0] += r.loss_sum;
        local[1] += double(r.correct);
        local[2] += double(r.samples);
      }
      if (local[2] == 0)  // a replica with no sample this step contributes zero gradients
        for (const auto& g : grads) Kokkos::deep_copy(g, 0.0f);
      // Gradients are sums over this replica's samples: their token-weighted mean is the mean
      // over the global batch, whatever the rank count.
      if (o.reduce == "mean") {
        reducer.weighted_mean(space, grads, local[2]);
      } else {
        // Adasum combines per-replica gradients: the mean over this replica's samples.
        const float scale = local[2] > 0 ? float(1.0 / local[2]) : 0.0f;
        for (const auto& g : grads)
          Kokkos::parallel_for("lather-train::scale", Kokkos::RangePolicy<Space>(space, 0, g.extent(0)),
                               KOKKOS_LAMBDA(std::int64_t k) { g(k) *= scale; });
        if (o.reduce == "adasum")
          reducer.adasum(space, grads);
        else
          reducer.adasum_approx(space, grads);
      }
      optimizer->step(params, grads);

      double global[4];
      MPI_Allreduce(local, global, 4, MPI_DOUBLE, MPI_SUM, mesh.data_parallel());
      for (int i = 0; i < 3; ++i) window[i] += global[i];
      const long step = optimizer->step_count();
      const bool terminate = global[3] > 0;
      const bool at_limit = o.max_steps > 0 && step >= o.max_steps;
      if ((o.log_every > 0 && step % o.log_every == 0) || b + 1 == steps_per_epoch || terminate || at_limit) {
        const double seconds = elapsed();
        const double rate = double(step - first_step) * batch / std::max(seconds, 1e-9);
        const double eta = double(planned - step) * seconds / std::max(1.0, double(step - first_step));
        result.train_loss = window[0] / std::max(window[2], 1.0);
        const double accuracy = window[1] / std::max(window[2], 1.0);
        if (!o.quiet) {
          char line[256];
          std::snprintf(line, sizeof line,
                        "epoch %ld/%d step %ld/%ld loss %.4f train accuracy %.2f%% %.0f samples/s ETA %s", epoch + 1,
                        o.epochs, step, planned, result.train_loss, 100 * accuracy, rate, format_duration(eta).c_str());
          say(line);
        }
        nlohmann::json values = {{"epoch", epoch + 1}, {"step", step}, {"loss", result.train_loss},
                                 {"train_accuracy", accuracy}, {"seconds", seconds},
                                 {"samples_per_second", rate}, {"learning_rate", o.learning_rate()}};
        if (const auto* shampoo = dynamic_cast<const optim::Shampoo<Space, float>*>(optimizer.get())) {
          // The reference's training metrics, summarised over rank 0's statistics.
          double worst = 0;
          long failures = 0;
          for (const auto& m : shampoo->metrics()) {
            worst = std::max(worst, m.error);
            failures += m.failures;
          }
          values["root_error_max"] = worst;
          values["root_failures"] = failures;
        }
        record(values);
        window[0] = window[1] = window[2] = 0;
      }
      if (o.eval_every > 0 && step % o.eval_every == 0 && b + 1 != steps_per_epoch) {
        evaluation_line(epoch, false);
        if (result.reached_target) stop = true;
      }
      const long next_sample = std::min(train_set.count, (b + 1) * batch);
      const bool epoch_done = b + 1 == steps_per_epoch;
      position_epoch = epoch_done ? epoch + 1 : epoch;
      position_sample = epoch_done ? 0 : next_sample;
      if (terminate) {
        save(position_epoch, position_sample);
        say("SIGTERM: checkpoint " + result.last_checkpoint + " written at step " + std::to_string(step) +
            "; continue with --resume");
        result.interrupted = true;
        stop = true;
        break;
      }
      if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0) save(position_epoch, position_sample);
      if (at_limit) stop = true;
      if (epoch_done) {
        evaluation_line(epoch, true);
        result.epochs_completed = epoch + 1;
        if (result.reached_target) stop = true;
      }
    }
  }
  result.steps = optimizer->step_count();
  // Stopped between epoch ends (--max-steps, SIGTERM, a target reached by --eval-every): the
  // final numbers still come from the test set.
  if (result.steps > first_step && position_sample != 0 && !result.reached_target)
    evaluation_line(position_epoch, false);
  result.seconds = elapsed();
  if (checkpointer && !result.interrupted && result.steps > first_step &&
      !(o.checkpoint_every > 0 && result.steps % o.checkpoint_every == 0))
    save(position_epoch, position_sample);
  record({{"epoch", result.epochs_completed}, {"step", result.steps}, {"loss", result.train_loss},
          {"seconds", result.seconds}, {"final", true}, {"test_accuracy", result.test_accuracy}});
  return result;
}

}  // namespace lather::train
