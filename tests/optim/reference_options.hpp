#pragma once
// The options the reference scripts record in their data files (tests/data/soap_reference,
// tests/data/muon_reference) as Lather's optimizer options: the tests that replay the references
// and the tests that compare reduced-precision products on the same problems read them alike.
#include <lather/optim/muon.hpp>
#include <lather/optim/soap.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <string>
#include <vector>

namespace lather::test {

/// pytorch-optimizer's SOAP options of a soap_reference file ("options").
inline optim::SoapOptions soap_reference_options(const nlohmann::json& o) {
  optim::SoapOptions options;
  options.learning_rate = optim::LearningRateSchedule::constant(o.at("learning_rate"));
  options.beta1 = o.at("beta1");
  options.beta2 = o.at("beta2");
  options.shampoo_beta = o.at("shampoo_beta");
  options.epsilon = o.at("epsilon");
  options.weight_decay = o.at("weight_decay");
  options.precondition_frequency = o.at("precondition_frequency");
  options.max_precond_dim = o.at("max_precond_dim");
  options.block_size = o.at("block_size");
  options.merge_small_dims_block_size = o.at("merge_small_dims_block_size");
  options.precondition_1d = o.at("precondition_1d");
  options.normalize_grads = o.at("normalize_grads");
  options.correct_bias = o.at("correct_bias");
  return options;
}

/// optax.contrib.muon's options of a muon_reference file ("options").
inline optim::MuonOptions muon_reference_options(const nlohmann::json& o) {
  using optim::LearningRateSchedule;
  optim::MuonOptions options;
  const auto& lr = o.at("learning_rate");
  const std::string kind = lr.at("kind");
  options.learning_rate = kind == "constant" ? LearningRateSchedule::constant(lr.at("peak"))
                                             : LearningRateSchedule::cosine(lr.at("peak"), lr.at("warmup_steps"),
                                                                            lr.at("decay_steps"), lr.at("end_value"));
  options.beta = o.at("beta");
  options.nesterov = o.at("nesterov");
  options.ns_steps = o.at("ns_steps");
  options.ns_coefficients = o.at("ns_coefficients").get<std::array<double, 3>>();
  options.epsilon = o.at("epsilon");
  options.adam_epsilon = o.at("epsilon");  // optax's muon hands its eps to its AdamW
  options.weight_decay = o.at("weight_decay");
  options.adam_beta1 = o.at("adam_beta1");
  options.adam_beta2 = o.at("adam_beta2");
  options.adam_epsilon_root = o.at("adam_epsilon_root");
  options.adam_weight_decay = o.at("adam_weight_decay");
  options.adamw_parameters = o.at("adamw_parameters").get<std::vector<std::string>>();
  return options;
}

}  // namespace lather::test
