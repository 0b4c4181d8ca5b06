#include "plan_model.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>

namespace lather::plan {

int log2_ceil(int p) {
  int levels = 0;
  for (int reach = 1; reach < p; reach *= 2) ++levels;
  return levels;
}

double allreduce_seconds(const Network& net, int p, double bytes) {
  if (p <= 1) return 0;
  return 2.0 * log2_ceil(p) * net.alpha + 2.0 * (p - 1) / p * bytes * net.beta;
}

double allgather_seconds(const Network& net, int p, double bytes) {
  if (p <= 1) return 0;
  return log2_ceil(p) * net.alpha + double(p - 1) / p * bytes * net.beta;
}

double send_seconds(const Network& net, double bytes) { return net.alpha + bytes * net.beta; }

double ModelCosts::passes_seconds(double rows) const {
  const std::size_t n = std::min(pass_rows.size(), pass_seconds.size());
  if (n == 0) return 0;
  if (n == 1) return pass_seconds[0] * rows / pass_rows[0];
  std::size_t k = 1;  // the segment [k - 1, k] that holds rows, or the nearest one
  while (k + 1 < n && rows > pass_rows[k]) ++k;
  const double x0 = pass_rows[k - 1], x1 = pass_rows[k], y0 = pass_seconds[k - 1], y1 = pass_seconds[k];
  return std::max(0.0, y0 + (y1 - y0) * (rows - x0) / (x1 - x0));
}

std::string Layout::name() const {
  return std::to_string(replicas) + " replicas x " + std::to_string(stages) + " stages x " + std::to_string(shards) +
         " shards" + (overlap ? ", overlapped" : "") + (sharded ? ", sharded parameters" : "");
}

double largest_share(const std::vector<double>& unit_costs, int ranks) {
  ranks = std::max(1, ranks);
  std::vector<double> costs = unit_costs;
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  if (costs.empty() || total <= 0) return 1.0 / ranks;
  std::sort(costs.begin(), costs.end(), std::greater<double>());
  // The least loaded rank on top.
  std::priority_queue<double, std::vector<double>, std::greater<double>> loads;
  for (int r = 0; r < ranks; ++r) loads.push(0.0);
  double largest = 0;
  for (double c : costs) {
    const double load = loads.top() + c;
    loads.pop();
    loads.push(load);
    largest = std::max(largest, load);
  }
  return largest / total;
}

namespace {

/// The sharded step (ParameterShards): `out` holds the compute and tensor-parallel terms.
/// A step of M passes over L layers gathers L + (L - 2) layers in its first pass (the optimizer
/// changed every value; the last two layers of a forward are still whole for the backward) and
/// 2 (L - 2) in each later one (the first two of a backward are still whole for the next forward);
/// each pass reduce-scatters every layer. A gather and a reduce-scatter of n bytes over R ranks
/// cost the same (Thakur et al.), one per tensor. MPICH moves a prefetched gather only inside MPI
/// calls, so nothing overlaps the passes: all of it is exposed.
Prediction predict_sharded(const ModelCosts& c, const Network& net, const Layout& l, double samples, Prediction out,
                           double gradient_bytes) {
  const int M = std::max(1, l.micro_batches), S = std::max(1, l.shards), R = std::max(1, l.replicas);
  const double L = double(c.layer_parameters.size());
  double all_layers = 0, first_two = 0, last_two = 0, largest[2] = {0, 0};
  for (std::size_t k = 0; k < c.layer_parameters.size(); ++k) {
    const double bytes = 4.0 * c.layer_parameters[k] / S;
    const double tensors = k < c.layer_tensors.size() ? c.layer_tensors[k] : double(c.tensors_per_layer);
    const double seconds = tensors * allgather_seconds(net, R, bytes / tensors);
    all_layers += seconds;
    if (k < 2) first_two += seconds;
    if (k + 2 >= c.layer_parameters.size()) last_two += seconds;
    largest[k % 2] = std::max(largest[k % 2], bytes);
  }
  const double first_pass = 2.0 * all_layers - last_two;
  const double later_pass = 2.0 * all_layers - last_two - first_two;
  const double gathers = L > 0 ? first_pass + (M - 1) * later_pass : 0.0;
  out.reduction = gathers + M * all_layers;
  out.exposed = out.reduction;
  out.optimizer = c.optimizer_seconds / S * largest_share(c.optimizer_unit_costs, R);
  // Sharded Muon: each matrix's rows to its owner and its rows of the result back, one matrix
  // after the other (a gather and a scatter: the owner's link carries (R - 1)/R of it each way).
  if (R > 1 && c.sharded_matrix_exchanges > 0)
    out.optimizer +=
        2.0 * (c.sharded_matrix_exchanges * net.alpha + double(R - 1) / R * c.sharded_matrix_bytes / S * net.beta);
  // The step's agreement, its weight and the loss sums: three small all-reduces.
  const double agreements = 3.0 * allreduce_seconds(net, R, 8.0);
  out.step = out.compute + out.tensor_parallel + out.exposed + out.optimizer + agreements;
  // Bands of the values, gradients and state, and two buffers of a layer's values and gradients.
  const double rows = samples * c.rows_per_sample / M;
  out.memory_bytes = (2.0 * gradient_bytes + c.optimizer_state_bytes / S) / R + 2.0 * (largest[0] + largest[1]) +
                     rows * c.activation_bytes_per_row / S;
  out.samples_per_second = samples * R / out.step;
  return out;
}

}  // namespace

Prediction predict(const ModelCosts& c, const Network& net, const Layout& l, double samples) {
  Prediction out;
  const int M = std::max(1, l.micro_batches), P = std::max(1, l.stages), S = std::max(1, l.shards);
  const int R = std::max(1, l.replicas);
  const double rows = samples * c.rows_per_sample, micro_rows = rows / M;
  // One micro-batch's passes on one stage: its share of the blocks, split over the shards.
  const double passes = c.passes_seconds(micro_rows) / (double(S) * P);
  // The shards' all-reduces of one micro-batch on one stage (its share of the layers' messages).
  const double tp = S > 1 ? (c.tensor_parallel_allreduces * 2.0 * log2_ceil(S) * net.alpha +
                             2.0 * (S - 1) / S * micro_rows * c.tensor_parallel_bytes_per_row * net.beta) /
                                P
                          : 0.0;
  // A pipeline runs M + P - 1 slots of the longest stage (the bubble); without stages, M passes.
  const double slots = M + P - 1;
  out.compute = slots * passes;
  out.tensor_parallel = slots * tp;
  // The fill and the drain: one transfer per boundary each way on the critical path.
  out.pipeline = P > 1 ? 2.0 * (P - 1) * send_seconds(net, micro_rows * c.stream_bytes_per_row) : 0.0;
  const double gradient_bytes = 4.0 * c.parameters / (double(S) * P);
  if (l.sharded && !c.layer_parameters.empty()) return predict_sharded(c, net, l, samples, out, gradient_bytes);
  // The gradient reduction over the replicas: one all-reduce per bucket of this rank's gradients.
  const double buckets = std::max(1.0, std::ceil(gradient_bytes / std::max(1.0, l.bucket_bytes)));
  out.reduction = R > 1 ? buckets * 2.0 * log2_ceil(R) * net.alpha + 2.0 * (R - 1) / R * gradient_bytes * net.beta : 0;
  if (l.overlap && R > 1) {
    // The backward (two thirds of the passes) runs while the buckets before the last reduce; the
    // last bucket, written by the first layer, waits for the end of the backward.
    const double backward = 2.0 / 3.0 * passes * M;
    out.exposed = std::max(out.reduction / buckets, out.reduction - backward * (1.0 - 1.0 / buckets));
  } else {
    out.exposed = out.reduction;
  }
  // The optimizer on this rank's tensors; a distributed step splits it over the replicas and
  // all-gathers the new values. Muon with weight shards (optim::ShardedMuon over each replica's
  // shards) orthogonalizes each matrix whole on one shard: the shards split whole matrices, each
  // matrix's slices travel to its owner and back, and every replica does the same.
  const bool whole_matrices = S > 1 && c.sharded_matrix_exchanges > 0;
  const double local_optimizer =
      whole_matrices
          ? c.optimizer_seconds / P * largest_share(c.optimizer_unit_costs, S) +
                2.0 * (c.sharded_matrix_exchanges * net.alpha + double(S - 1) / S * c.sharded_matrix_bytes * net.beta) /
                    P
          : c.optimizer_seconds / (double(S) * P);
  out.optimizer =
      c.distributed_step && R > 1 && !whole_matrices
          ? local_optimizer * largest_share(c.optimizer_unit_costs, R) + allgather_seconds(net, R, gradient_bytes)
          : local_optimizer;
  // The reducer's agreement and the step's loss sums: two small all-reduces over the replicas.
  const double agreements = 2.0 * allreduce_seconds(net, R, 8.0);
  out.step = out.compute + out.tensor_parallel + out.pipeline + out.exposed + out.optimizer + agreements;
  // Memory: this rank's parameters, gradients and optimizer state, and the activations of the
  // micro-batches a 1F1B stage keeps (P of them on the first stage, at most M).
  const double split = c.distributed_step ? c.optimizer_split_bytes : 0.0;
  const double state = (c.optimizer_state_bytes - split + split / R) / (double(S) * P);
  const double kept = std::min(M, P);
  out.memory_bytes = 2.0 * gradient_bytes + state + kept * micro_rows * c.activation_bytes_per_row / (double(S) * P);
  out.samples_per_second = samples * R / out.step;
  return out;
}

double scaling_efficiency(const Prediction& one_rank, const Prediction& at, const Layout& layout) {
  const double per_rank = at.samples_per_second / layout.ranks();
  return one_rank.samples_per_second > 0 ? per_rank / one_rank.samples_per_second : 0.0;
}

}  // namespace lather::plan
