// lather-bench balance: how evenly the inverse-root work of a parameter set spreads over the ranks
// of a data-parallel group, under the reference's even split of the padded stack by count and
// under Lather's greedy longest-processing-time assignment on n^3. No timing: the cost model is
// the root's flop count, and the figure is max over mean cost per rank (1 is perfect).
#include "bench_common.hpp"

#include <lather/core/error.hpp>
#include <lather/optim/shampoo.hpp>

#include <fstream>

namespace lather::bench {
namespace {

struct BalanceOptions {
  std::vector<std::string> sets = {"transformer", "cnn"};
  std::vector<int> ranks = {2, 4, 8, 16, 32};
  std::vector<int> block_sizes = {128, 1024};
  std::string file;
};

void run_balance(const BalanceOptions& o) {
  const std::string path = o.file.empty() ? default_parameter_sets_file() : o.file;
  const auto doc = read_parameter_sets(path);
  optim::ShampooOptions options = shampoo_options_of(doc);
  for (const auto& set : o.sets)
    for (int block_size : o.block_sizes) {
      options.block_size = block_size;
      const auto specs = parameter_specs_of(doc, set, path);
      optim::Shampoo<Kokkos::DefaultExecutionSpace, float> shampoo(Kokkos::DefaultExecutionSpace(), specs, options);
      std::vector<int> sizes;
      for (const auto& m : shampoo.metrics()) sizes.push_back(m.size);
      for (int ranks : o.ranks) {
        LATHER_REQUIRE(ranks >= 1, "--ranks values must be >= 1, got ", ranks);
        const auto even = optim::assign_statistics(sizes, ranks, optim::RootAssignment::even);
        const auto balanced = optim::assign_statistics(sizes, ranks, optim::RootAssignment::balanced);
        const double even_imbalance = optim::load_imbalance(sizes, even, ranks);
        const double balanced_imbalance = optim::load_imbalance(sizes, balanced, ranks);
        emit({{"bench", "balance"},
              {"set", set},
              {"block_size", block_size},
              {"ranks", ranks},
              {"statistics", sizes.size()},
              {"even_imbalance", even_imbalance},
              {"balanced_imbalance", balanced_imbalance},
              {"ratio", balanced_imbalance / even_imbalance}});
      }
    }
}

}  // namespace

void register_balance(CLI::App& app) {
  auto options = std::make_shared<BalanceOptions>();
  auto* sub = app.add_subcommand("balance",
                                 "Root-work imbalance (max / mean n^3 per rank) of the even split and of the "
                                 "balanced assignment for the parameter sets");
  add_list_option(*sub, "--set", options->sets, "Parameter sets");
  add_list_option(*sub, "--ranks", options->ranks, "Group sizes");
  add_list_option(*sub, "--block-size", options->block_sizes, "Shampoo block sizes");
  sub->add_option("--sets-file", options->file, "The parameter sets file (default: perf/parameter_sets.json)");
  sub->callback([options] { run_balance(*options); });
}

}  // namespace lather::bench
