#pragma once
// Pieces of whole parameters as weight shards and sharded parameters hand them to an optimizer: a
// weight shard's slice along an axis (ParameterSpec split_axis, split_offset), possibly with a band
// of its rows (row_offset); a band of rows of the whole tensor (band_of_whole); or the whole
// tensor. A problem holds the whole parameters and this rank's pieces of them, with the same values
// and gradients, for the tests that an optimizer on the pieces steps exactly as the optimizer on
// the whole parameters.
#include <lather/core/parameters.hpp>

#include "common/row_bands.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace lather::test {

/// How one parameter is cut for this rank: parts are shared out evenly in whole units of `unit`
/// indices, in part order.
struct Cut {
  enum class Kind { whole, band, slice } kind = Kind::whole;
  int axis = 0;  ///< a slice's split axis
  int part = 0, parts = 1;
  std::int64_t unit = 1;
  // A band of a slice's rows (a slice along axis > 0): its part of `row_parts`, in units of `row_unit` rows.
  int row_part = 0, row_parts = 1;
  std::int64_t row_unit = 1;

  static Cut whole() { return {}; }
  /// A band of rows of the whole tensor (comm::ParameterShards of a whole tensor).
  static Cut band(int part, int parts, std::int64_t unit) {
    Cut c;
    c.kind = Kind::band;
    c.part = part, c.parts = parts, c.unit = unit;
    return c;
  }
  /// A weight shard's slice along `axis`.
  static Cut slice(int axis, int part, int parts, std::int64_t unit = 1) {
    Cut c;
    c.kind = Kind::slice;
    c.axis = axis, c.part = part, c.parts = parts, c.unit = unit;
    return c;
  }
  /// This slice's band of rows.
  Cut rows_of(int part_of_rows, int parts_of_rows, std::int64_t unit_rows) const {
    Cut c = *this;
    c.row_part = part_of_rows, c.row_parts = parts_of_rows, c.row_unit = unit_rows;
    return c;
  }
};

/// [first, first + count) of n indices: part `part` of `parts`, in whole units.
inline std::pair<std::int64_t, std::int64_t> share_of(std::int64_t n, int part, int parts, std::int64_t unit) {
  const std::int64_t units = (n + unit - 1) / unit;
  const std::int64_t first = std::min(n, units * part / parts * unit);
  return {first, std::min(n, units * (part + 1) / parts * unit) - first};
}

/// The spec of a piece, and the ranges it holds of the whole tensor's dimensions.
struct PieceOf {
  ParameterSpec spec;
  std::vector<std::pair<std::int64_t, std::int64_t>> held;  // per dimension: [first, first + count)
};

inline PieceOf piece_of(ParameterSpec spec, const Cut& cut) {
  PieceOf out;
  for (auto d : spec.shape) out.held.push_back({0, d});
  if (cut.kind == Cut::Kind::whole || spec.shape.empty()) {
    out.spec = spec;
    return out;
  }
  const auto whole = spec.shape;
  spec.global_shape = whole;
  if (cut.kind == Cut::Kind::band) {
    const auto [first, rows] = share_of(whole[0], cut.part, cut.parts, cut.unit);
    spec.split_axis = 0;
    spec.split_offset = first;
    spec.band_of_whole = true;
    spec.shape[0] = rows;
    out.held[0] = {first, rows};
  } else {
    const auto axis = std::size_t(cut.axis);
    const auto [first, count] = share_of(whole[axis], cut.part, cut.parts, cut.unit);
    spec.split_axis = cut.axis;
    spec.split_offset = first;
    spec.shape[axis] = count;
    out.held[axis] = {first, count};
    if (cut.axis > 0 && cut.row_parts > 1) {
      const auto [row, rows] = share_of(whole[0], cut.row_part, cut.row_parts, cut.row_unit);
      spec.row_offset = row;
      spec.shape[0] = rows;
      out.held[0] = {row, rows};
    }
  }
  out.spec = spec;
  return out;
}

/// The whole parameters and this rank's pieces of them.
template <class MemorySpace>
struct PieceProblem {
  std::vector<PieceOf> cuts;
  ParameterList<float, MemorySpace> whole, mine;

  static std::vector<ParameterSpec> specs_of(const std::vector<PieceOf>& cuts) {
    std::vector<ParameterSpec> out;
    for (const auto& c : cuts) out.push_back(c.spec);
    return out;
  }
  static std::vector<PieceOf> cut_all(const std::vector<ParameterSpec>& specs, const std::vector<Cut>& cuts) {
    std::vector<PieceOf> out;
    for (std::size_t p = 0; p < specs.size(); ++p) out.push_back(piece_of(specs[p], cuts[p]));
    return out;
  }

  PieceProblem(const std::vector<ParameterSpec>& specs, const std::vector<Cut>& how)
      : cuts(cut_all(specs, how)),
        whole(Kokkos::DefaultExecutionSpace(), specs),
        mine(Kokkos::DefaultExecutionSpace(), specs_of(cuts)) {
    for (std::size_t p = 0; p < whole.size(); ++p) {
      const auto v = starting_values(whole.value(p).extent(0), p);
      whole.set_value(Kokkos::DefaultExecutionSpace(), p, v);
      mine.set_value(Kokkos::DefaultExecutionSpace(), p, piece(v, p));
    }
  }

  /// Parameter p's values (row-major, whole) cut to this rank's piece, row-major.
  template <class T>
  std::vector<T> piece(const std::vector<T>& values, std::size_t p) const {
    const auto& shape = whole.spec(p).shape;
    const auto& held = cuts[p].held;
    std::vector<T> out;
    if (shape.empty()) return values;
    std::vector<std::int64_t> index(shape.size(), 0);
    const std::int64_t total = element_count(shape);
    for (std::int64_t k = 0; k < total; ++k) {
      std::int64_t rest = k;
      bool inside = true;
      for (std::size_t d = shape.size(); d-- > 0;) {
        const std::int64_t i = rest % shape[d];
        rest /= shape[d];
        inside = inside && i >= held[d].first && i < held[d].first + held[d].second;
      }
      if (inside) out.push_back(values[std::size_t(k)]);
    }
    return out;
  }

  /// The whole gradients of step t, and this rank's pieces of them.
  void set_gradients(int t) const {
    for (std::size_t p = 0; p < whole.size(); ++p) {
      const auto g = step_gradient(whole.host_value(Kokkos::DefaultExecutionSpace(), p), t, p);
      Kokkos::deep_copy(whole.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
      const auto part = piece(g, p);
      Kokkos::deep_copy(mine.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(part.data(), part.size()));
    }
  }

  /// This rank's values equal its pieces of the whole values, bit for bit.
  void expect_pieces_equal(const std::string& when) const {
    for (std::size_t p = 0; p < whole.size(); ++p)
      EXPECT_EQ(mine.host_value(Kokkos::DefaultExecutionSpace(), p),
                piece(whole.host_value(Kokkos::DefaultExecutionSpace(), p), p))
          << whole.spec(p).name << " " << when;
  }
};

}  // namespace lather::test
