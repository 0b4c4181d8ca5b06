#include <lather/optim/impl/distribution_impl.hpp>

#include <algorithm>
#include <numeric>

namespace lather::optim {

std::vector<int> longest_processing_time(const std::vector<double>& costs, int parts) {
  LATHER_REQUIRE(parts >= 1, "longest_processing_time: parts must be >= 1, got ", parts);
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(std::size_t(parts), 0.0);
  std::vector<int> part(costs.size(), 0);
  for (std::size_t k : order) {
    const auto least = std::min_element(load.begin(), load.end());
    part[k] = int(least - load.begin());
    *least += costs[k];
  }
  return part;
}

#define LATHER_OPTIM_DISTRIBUTION_INSTANTIATE(SPACE, SCALAR)                                                          \
  template class Distributor<SPACE, SCALAR>;                                                                          \
  template std::unique_ptr<Distributor<SPACE, SCALAR>> make_distributor<SPACE, SCALAR>(Placement, const comm::Group&, \
                                                                                       ExchangeOptions);

LATHER_OPTIM_DISTRIBUTION_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_OPTIM_DISTRIBUTION_INSTANTIATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_OPTIM_DISTRIBUTION_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_OPTIM_DISTRIBUTION_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::optim
