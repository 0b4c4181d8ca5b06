#pragma once
// The optimizer a training run asks for (--optimizer), built on the model's parameters and the
// mesh: Shampoo shares its root work over the replicas of a shard; the first-order baselines
// need no communication.

#include "dataset.hpp"
#include "training_options.hpp"

#include <lather/comm/mesh.hpp>
#include <lather/optim/optimizer.hpp>

#include <memory>

namespace lather::train {

std::unique_ptr<optim::Optimizer<Space, float>> make_optimizer(const Space& space, const TrainOptions& o,
                                                               const std::vector<ParameterSpec>& parameters,
                                                               const comm::Mesh& mesh);

/// The optimizer of a --shard-parameters run, on the parameters sharded_parameters() gives: Shampoo
/// with the data-parallel group as its weight shards (its statistics numbered over the whole
/// model, a tensor's norms summed over the bands); Muon on the bands of rows over the group
/// (optim::ShardedMuon: each matrix orthogonalized whole on its owner); the others on this rank's
/// parameters alone.
std::unique_ptr<optim::Optimizer<Space, float>> make_sharded_optimizer(const Space& space, const TrainOptions& o,
                                                                       const std::vector<ParameterSpec>& parameters,
                                                                       const comm::Mesh& mesh);

}  // namespace lather::train
