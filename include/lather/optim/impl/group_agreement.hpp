#pragma once
// What the optimizers that share their step over a group (Shampoo, SOAP, Muon) agree on when they
// are built: that every rank was given the same parameters and options, and that none failed to
// set itself up. One all-gather of (hash, failed) per rank and group; a failure anywhere is the
// same lather::Error on every rank, and a rank with other parameters or options is named.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_OPTIM)
#error "lather/optim/impl/ headers are optim's own; other areas and programs use its public headers"
#endif

#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>
#include <lather/core/hash.hpp>
#include <lather/core/parameters.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lather::optim::Impl {

/// Collective over `group` (more than one rank). `who` names the optimizer in the messages.
/// `whole_shapes`: compare the parameters' global shapes (the ranks hold different slices of
/// them, as weight shards do) instead of the shapes each rank holds.
inline void agree_on_construction(const comm::Group& group, const char* who,
                                  const std::vector<ParameterSpec>& parameters,
                                  const std::vector<std::pair<std::string, std::string>>& options,
                                  const std::string& local_error, bool whole_shapes = false) {
  const int ranks = group.size();
  ::lather::Impl::Fnv1a hash;
  for (const auto& spec : parameters) {
    const TensorShape& shape = whole_shapes ? spec.global() : spec.shape;
    hash.add(spec.name).add(std::uint64_t(shape.size()));
    for (auto d : shape) hash.add(std::uint64_t(d));
    if (whole_shapes) hash.add(std::uint64_t(spec.split_axis + 1)).add(std::uint64_t(spec.band_of_whole));
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
  LATHER_REQUIRE(differing < 0, who, ": group rank ", differing, " of ", ranks, " was given other ",
                 whole_shapes ? "parameters (names, global shapes, split axes)" : "parameters (names, shapes)",
                 " or options than rank 0");
}

/// The same over a data-parallel `group` and the weight `shards` (either may be one rank): the
/// group's verdict is taken first and carried into the shards' agreement, so every rank of both
/// throws the same error, and none before the other group has agreed.
inline void agree_on_construction(const comm::Group& group, const comm::Group& shards, const char* who,
                                  const std::vector<ParameterSpec>& parameters,
                                  const std::vector<std::pair<std::string, std::string>>& options,
                                  const std::string& local_error) {
  std::string agreed = local_error;
  if (group.size() > 1) {
    try {
      agree_on_construction(group, who, parameters, options, local_error);
    } catch (const Error& e) {
      agreed = e.message();
    }
  }
  if (shards.size() > 1) agree_on_construction(shards, who, parameters, options, agreed, true);
  if (!agreed.empty()) throw Error(agreed, nullptr, 0);
}

/// Collective over `shards` (more than one rank), after the construction's agreement: per
/// parameter, whether this rank's piece counts in a sum over the shards of the parameter's
/// per-tensor sums (1) or another rank holds the same piece and counts it (0). Pieces that several
/// ranks hold alike -- a tensor every rank holds whole, a weight shard's slice that every replica
/// holds, a band of an unsplit tensor that every weight shard holds -- count on the lowest of
/// them. The counted pieces of each parameter must cover it once: pieces that overlap without
/// being equal are a lather::Error naming the parameter, the same on every rank (all decide from
/// the same all-gather).
inline std::vector<char> counted_pieces(const comm::Group& shards, const std::vector<ParameterSpec>& parameters) {
  const std::size_t n = parameters.size();
  std::vector<std::uint64_t> mine(2 * n);
  for (std::size_t p = 0; p < n; ++p) {
    const auto& spec = parameters[p];
    ::lather::Impl::Fnv1a piece;
    piece.add(std::uint64_t(spec.split_axis + 1)).add(std::uint64_t(spec.split_offset));
    piece.add(std::uint64_t(spec.row_offset)).add(std::uint64_t(spec.band_of_whole));
    for (auto d : spec.shape) piece.add(std::uint64_t(d));
    mine[2 * p] = piece.value();
    mine[2 * p + 1] = std::uint64_t(element_count(spec.shape));
  }
  const int ranks = shards.size();
  std::vector<std::uint64_t> all(2 * n * std::size_t(ranks));
  shards.allgather(mine.data(), 2 * n, all.data());
  const auto at = [&](int r, std::size_t p, int k) { return all[std::size_t(r) * 2 * n + 2 * p + std::size_t(k)]; };
  std::vector<char> counted(n, 1);
  for (std::size_t p = 0; p < n; ++p) {
    std::uint64_t covered = 0;
    for (int r = 0; r < ranks; ++r) {
      bool first = true;
      for (int q = 0; q < r && first; ++q) first = at(q, p, 0) != at(r, p, 0);
      if (first) covered += at(r, p, 1);
      if (r == shards.rank()) counted[p] = first ? 1 : 0;
    }
    const auto total = std::uint64_t(element_count(parameters[p].global()));
    LATHER_REQUIRE(covered == total, "the ranks' pieces of parameter '", parameters[p].name, "' hold ", covered,
                   " elements of its ", total, " (pieces that overlap without being equal, or missing)");
  }
  return counted;
}

}  // namespace lather::optim::Impl
