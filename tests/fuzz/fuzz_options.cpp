// libFuzzer harness: the bytes are a lather-train config file (TOML/INI, keys are the long option
// names), parsed as the driver parses it: CLI11 through train::add_options (`--config FILE`), then
// apply_model_defaults and TrainOptions::validate (which sets every `shampoo = [...]` pair with
// optim::set_option and validates the optimizer's options). Every line `name = value` is also given
// to optim::set_option directly, and every Shampoo option must then print (option_value) a value
// that set_option accepts and prints the same.
// A lather::Error or a CLI11 parse error is the expected rejection; anything else is a bug.
#include "fuzz_support.hpp"
#include "command_line.hpp"

#include <lather/core/error.hpp>
#include <lather/optim/shampoo_options.hpp>

#include <CLI/CLI.hpp>

#include <string_view>

namespace {

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '"' || c == '\''; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

void parse_config_file(const std::string& path) {
  CLI::App app{"lather-train (fuzzed)"};
  lather::train::TrainOptions options;
  lather::train::add_options(app, options);
  const char* argv[] = {"lather-train", "--config", path.c_str()};
  try {
    app.parse(3, argv);
    lather::train::apply_model_defaults(app, options);
    options.validate();
  } catch (const CLI::ParseError&) {
  } catch (const lather::Error&) {
  }
}

void set_shampoo_options(std::string_view text) {
  namespace optim = lather::optim;
  optim::ShampooOptions options;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    try {
      optim::set_option(options, std::string(trim(line.substr(0, eq))), std::string(trim(line.substr(eq + 1))));
    } catch (const lather::Error&) {
    }
  }
  try {
    options.validate();
  } catch (const lather::Error&) {
  }
  // What option_value prints, set_option reads back to the same value.
  optim::ShampooOptions copy;
  for (const std::string& name : optim::option_names()) {
    const std::string value = optim::option_value(options, name);
    optim::set_option(copy, name, value);  // must not throw
    LATHER_FUZZ_CHECK(optim::option_value(copy, name) == value);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parse_config_file(lather::fuzz::scratch().write("lather-train.toml", data, size));
  set_shampoo_options(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
