#pragma once
// The order in which a pipeline stage runs the forward and backward passes of its micro-batches.
//
// GPipe (Huang et al. 2019): every forward, then every backward; a stage keeps the activations of
// all M micro-batches. 1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's default): stage
// s of P runs min(P - s - 1, M) forwards as a warm-up, then alternates one forward and one
// backward, then drains the remaining backwards; it keeps at most min(P - s, M) micro-batches of
// activations. Both run the backwards in micro-batch order, so the gradients accumulate in the
// same order as M micro-batches of gradient accumulation on one stage; both have the bubble
// (P - 1) / (M + P - 1) of the step when the stages take equal time.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_NN)
#error "lather/nn/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <string>
#include <vector>

namespace lather::nn {

enum class PipelineSchedule { gpipe, one_forward_one_backward };

/// "gpipe" or "1f1b"; throws lather::Error naming the accepted values.
PipelineSchedule parse_pipeline_schedule(const std::string& text);
std::string to_string(PipelineSchedule schedule);

struct PipelineAction {
  enum class Kind { forward, backward };
  Kind kind = Kind::forward;
  int micro_batch = 0;
  int slot = 0;  ///< the activation slot the micro-batch occupies on this stage
};

/// Stage `stage`'s actions for `micro_batches` micro-batches over `stages` stages.
std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int stages, int stage, int micro_batches);
/// Micro-batches whose activations stage `stage` keeps at once: the slots its actions use.
int activation_slots(PipelineSchedule schedule, int stages, int stage, int micro_batches);
/// The idle fraction of a step with equal stage times: (P - 1) / (M + P - 1).
double bubble_bound(int stages, int micro_batches);
/// The measured idle fraction of each stage, 1 - busy / the longest schedule: a stage that ends
/// its schedule first (GPipe's last) waits for the others at the next step, so every stage's time
/// counts against the longest. `busy` and `schedule` hold each stage's seconds in passes and in
/// whole schedules over the same steps.
std::vector<double> stage_idle_fractions(const std::vector<double>& busy, const std::vector<double>& schedule);

}  // namespace lather::nn
