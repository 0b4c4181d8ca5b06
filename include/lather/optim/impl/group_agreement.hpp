#pragma once
// What the optimizers that split their step over a group (SOAP, Muon) agree on when they are
// built: that every rank was given the same parameters and options, and that none failed to set
// itself up. One all-gather of (hash, failed) per rank; a failure anywhere is the same
// lather::Error on every rank, and a rank with other parameters or options is named.

#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>
#include <lather/core/impl/hash.hpp>
#include <lather/core/parameters.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lather::optim::Impl {

/// Collective over `group` (more than one rank). `who` names the optimizer in the messages.
inline void agree_on_construction(const comm::Group& group, const char* who,
                                  const std::vector<ParameterSpec>& parameters,
                                  const std::vector<std::pair<std::string, std::string>>& options,
                                  const std::string& local_error) {
  const int ranks = group.size();
  ::lather::Impl::Fnv1a hash;
  for (const auto& spec : parameters) {
    hash.add(spec.name).add(std::uint64_t(spec.shape.size()));
    for (auto d : spec.shape) hash.add(std::uint64_t(d));
  }
  for (const auto& [key, value] : options) hash.add(key).add(value);
  const std::uint64_t mine[2] = {hash.value(), local_error.empty() ? 0u : 1u};
  std::vector<std::uint64_t> all(2 * std::size_t(ranks));
  group.allgather(mine, 2, all.data());
  bool failed = false;
  int differing = -1;
  for (int r = 0; r < ranks; ++r) {
    failed = failed || all[2 * r + 1] != 0;
    if (differing < 0 && all[2 * r] != all[0]) differing = r;
  }
  if (failed) group.agree_on_failure(who, local_error);
  LATHER_REQUIRE(differing < 0, who, ": group rank ", differing, " of ", ranks,
                 " was given other parameters (names, shapes) or options than rank 0");
}

}  // namespace lather::optim::Impl
