#pragma once
// The training loop of lather-train (and of lather-bench tta): Fashion-MNIST, an MLP, data
// parallelism over replicas with optional weight shards, gradient reduction, any optimizer,
// checkpoints, metrics, and SIGTERM handling.

#include "training_options.hpp"

#include <lather/comm/group.hpp>

#include <functional>
#include <string>

namespace lather::train {

struct TrainResult {
  long steps = 0;
  long epochs_completed = 0;
  double seconds = 0;           ///< wall time of the training loop (evaluations included)
  double training_seconds = 0;  ///< the same without the time spent in evaluations
  double test_accuracy = 0;     ///< of the last evaluation
  double test_loss = 0;
  double train_loss = 0;  ///< mean over the last logging window
  bool reached_target = false;
  long target_step = 0;                ///< first step at which the target accuracy was reached
  double target_seconds = 0;           ///< seconds of the loop until then (evaluations included)
  double target_training_seconds = 0;  ///< the same without the evaluations
  bool interrupted = false;            ///< stopped by SIGTERM or SIGINT (after writing a checkpoint)
  double tokens_per_second = 0;        ///< transformer: training tokens per second (evaluations excluded)

  /// Records the first evaluation that met the target: its step and the loop's seconds then.
  void reach_target(long step, double loop_seconds, double loop_training_seconds) {
    if (reached_target) return;
    reached_target = true;
    target_step = step;
    target_seconds = loop_seconds;
    target_training_seconds = loop_training_seconds;
  }
  double model_flop_utilization = 0;  ///< transformer: model flop/s per rank / same-run GEMM flop/s
  std::string last_checkpoint;
};

/// Runs one training job; collective over `world`. Progress and errors go to rank 0's stdout /
/// stderr; `log` replaces stdout when set.
TrainResult train(const TrainOptions& options, const comm::Group& world,
                  const std::function<void(const std::string&)>& log = {});

/// Installs the SIGTERM and SIGINT handlers that make train() checkpoint and return (SIGTERM is
/// what Slurm sends at the time limit; SIGINT, Ctrl-C, a second time ends the program at once).
/// The training, evaluation and sampling loops poll them, agreed over the mesh, so a run stops
/// within one step, one evaluation batch or one sampled character. Idempotent.
void install_termination_handler();

/// Whether any rank of `world` was asked to stop (collective: one small all-reduce).
bool termination_agreed(const comm::Group& world);
/// "SIGTERM" or "SIGINT": what this rank received (SIGTERM where it received none).
std::string termination_signal_name();

/// Forgets a SIGTERM already acted on, for programs that run several jobs in one process.
void clear_termination_request();

/// lather-train's exit status after SIGTERM stopped it with its checkpoint written (0: finished,
/// 2: an error Lather reports), so a job script knows to requeue.
constexpr int interrupted_exit_code = 3;

}  // namespace lather::train
