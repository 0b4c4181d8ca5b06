#pragma once
// Bands of rows of whole parameters spread over the ranks of a group, as
// comm::ParameterShards::slices() hands them to an optimizer (a slice along axis 0 of the whole
// tensor, possibly without rows, or the whole tensor), and a problem that holds both the whole
// parameters and this rank's rows of them, with the same values and gradients: for the tests that
// an optimizer on the bands steps exactly as the optimizer on the whole parameters.
#include <lather/comm/group.hpp>
#include <lather/core/parameters.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

namespace lather::test {

/// The values the banded and pieced problems start from: parameter p's n values.
inline std::vector<float> starting_values(std::size_t n, std::size_t p) {
  std::vector<float> v(n);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(std::cos(0.23 * double(k + 1) + 0.7 * double(p)));
  return v;
}

/// The whole gradient of parameter p at step t, from its values x.
inline std::vector<float> step_gradient(const std::vector<float>& x, int t, std::size_t p) {
  std::vector<float> g(x.size());
  for (std::size_t k = 0; k < g.size(); ++k)
    g[k] = float(0.1 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
  return g;
}

struct RowBand {
  std::int64_t first = 0, rows = 0, row_elements = 1;
};

/// This rank's rows of each parameter: whole units of unit_rows[p] rows shared out evenly in
/// rank order (a scalar, and the parameters named in `everywhere`, whole on every rank).
inline std::vector<RowBand> row_bands(const comm::Group& group, const std::vector<ParameterSpec>& whole,
                                      const std::vector<std::int64_t>& unit_rows,
                                      const std::set<std::string>& everywhere = {}) {
  std::vector<RowBand> bands;
  for (std::size_t p = 0; p < whole.size(); ++p) {
    const auto& spec = whole[p];
    RowBand b;
    const std::int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
    b.row_elements = element_count(spec.shape) / std::max<std::int64_t>(rows, 1);
    if (spec.shape.empty() || everywhere.count(spec.name)) {
      b.rows = rows;
    } else {
      const std::int64_t unit = unit_rows[p], units = (rows + unit - 1) / unit;
      b.first = std::min(rows, units * group.rank() / group.size() * unit);
      b.rows = std::min(rows, units * (group.rank() + 1) / group.size() * unit) - b.first;
    }
    bands.push_back(b);
  }
  return bands;
}

/// The specs of the bands, as comm::band_of gives them: every tensor's a slice along axis 0 of the
/// whole (all of its rows, some, or none); a scalar as it is.
inline std::vector<ParameterSpec> band_specs(std::vector<ParameterSpec> specs, const std::vector<RowBand>& bands) {
  for (std::size_t p = 0; p < specs.size(); ++p) {
    if (specs[p].shape.empty()) continue;
    specs[p].global_shape = specs[p].shape;
    specs[p].split_axis = 0;
    specs[p].split_offset = bands[p].first;
    specs[p].band_of_whole = true;
    specs[p].shape[0] = bands[p].rows;
  }
  return specs;
}

inline std::vector<float> rows_of(const std::vector<float>& whole, const RowBand& b) {
  return std::vector<float>(whole.begin() + b.first * b.row_elements,
                            whole.begin() + (b.first + b.rows) * b.row_elements);
}

/// The whole parameters and this rank's rows of them.
template <class MemorySpace>
struct BandedProblem {
  ParameterList<float, MemorySpace> whole, mine;
  std::vector<RowBand> bands;

  BandedProblem(const std::vector<ParameterSpec>& specs, std::vector<RowBand> rows)
      : whole(Kokkos::DefaultExecutionSpace(), specs),
        mine(Kokkos::DefaultExecutionSpace(), band_specs(specs, rows)),
        bands(std::move(rows)) {
    for (std::size_t p = 0; p < whole.size(); ++p) {
      const auto v = starting_values(whole.value(p).extent(0), p);
      whole.set_value(Kokkos::DefaultExecutionSpace(), p, v);
      mine.set_value(Kokkos::DefaultExecutionSpace(), p, rows_of(v, bands[p]));
    }
  }
  /// The whole gradients of step t, and this rank's rows of them.
  void set_gradients(int t) const {
    for (std::size_t p = 0; p < whole.size(); ++p) {
      const auto g = step_gradient(whole.host_value(Kokkos::DefaultExecutionSpace(), p), t, p);
      Kokkos::deep_copy(whole.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
      const auto part = rows_of(g, bands[p]);
      Kokkos::deep_copy(mine.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(part.data(), part.size()));
    }
  }
  /// This rank's values equal its rows of the whole values, bit for bit.
  void expect_rows_equal(const std::string& when) const {
    for (std::size_t p = 0; p < whole.size(); ++p)
      EXPECT_EQ(mine.host_value(Kokkos::DefaultExecutionSpace(), p),
                rows_of(whole.host_value(Kokkos::DefaultExecutionSpace(), p), bands[p]))
          << whole.spec(p).name << " " << when;
  }
  /// An array of the whole optimizer's state cut to this rank's rows (parameter p's, row_bytes a row).
  std::vector<char> rows_of_bytes(const std::vector<char>& bytes, std::size_t p) const {
    const auto& b = bands[p];
    const std::size_t row =
        bytes.size() / std::size_t(std::max<std::int64_t>(whole.spec(p).shape.empty() ? 1 : whole.spec(p).shape[0], 1));
    return std::vector<char>(bytes.begin() + std::ptrdiff_t(std::size_t(b.first) * row),
                             bytes.begin() + std::ptrdiff_t(std::size_t(b.first + b.rows) * row));
  }
};

}  // namespace lather::test
