#include <lather/nn/pipeline_schedule.hpp>

#include <lather/core/error.hpp>

#include <algorithm>

namespace lather::nn {

PipelineSchedule parse_pipeline_schedule(const std::string& text) {
  if (text == "gpipe") return PipelineSchedule::gpipe;
  if (text == "1f1b") return PipelineSchedule::one_forward_one_backward;
  LATHER_FAIL("pipeline schedule '", text, "' is not one of gpipe, 1f1b");
}

std::string to_string(PipelineSchedule schedule) { return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b"; }

namespace {
void check(int stages, int stage, int micro_batches) {
  LATHER_REQUIRE(stages >= 1 && stage >= 0 && stage < stages, "pipeline: stage ", stage, " of ", stages);
  LATHER_REQUIRE(micro_batches >= 1, "pipeline: micro_batches must be >= 1, got ", micro_batches);
}
}  // namespace

int activation_slots(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  check(stages, stage, micro_batches);
  return schedule == PipelineSchedule::gpipe ? micro_batches : std::min(stages - stage, micro_batches);
}

std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  const int slots = activation_slots(schedule, stages, stage, micro_batches);
  using Kind = PipelineAction::Kind;
  std::vector<PipelineAction> actions;
  const auto add = [&](Kind kind, int m) { actions.push_back({kind, m, m % slots}); };
  if (schedule == PipelineSchedule::gpipe) {
    for (int m = 0; m < micro_batches; ++m) add(Kind::forward, m);
    for (int m = 0; m < micro_batches; ++m) add(Kind::backward, m);
    return actions;
  }
  const int warm_up = std::min(stages - stage - 1, micro_batches);
  const int steady = micro_batches - warm_up;
  for (int m = 0; m < warm_up; ++m) add(Kind::forward, m);
  for (int i = 0; i < steady; ++i) {
    add(Kind::forward, warm_up + i);
    add(Kind::backward, i);
  }
  for (int m = steady; m < micro_batches; ++m) add(Kind::backward, m);
  return actions;
}

double bubble_bound(int stages, int micro_batches) { return double(stages - 1) / double(micro_batches + stages - 1); }

std::vector<double> stage_idle_fractions(const std::vector<double>& busy, const std::vector<double>& schedule) {
  LATHER_REQUIRE(busy.size() == schedule.size(), "stage_idle_fractions: ", busy.size(), " busy times for ",
                 schedule.size(), " schedules");
  double span = 1e-12;
  for (double s : schedule) span = std::max(span, s);
  std::vector<double> idle;
  for (double b : busy) idle.push_back(1.0 - b / span);
  return idle;
}

}  // namespace lather::nn
