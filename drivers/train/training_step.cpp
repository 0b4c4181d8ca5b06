#include "training_step.hpp"

namespace lather::train {

StepSums training_step(const Space& space, const TrainOptions& o, const data::LabelledImages& train_set,
                       const std::vector<std::int32_t>& order, long begin, long end, int replicas, int replica,
                       StepParts& parts) {
  const auto& parameters = parts.model.parameters();
  const auto& grads = parameters.gradients();
  const auto [mine_begin, mine_end] = share(end - begin, replicas, replica);
  StepSums sums;
  for (int k = 0; k < o.accumulate; ++k) {
    const auto [m0, m1] = share(mine_end - mine_begin, o.accumulate, k);
    if (m1 == m0) continue;
    const auto [x, y] = parts.staging.load(space, train_set, order.data(), begin + mine_begin + m0,
                                           begin + mine_begin + m1);
    const auto r = parts.model.train_batch(space, x, y, sums.samples > 0);
    sums.loss += r.loss_sum;
    sums.correct += double(r.correct);
    sums.samples += double(r.samples);
  }
  // A replica with no sample this step contributes zero gradients.
  if (sums.samples == 0) Kokkos::deep_copy(space, parameters.gradient_buffer(), 0.0f);
  // Gradients are sums over this replica's samples: their token-weighted mean is the mean over the
  // global batch, whatever the rank count.
  if (o.reduce == "mean") {
    parts.reducer.weighted_mean(space, grads, sums.samples);
  } else {
    // Adasum combines per-replica gradients: the mean over this replica's samples.
    const float scale = sums.samples > 0 ? float(1.0 / sums.samples) : 0.0f;
    const auto all = parameters.gradient_buffer();
    Kokkos::parallel_for(
        "lather-train::scale", Kokkos::RangePolicy<Space>(space, 0, all.extent(0)),
        KOKKOS_LAMBDA(std::int64_t k) { all(k) *= scale; });
    if (o.reduce == "adasum")
      parts.reducer.adasum(space, grads);
    else
      parts.reducer.adasum_approx(space, grads);
  }
  parts.optimizer.step(space, parameters);
  return sums;
}

}  // namespace lather::train
