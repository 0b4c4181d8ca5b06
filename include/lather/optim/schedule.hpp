#pragma once
// Learning rate as a function of the step (the 0-based count of updates done so far), as optax
// schedules are: warm-up ramps linearly from 0 to the peak over warmup_steps, then the decay.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <string>

namespace lather::optim {

struct LearningRateSchedule {
  enum class Kind { constant, linear_warmup, cosine_decay, linear_decay, rsqrt };

  LearningRateSchedule() = default;
  /// A constant learning rate, as optax accepts a number wherever it takes a schedule:
  /// `options.learning_rate = 0.05;`.
  LearningRateSchedule(double constant_value)  // NOLINT(google-explicit-constructor)
      : peak(constant_value) {}
  LearningRateSchedule(Kind kind_, double peak_, long warmup_steps_ = 0, long decay_steps_ = 0, double end_value_ = 0.0)
      : kind(kind_), peak(peak_), warmup_steps(warmup_steps_), decay_steps(decay_steps_), end_value(end_value_) {}

  Kind kind = Kind::constant;
  double peak = 1e-3;      ///< the value after warm-up (the constant value for `constant`)
  long warmup_steps = 0;   ///< linear ramp 0 -> peak (optax.linear_schedule(0, peak, warmup))
  long decay_steps = 0;    ///< cosine/linear: steps after warm-up to go from peak to end_value
  double end_value = 0.0;  ///< cosine/linear: the value reached after decay_steps

  double operator()(long step) const;
  void validate() const;  ///< Throws lather::Error naming the bad field.
  std::string describe() const;

  static LearningRateSchedule constant(double value);
  static LearningRateSchedule warmup(double peak, long warmup_steps);
  static LearningRateSchedule cosine(double peak, long warmup_steps, long decay_steps, double end_value = 0);
  static LearningRateSchedule linear(double peak, long warmup_steps, long decay_steps, double end_value = 0);
  /// peak * sqrt(w / max(step, w)) with w = max(warmup_steps, 1), after the warm-up ramp.
  static LearningRateSchedule inverse_sqrt(double peak, long warmup_steps);
};

std::string to_string(LearningRateSchedule::Kind kind);
/// "constant", "warmup", "cosine", "linear", "rsqrt".
LearningRateSchedule::Kind parse_schedule_kind(const std::string& name);

}  // namespace lather::optim
