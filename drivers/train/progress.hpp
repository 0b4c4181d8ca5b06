#pragma once
// What a training run tells its user: lines on rank 0's stdout (or a sink), and JSON lines in the
// --metrics file, with the losses and accuracies summed over the steps since the last line.

#include "training_options.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>

namespace lather::train {

/// "hh:mm:ss"
std::string format_duration(double seconds);

class ProgressLog {
 public:
  /// Only `root` writes. `append`: the metrics file continues a resumed run.
  ProgressLog(const TrainOptions& options, bool root, std::function<void(const std::string&)> sink);
  void open_metrics(bool append);

  /// A line for the user (rank 0's stdout or the sink).
  void say(const std::string& line) const;
  /// A warning (rank 0's stderr, where a job's error file collects it, or the sink).
  void warn(const std::string& line) const;
  /// One JSON line in the metrics file.
  void record(const nlohmann::json& line);

  /// Seconds since construction: the progress lines' clock, setup included.
  double seconds() const;
  /// Marks the first step: the training clock starts here. Loading the data and building the
  /// model, the optimizer and the reducer (about 0.45 s for Fashion-MNIST) are setup, the same for
  /// every optimizer, and would blur the time and the samples/s a run is compared by.
  void start_training() { m_training_started = std::chrono::steady_clock::now(); }
  /// Seconds since start_training() (since construction if it was not called), and the part of
  /// them spent outside evaluations.
  double loop_seconds() const;
  double training_seconds() const { return loop_seconds() - m_evaluation_seconds; }
  /// Time spent in an evaluation is not training time.
  void add_evaluation_time(double seconds) { m_evaluation_seconds += seconds; }

  /// Adds a step's group-wide loss sum, correct count and sample count to the window.
  void add_step(const double sums[3]);
  /// The progress line and metrics record at `step`, from the window, which restarts. Returns the
  /// window's mean loss. `extra` joins the metrics record.
  double report(long epoch, long step, long planned, long first_step, nlohmann::json extra);

 private:
  const TrainOptions& m_options;
  bool m_root;
  std::function<void(const std::string&)> m_sink;
  std::ofstream m_metrics;
  std::chrono::steady_clock::time_point m_started = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point m_training_started = m_started;
  double m_evaluation_seconds = 0;
  double m_window[3] = {0, 0, 0};  // loss sum, correct, samples since the last report
};

}  // namespace lather::train
