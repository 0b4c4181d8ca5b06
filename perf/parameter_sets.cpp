#include "bench_common.hpp"

#include <lather/core/error.hpp>

#include <fstream>

namespace lather::bench {

std::string default_parameter_sets_file() {
  for (const char* candidate :
       {LATHER_PERF_SOURCE_DIR "/parameter_sets.json", LATHER_PERF_INSTALL_DIR "/parameter_sets.json"}) {
    std::ifstream in(candidate);
    if (in) return candidate;
  }
  return LATHER_PERF_SOURCE_DIR "/parameter_sets.json";
}

nlohmann::json read_parameter_sets(const std::string& path) {
  std::ifstream in(path);
  LATHER_REQUIRE(bool(in), "cannot open parameter sets file '", path, "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    LATHER_FAIL("parameter sets file '", path, "' is not valid JSON: ", e.what());
  }
}

optim::ShampooOptions shampoo_options_of(const nlohmann::json& doc) {
  optim::ShampooOptions options;
  for (const auto& [key, value] : doc.at("shampoo_options").items())
    optim::set_option(options, key, value.is_string() ? value.get<std::string>() : value.dump());
  return options;
}

std::vector<optim::ParameterSpec> parameter_specs_of(const nlohmann::json& doc, const std::string& set,
                                                     const std::string& path) {
  LATHER_REQUIRE(doc.at("sets").contains(set), "parameter set '", set, "' is not in ", path);
  std::vector<optim::ParameterSpec> specs;
  for (const auto& p : doc["sets"][set]) {
    optim::ParameterSpec spec;
    spec.name = p.at("name").get<std::string>();
    spec.shape = p.at("shape").get<TensorShape>();
    specs.push_back(spec);
  }
  return specs;
}

}  // namespace lather::bench
