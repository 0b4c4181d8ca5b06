#include "optimizer_factory.hpp"

#include <lather/core/error.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/sharded_muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/soap.hpp>

#include <algorithm>

namespace lather::train {

std::unique_ptr<optim::Optimizer<Space, float>> make_optimizer(const Space& space, const TrainOptions& o,
                                                               const std::vector<ParameterSpec>& parameters,
                                                               const comm::Mesh& mesh) {
  switch (o.optimizer) {
    case OptimizerKind::shampoo:
      return std::make_unique<optim::Shampoo<Space, float>>(space, parameters, o.shampoo_options(), mesh);
    // SOAP splits its blocks, Muon its matrices, over the replicas of the data-parallel group.
    // With weight shards SOAP keeps the blocks inside each shard's slices and sums its update
    // norms over the shards.
    case OptimizerKind::soap:
      return std::make_unique<optim::Soap<Space, float>>(space, parameters, o.soap_options(), mesh.data_parallel(),
                                                         mesh.weight_shards() > 1 ? mesh.shards() : comm::Group());
    case OptimizerKind::muon: {
      // A pipeline stage holds some of the model's tensors: its Muon names only those for AdamW.
      auto muon = o.muon_options();
      auto& adamw = muon.adamw_parameters;
      adamw.erase(std::remove_if(adamw.begin(), adamw.end(),
                                 [&](const std::string& name) {
                                   return std::none_of(parameters.begin(), parameters.end(),
                                                       [&](const ParameterSpec& p) { return p.name == name; });
                                 }),
                  adamw.end());
      // With weight shards a matrix's slices meet whole at one shard for the iteration, as sharded
      // parameters' bands do; every replica does the same.
      if (mesh.weight_shards() > 1)
        return std::make_unique<optim::ShardedMuon<Space, float>>(space, parameters, muon, mesh.shards());
      return std::make_unique<optim::Muon<Space, float>>(space, parameters, muon, mesh.data_parallel());
    }
    case OptimizerKind::sgd:
      return std::make_unique<optim::FirstOrder<Space, float>>(space, parameters, o.sgd_options());
    case OptimizerKind::adagrad:
      return std::make_unique<optim::FirstOrder<Space, float>>(space, parameters, o.adagrad_options());
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return std::make_unique<optim::FirstOrder<Space, float>>(space, parameters, o.adam_options());
  }
  LATHER_FAIL("--optimizer value ", int(o.optimizer), " has no optimizer");
}

std::unique_ptr<optim::Optimizer<Space, float>> make_sharded_optimizer(const Space& space, const TrainOptions& o,
                                                                       const std::vector<ParameterSpec>& parameters,
                                                                       const comm::Mesh& mesh) {
  // Shampoo sums a tensor's norms over its pieces: bands over the replicas, and with weight shards
  // the shards' slices too, so over the whole mesh (sharded runs have no pipeline stages; pieces
  // that several ranks hold count once).
  if (o.optimizer == OptimizerKind::shampoo)
    return std::make_unique<optim::Shampoo<Space, float>>(space, parameters, o.shampoo_options(), comm::Group(),
                                                          mesh.world());
  if (o.optimizer == OptimizerKind::soap)
    return std::make_unique<optim::Soap<Space, float>>(space, parameters, o.soap_options(), comm::Group(),
                                                       mesh.world());
  // Muon's pieces: bands of rows over the replicas, with weight shards of each shard's slices, so
  // over the whole mesh.
  if (o.optimizer == OptimizerKind::muon)
    return std::make_unique<optim::ShardedMuon<Space, float>>(space, parameters, o.muon_options(), mesh.world());
  // Each rank's own units: no group shares them.
  return make_optimizer(space, o, parameters, comm::Mesh());
}

}  // namespace lather::train
