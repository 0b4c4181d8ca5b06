#include "optimizer_factory.hpp"

#include <lather/optim/first_order.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/soap.hpp>

namespace lather::train {

std::unique_ptr<optim::Optimizer<Space, float>> make_optimizer(const Space& space, const TrainOptions& o,
                                                               const std::vector<ParameterSpec>& parameters,
                                                               const comm::Mesh& mesh) {
  if (o.optimizer == "shampoo")
    return std::make_unique<optim::Shampoo<Space, float>>(space, parameters, o.shampoo_options(), mesh);
  // SOAP splits its blocks, Muon its matrices, over the replicas of the data-parallel group.
  if (o.optimizer == "soap")
    return std::make_unique<optim::Soap<Space, float>>(space, parameters, o.soap_options(), mesh.data_parallel());
  if (o.optimizer == "muon")
    return std::make_unique<optim::Muon<Space, float>>(space, parameters, o.muon_options(), mesh.data_parallel());
  if (o.optimizer == "sgd") return std::make_unique<optim::FirstOrder<Space, float>>(space, parameters, o.sgd_options());
  if (o.optimizer == "adagrad")
    return std::make_unique<optim::FirstOrder<Space, float>>(space, parameters, o.adagrad_options());
  return std::make_unique<optim::FirstOrder<Space, float>>(space, parameters, o.adam_options());
}

}  // namespace lather::train
