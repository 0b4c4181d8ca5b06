#include <lather/optim/schedule.hpp>

#include <lather/core/error.hpp>

#include <algorithm>
#include <cmath>

namespace lather::optim {

double LearningRateSchedule::operator()(long step) const {
  if (step < 0) step = 0;
  if (kind != Kind::constant && warmup_steps > 0 && step < warmup_steps)
    return peak * double(step) / double(warmup_steps);
  const long after = step - std::max(0L, warmup_steps);
  switch (kind) {
    case Kind::constant:
    case Kind::linear_warmup:
      return peak;
    case Kind::cosine_decay: {
      const double t = decay_steps > 0 ? std::min(1.0, double(after) / double(decay_steps)) : 1.0;
      return end_value + (peak - end_value) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
    case Kind::linear_decay: {
      const double t = decay_steps > 0 ? std::min(1.0, double(after) / double(decay_steps)) : 1.0;
      return peak + (end_value - peak) * t;
    }
    case Kind::rsqrt: {
      const double w = double(std::max(1L, warmup_steps));
      return peak * std::sqrt(w / std::max(double(step), w));
    }
  }
  return peak;
}

void LearningRateSchedule::validate() const {
  LATHER_REQUIRE(std::isfinite(peak) && peak >= 0, "learning rate must be finite and >= 0, got ", peak);
  LATHER_REQUIRE(warmup_steps >= 0, "learning rate warmup_steps must be >= 0, got ", warmup_steps);
  LATHER_REQUIRE(decay_steps >= 0, "learning rate decay_steps must be >= 0, got ", decay_steps);
  LATHER_REQUIRE(std::isfinite(end_value) && end_value >= 0, "learning rate end_value must be finite and >= 0, got ",
                 end_value);
  if (kind == Kind::cosine_decay || kind == Kind::linear_decay)
    LATHER_REQUIRE(decay_steps > 0, "a ", to_string(kind), " learning rate schedule needs decay_steps > 0");
}

std::string LearningRateSchedule::describe() const {
  std::string s = to_string(kind) + "(peak=" + std::to_string(peak);
  if (kind != Kind::constant) s += ", warmup_steps=" + std::to_string(warmup_steps);
  if (kind == Kind::cosine_decay || kind == Kind::linear_decay)
    s += ", decay_steps=" + std::to_string(decay_steps) + ", end_value=" + std::to_string(end_value);
  return s + ")";
}

LearningRateSchedule LearningRateSchedule::constant(double value) {
  LearningRateSchedule s;
  s.peak = value;
  return s;
}
LearningRateSchedule LearningRateSchedule::warmup(double peak, long warmup_steps) {
  LearningRateSchedule s{Kind::linear_warmup, peak, warmup_steps};
  return s;
}
LearningRateSchedule LearningRateSchedule::cosine(double peak, long warmup_steps, long decay_steps, double end_value) {
  return {Kind::cosine_decay, peak, warmup_steps, decay_steps, end_value};
}
LearningRateSchedule LearningRateSchedule::linear(double peak, long warmup_steps, long decay_steps, double end_value) {
  return {Kind::linear_decay, peak, warmup_steps, decay_steps, end_value};
}
LearningRateSchedule LearningRateSchedule::inverse_sqrt(double peak, long warmup_steps) {
  return {Kind::rsqrt, peak, warmup_steps};
}

std::string to_string(LearningRateSchedule::Kind kind) {
  switch (kind) {
    case LearningRateSchedule::Kind::constant:
      return "constant";
    case LearningRateSchedule::Kind::linear_warmup:
      return "warmup";
    case LearningRateSchedule::Kind::cosine_decay:
      return "cosine";
    case LearningRateSchedule::Kind::linear_decay:
      return "linear";
    case LearningRateSchedule::Kind::rsqrt:
      return "rsqrt";
  }
  return "constant";
}

LearningRateSchedule::Kind parse_schedule_kind(const std::string& name) {
  for (auto kind : {LearningRateSchedule::Kind::constant, LearningRateSchedule::Kind::linear_warmup,
                    LearningRateSchedule::Kind::cosine_decay, LearningRateSchedule::Kind::linear_decay,
                    LearningRateSchedule::Kind::rsqrt})
    if (to_string(kind) == name) return kind;
  LATHER_FAIL("unknown learning rate schedule '", name, "' (expected constant, warmup, cosine, linear or rsqrt)");
}

}  // namespace lather::optim
