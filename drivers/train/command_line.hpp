#pragma once
// lather-train's command line and config files (CLI11): the options registered on a CLI::App,
// with per-model defaults in the help; what is checked of the arguments before CLI11 reads them
// (the --model the help is for, --config files that are not text); the model's defaults and the
// options it does not read, once parsed; and CLI11's messages in words for users.

#include "training_options.hpp"

#include <optional>
#include <string>

// CLI11 is header-only and costs about 10 s of compilation in every file that includes it (g++
// -O3): only the files that build or read the command line include it.
namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace lather::train {

/// apply_model_defaults for options parsed by `app`; then validates them, and refuses, naming it,
/// an option given that the chosen model or optimizer does not use (it would silently change
/// nothing). Call after parsing. Throws lather::Error.
void apply_model_defaults(const CLI::App& app, TrainOptions& options);

/// The --model named in the arguments (`--model NAME` or `--model=NAME`), if any: --help then
/// shows that model's defaults.
std::optional<ModelKind> model_in_arguments(int argc, const char* const* argv);

/// Registers every option on `app`, including --config for TOML/INI files whose keys are the
/// long option names (e.g. `epochs = 5`, `shampoo = ["block_size=128", ...]`) and one
/// --shampoo-<name> option per Shampoo option. The help shows the defaults of `help_model`, or
/// of both models where they differ.
void add_options(CLI::App& app, TrainOptions& options, std::optional<ModelKind> help_model = std::nullopt);

/// CLI11's message for a command-line error in words for users: "--epochs was given 2 times"
/// for CLI11's "At Most 1 required but received 2", and the unexpected arguments in the order
/// they were given (CLI11 lists them reversed).
std::string explain(const CLI::ParseError& error, const CLI::App& app);

/// Refuses a --config file that is not text (a NUL byte, or bytes that are not UTF-8), naming it,
/// before CLI11 reads it and echoes its bytes back. Throws lather::Error.
void check_config_files(int argc, const char* const* argv);

}  // namespace lather::train
