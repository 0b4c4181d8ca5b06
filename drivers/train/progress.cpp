#include "progress.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace lather::train {

std::string format_duration(double seconds) {
  const long s = long(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%02ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return text;
}

ProgressLog::ProgressLog(const TrainOptions& options, bool root, std::function<void(const std::string&)> sink)
    : m_options(options), m_root(root), m_sink(std::move(sink)) {}

void ProgressLog::open_metrics(bool append) {
  if (!m_root || m_options.metrics.empty()) return;
  m_metrics.open(m_options.metrics, append ? std::ios::app : std::ios::trunc);
  LATHER_REQUIRE(bool(m_metrics), "cannot write --metrics file '", m_options.metrics, "'");
}

void ProgressLog::say(const std::string& line) const {
  if (!m_root) return;
  if (m_sink)
    m_sink(line);
  else
    std::printf("%s\n", line.c_str()), std::fflush(stdout);
}

void ProgressLog::record(const nlohmann::json& line) {
  if (!m_metrics.is_open()) return;
  errno = 0;
  m_metrics << line.dump() << '\n' << std::flush;
  if (m_metrics) return;
  // A full disk or a lost file system: the run goes on (its checkpoints check their own writes),
  // but not silently without its record.
  const int error = errno;
  m_metrics.close();
  warn("warning: cannot write --metrics file '" + m_options.metrics + "'" +
       (error != 0 ? std::string(": ") + std::strerror(error) : std::string()) +
       "; training goes on without recording its metrics");
}

void ProgressLog::warn(const std::string& line) const {
  if (!m_root) return;
  if (m_sink) {
    m_sink(line);
  } else {
    std::fflush(stdout);  // after the lines said before it, where both go to one terminal or file
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

double ProgressLog::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - m_started).count();
}

double ProgressLog::loop_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - m_training_started).count();
}

void ProgressLog::add_step(const double sums[3]) {
  for (int i = 0; i < 3; ++i) m_window[i] += sums[i];
}

double ProgressLog::report(long epoch, long step, long planned, long first_step, nlohmann::json extra) {
  const double elapsed = seconds();
  const double rate = double(step - first_step) * m_options.batch_size / std::max(elapsed, 1e-9);
  const double eta = double(planned - step) * elapsed / std::max(1.0, double(step - first_step));
  const double loss = m_window[0] / std::max(m_window[2], 1.0);
  const double accuracy = m_window[1] / std::max(m_window[2], 1.0);
  if (!m_options.quiet) {
    char line[256];
    std::snprintf(line, sizeof line, "epoch %ld/%d step %ld/%ld loss %.4f train accuracy %.2f%% %.0f samples/s ETA %s",
                  epoch + 1, m_options.epochs, step, planned, loss, 100 * accuracy, rate, format_duration(eta).c_str());
    say(line);
  }
  nlohmann::json values = {{"epoch", epoch + 1},
                           {"step", step},
                           {"loss", loss},
                           {"train_accuracy", accuracy},
                           {"seconds", elapsed},
                           {"training_seconds", training_seconds()},
                           {"samples_per_second", rate},
                           {"learning_rate", m_options.learning_rate()}};
  values.update(extra);
  record(values);
  m_window[0] = m_window[1] = m_window[2] = 0;
  return loss;
}

}  // namespace lather::train
