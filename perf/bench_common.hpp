#pragma once
// Shared pieces of lather-bench: every subcommand registers itself on the CLI11 app and prints
// one JSON object per line, each carrying its same-run baseline and the ratio to it.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace lather::bench {

/// Prints one JSON line and flushes, so partial runs still leave complete records.
inline void emit(const nlohmann::json& record) { std::cout << record.dump() << std::endl; }

/// Parses "a,b,c" into numbers; CLI11 does the per-item conversion and reports bad items.
template <class T>
void add_list_option(CLI::App& app, const std::string& name, std::vector<T>& values,
                     const std::string& help) {
  app.add_option(name, values, help)->delimiter(',')->capture_default_str();
}

void register_root(CLI::App& app);
void register_step(CLI::App& app);

}  // namespace lather::bench
