#include <lather/optim/work_group.hpp>

#include <lather/core/error.hpp>

#include <algorithm>
#include <numeric>

namespace lather::optim {

std::vector<int> assign_statistics(const std::vector<int>& sizes, int ranks, RootAssignment how) {
  LATHER_REQUIRE(ranks >= 1, "assign_statistics: ranks must be >= 1, got ", ranks);
  const int n = int(sizes.size());
  std::vector<int> owner(n, 0);
  if (how == RootAssignment::even) {
    // The reference pads the stack to a multiple of the rank count and gives each rank an equal
    // contiguous slice.
    const int per_rank = (n + ranks - 1) / ranks;
    for (int s = 0; s < n; ++s) owner[s] = per_rank > 0 ? s / per_rank : 0;
    return owner;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Largest cost first; ties by index so every rank derives the same assignment.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sizes[a] > sizes[b]; });
  std::vector<double> load(ranks, 0.0);
  for (int s : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[s] = r;
    load[r] += double(sizes[s]) * sizes[s] * sizes[s];
  }
  return owner;
}

double load_imbalance(const std::vector<int>& sizes, const std::vector<int>& owner, int ranks) {
  std::vector<double> load(ranks, 0.0);
  for (std::size_t s = 0; s < sizes.size(); ++s) load[owner[s]] += double(sizes[s]) * sizes[s] * sizes[s];
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (total == 0) return 1.0;
  return *std::max_element(load.begin(), load.end()) / (total / ranks);
}

}  // namespace lather::optim
