// Sharded parameters (ParameterShards) against plain references: the gathered values are the
// model's values bit for bit in every pass (prefetched or not), the owned gradients are the sum
// over ranks and passes (computed here in double) divided by the summed weight, the bands cover
// every row once; and its failures: a rank whose passes fail, a fault injected where a layer is
// asked for, a NaN in a summed gradient and a layout that differs are the same error on every
// rank, and nobody waits forever (ctest's timeout).
#include <lather/comm/parameter_shards.hpp>
#include <lather/core/fault_injection.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

using lather::ParameterSpec;
using lather::comm::ParameterShards;
using namespace lather::test;
using Shards = ParameterShards<Exec, float>;

// Layers of one to three tensors; a tensor of 2 rows leaves ranks without a row of it, a row of
// 300 elements is larger than some layers.
const std::vector<ParameterSpec> specs = {{"l0/kernel", {7, 5}},   {"l0/bias", {5}},        {"l1/scale", {3}},
                                          {"l2/kernel", {2, 300}}, {"l2/bias", {300}},      {"l3/kernel", {300, 4}},
                                          {"l3/bias", {4}},        {"l3/extra", {11, 2, 3}}};
const std::vector<Shards::Layer> layers = {{0, 2}, {2, 3}, {3, 5}, {5, 8}};

/// The layouts the tests run with: bands of any rows (the default), and units of every kind --
/// runs of rows with a shorter last one, whole tensors, replicated tensors, a costlier unit.
std::vector<lather::comm::ShardLayout> layouts_named(const std::string& name) {
  if (name == "rows") return {};
  lather::comm::ShardLayout whole_of_2{2}, whole_of_11{11}, replicated;
  replicated.replicated = true;
  return {{3}, {}, replicated, whole_of_2, {64}, {7, 100.0}, replicated, whole_of_11};
}

class Layouts : public ::testing::TestWithParam<std::string> {};

/// The model's values: the same on every rank (rank 0's inputs).
double value_of(std::size_t parameter, std::int64_t k) { return input_value(0, int(parameter), k, 7); }
/// Rank r's gradient of pass p.
double gradient_of(int rank, int pass, std::size_t parameter, std::int64_t k) {
  return input_value(rank, int(parameter), k, 100 + pass);
}

lather::TensorList<float, Memory> full_values(double shift = 0) {
  lather::TensorList<float, Memory> out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::vector<double> v(static_cast<std::size_t>(lather::element_count(specs[i].shape)));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = value_of(i, std::int64_t(k)) + shift;
    out.push_back(make_view<float>(v, specs[i].name));
  }
  return out;
}

/// Expects the gathered values of layer l to be the model's (+ shift) exactly.
void expect_layer_whole(const Shards& shards, std::size_t l, double shift, const std::string& where) {
  for (std::size_t i = layers[l].first; i < layers[l].last; ++i) {
    const auto got = read_view(shards.gathered().value(i));
    for (std::size_t k = 0; k < got.size(); ++k)
      ASSERT_EQ(got[k], double(float(value_of(i, std::int64_t(k))) + float(shift)))
          << where << ": parameter " << specs[i].name << " element " << k;
  }
}

/// One pass as a model runs it: forward needs, then per layer (last first) need, the gradient
/// written, ready. `stop_after`: the number of layer calls after which this rank's pass throws.
void run_pass(Shards& shards, int pass, double shift, int stop_after = -1) {
  const int rank = world_rank();
  int calls = 0;
  const auto count = [&] {
    if (calls++ == stop_after) throw lather::Error("backward failed", nullptr, 0);
  };
  for (std::size_t l = 0; l < layers.size(); ++l) {
    count();
    shards.need(Exec(), layers[l].first, layers[l].last);
    expect_layer_whole(shards, l, shift, "forward of pass " + std::to_string(pass));
  }
  for (std::size_t l = layers.size(); l-- > 0;) {
    count();
    shards.need(Exec(), layers[l].first, layers[l].last);
    expect_layer_whole(shards, l, shift, "backward of pass " + std::to_string(pass));
    for (std::size_t i = layers[l].first; i < layers[l].last; ++i) {
      std::vector<double> g(shards.gathered().gradient(i).extent(0));
      for (std::size_t k = 0; k < g.size(); ++k) g[k] = gradient_of(rank, pass, i, std::int64_t(k));
      Kokkos::deep_copy(shards.gathered().gradient(i), make_view<float>(g));
    }
    shards.ready(Exec(), layers[l].first, layers[l].last);
  }
}

template <class Work>
void expect_error(Work&& work, const std::string& needle) {
  try {
    work();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_P(Layouts, BandsCoverEveryRowOnceInWholeUnitsAndGatherTheValues) {
  const auto layouts = layouts_named(GetParam());
  Shards shards(Exec(), MPI_COMM_WORLD, specs, layers, layouts);
  const int n = world_size();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto [begin, end] = shards.band(i);
    const std::int64_t rows = specs[i].shape.front();
    if (!layouts.empty() && layouts[i].replicated) {
      EXPECT_TRUE(shards.replicated(i));
      EXPECT_EQ(begin, 0) << specs[i].name;
      EXPECT_EQ(end, rows) << specs[i].name;
      continue;
    }
    long held = long(end - begin);
    MPI_Allreduce(MPI_IN_PLACE, &held, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(held, rows) << specs[i].name;
    // Whole units.
    const std::int64_t unit = layouts.empty() ? 1 : std::min(layouts[i].unit_rows, rows);
    EXPECT_TRUE((begin % unit == 0 || begin == rows) && (end % unit == 0 || end == rows))
        << specs[i].name << " [" << begin << ", " << end << ")";
    // Bands follow each other in rank order.
    std::vector<long> begins(std::size_t(n) + 1);
    const long b = long(begin);
    MPI_Allgather(&b, 1, MPI_LONG, begins.data(), 1, MPI_LONG, MPI_COMM_WORLD);
    for (int r = 1; r < n; ++r) EXPECT_LE(begins[std::size_t(r - 1)], begins[std::size_t(r)]) << specs[i].name;
  }
  // Balanced as greedy longest-processing-time balances: the ranks' loads (units x unit cost, a
  // short last unit its rows' share) differ by at most the costliest unit.
  double load = 0, costliest = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (shards.replicated(i)) continue;
    const std::int64_t rows = specs[i].shape.front(), row_elements = lather::element_count(specs[i].shape) / rows;
    const std::int64_t unit = layouts.empty() ? 1 : std::min(layouts[i].unit_rows, rows);
    const double cost =
        !layouts.empty() && layouts[i].unit_cost > 0 ? layouts[i].unit_cost : double(unit * row_elements);
    const auto [begin, end] = shards.band(i);
    load += double(end - begin) / double(unit) * cost;
    costliest = std::max(costliest, cost);
  }
  std::vector<double> loads(static_cast<std::size_t>(n));
  MPI_Allgather(&load, 1, MPI_DOUBLE, loads.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  EXPECT_LE(*std::max_element(loads.begin(), loads.end()) - *std::min_element(loads.begin(), loads.end()), costliest);
  for (std::size_t k = 0; k < shards.owned().size(); ++k) {
    const auto i = shards.owned_index(k);
    EXPECT_EQ(shards.owned().spec(k).name, specs[i].name);
    EXPECT_EQ(shards.owned().spec(k).shape.front(), shards.band(i).second - shards.band(i).first);
  }
  // slices(): every parameter, a slice of the whole along its rows (but a replicated one).
  ASSERT_EQ(shards.slices().size(), specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& slice = shards.slices().spec(i);
    EXPECT_EQ(slice.global(), specs[i].shape) << specs[i].name;
    EXPECT_EQ(slice.split(), !shards.replicated(i)) << specs[i].name;
    if (slice.split()) {
      EXPECT_EQ(slice.split_offset, shards.band(i).first) << specs[i].name;
      EXPECT_EQ(slice.shape.front(), shards.band(i).second - shards.band(i).first) << specs[i].name;
    }
  }
  // The memory is the bands and one layer of each parity, values and gradients; a replicated
  // parameter's values are read where they are owned.
  const auto memory = shards.memory();
  std::int64_t owned = 0;
  for (std::size_t k = 0; k < shards.owned().size(); ++k) owned += std::int64_t(shards.owned().value(k).extent(0));
  EXPECT_EQ(memory.owned_values, owned * 4);
  // Layers of 40, 3, 900 and 1270 elements: the even ones' buffer holds 900, the odd ones' 1270
  // (values: 1266 without the replicated l3/bias).
  const std::int64_t odd_values = layouts.empty() ? 1270 : 1266;
  EXPECT_EQ(memory.gather_values, (900 + odd_values) * 4);
  EXPECT_EQ(memory.gather_gradients, (900 + 1270) * 4);
  EXPECT_EQ(memory.total(), 2 * owned * 4 + (2 * 900 + odd_values + 1270) * 4);

  const auto full = full_values();
  shards.scatter_values(Exec(), full);
  const auto back = full_values(1000.0);  // overwritten entirely
  shards.gather_values(Exec(), back);
  for (std::size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(read_view(back[i]), read_view(full[i])) << specs[i].name;
  // Evaluation: forward passes outside a step, a rank without data taking part all the same.
  for (int round = 0; round < 2; ++round) {
    if (world_rank() == 1 && round == 1) {
      shards.forward_without_data(Exec());
      continue;
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      shards.need(Exec(), layers[l].first, layers[l].last);
      expect_layer_whole(shards, l, 0, "evaluation");
    }
  }
}

TEST_P(Layouts, OwnedGradientsAreTheWeightedMeanOverRanksAndPasses) {
  const int n = world_size(), rank = world_rank();
  Shards shards(Exec(), MPI_COMM_WORLD, specs, layers, layouts_named(GetParam()));
  shards.scatter_values(Exec(), full_values());
  for (int step = 0; step < 2; ++step) {
    // Step 1 runs after an update of every owned value (+1): the buffers were refilled.
    const double shift = step;
    const int passes = 3;
    // Rank 1 has no samples in pass 2 (a replica whose share of a micro-batch is empty).
    const auto without = [&](int pass) { return n > 1 && rank == 1 && pass == 2; };
    shards.start_step(Exec(), passes);
    for (int pass = 0; pass < passes; ++pass) {
      if (without(pass))
        shards.pass_without_data(Exec());
      else
        run_pass(shards, pass, shift);
    }
    const double weight = shards.finish_step(Exec(), double(rank + 1), "");
    EXPECT_EQ(weight, double(n * (n + 1) / 2));
    // Every term is in [-1, 1) and a float sum of m such terms is within m^2 2^-24 of the exact
    // sum (each of m additions rounds a partial sum of at most m by 2^-24 relative); m <= 3n.
    const int m = 3 * n;
    const double tolerance = double(m) * m * 0x1.0p-24 / weight;
    for (std::size_t k = 0; k < shards.owned().size(); ++k) {
      const auto i = shards.owned_index(k);
      const std::int64_t first =
          shards.band(i).first * (lather::element_count(specs[i].shape) / specs[i].shape.front());
      const auto got = read_view(shards.owned().gradient(k));
      for (std::size_t j = 0; j < got.size(); ++j) {
        double sum = 0;
        for (int r = 0; r < n; ++r)
          for (int pass = 0; pass < passes; ++pass)
            if (!(n > 1 && r == 1 && pass == 2)) sum += gradient_of(r, pass, i, first + std::int64_t(j));
        ASSERT_NEAR(got[j], sum / weight, tolerance) << specs[i].name << " element " << first + std::int64_t(j);
      }
    }
    // The optimizer's update, as an optimizer makes it: the owned values change in place.
    for (std::size_t k = 0; k < shards.owned().size(); ++k) {
      const auto v = shards.owned().value(k);
      Kokkos::parallel_for(
          Kokkos::RangePolicy<Exec>(0, v.extent(0)), KOKKOS_LAMBDA(std::int64_t j) { v(j) += 1.0f; });
    }
    Kokkos::fence();
    shards.values_changed();
  }
}

INSTANTIATE_TEST_SUITE_P(ParameterShards, Layouts, ::testing::Values("rows", "units"));

void throw_where_a_layer_is_needed_on_the_last_rank(const char* point) {
  static int calls = 0;
  if (std::strcmp(point, "parameter_shards.need") == 0 && world_rank() == world_size() - 1 && ++calls == 6)
    throw lather::Error("injected failure in a layer", nullptr, 0);
}

TEST(ParameterShards, AFailureOnOneRankIsAnErrorOnEveryRankAndTheNextStepRuns) {
  const int n = world_size(), rank = world_rank();
  const std::string where = n > 1 ? " (on group rank " + std::to_string(n - 1) : "";
  Shards shards(Exec(), MPI_COMM_WORLD, specs, layers);
  shards.scatter_values(Exec(), full_values());
  const auto step = [&](int stop_after, const std::function<void()>& before_finish) {
    shards.start_step(Exec(), 2);
    const std::string failure = lather::Impl::local_failure(nullptr, [&] {
      for (int pass = 0; pass < 2; ++pass) run_pass(shards, pass, 0, pass == 1 ? stop_after : -1);
    });
    if (before_finish) before_finish();
    return shards.finish_step(Exec(), 1.0, failure);
  };
  // The last rank's second pass fails in its backward.
  expect_error([&] { step(rank == n - 1 ? 5 : -1, {}); }, "backward failed" + where);
  // A fault injected where the last rank asks for a layer.
  lather::Impl::set_fault_hook(&throw_where_a_layer_is_needed_on_the_last_rank);
  expect_error([&] { step(-1, {}); }, "injected failure in a layer" + where);
  lather::Impl::set_fault_hook(nullptr);
  // A NaN in the last rank's gradient of l3/kernel: every rank names it (the owner of the rows
  // holding the NaN finds it).
  expect_error(
      [&] {
        shards.start_step(Exec(), 1);
        for (std::size_t l = 0; l < layers.size(); ++l) shards.need(Exec(), layers[l].first, layers[l].last);
        for (std::size_t l = layers.size(); l-- > 0;) {
          shards.need(Exec(), layers[l].first, layers[l].last);
          for (std::size_t i = layers[l].first; i < layers[l].last; ++i)
            Kokkos::deep_copy(shards.gathered().gradient(i), 0.5f);
          if (l == 3 && rank == n - 1)
            Kokkos::deep_copy(Kokkos::subview(shards.gathered().gradient(5), std::make_pair(0, 1)), std::nanf(""));
          shards.ready(Exec(), layers[l].first, layers[l].last);
        }
        shards.finish_step(Exec(), 1.0, "");
      },
      "the summed gradient of 'l3/kernel' holds 1 NaN or Inf values in its rows [0, ");
  // An evaluation round whose pass fails on the last rank before its first layer, then one that
  // fails after it: every rank reports it, and the next round's gathers line up.
  for (std::size_t stop : {std::size_t(0), std::size_t(2)}) {
    std::string failure;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (rank == n - 1 && l == stop) {
        failure = "evaluation failed";
        break;
      }
      shards.need(Exec(), layers[l].first, layers[l].last);
    }
    expect_error([&] { shards.finish_forward(Exec(), failure); }, "evaluation failed" + where);
  }
  for (std::size_t l = 0; l < layers.size(); ++l) shards.need(Exec(), layers[l].first, layers[l].last);
  shards.finish_forward(Exec(), "");
  // Then a step runs as if nothing had happened.
  EXPECT_EQ(step(-1, {}), double(n));
}

TEST(ParameterShards, ALayoutThatDiffersIsAnErrorOnEveryRank) {
  auto mine = specs;
  if (world_rank() == world_size() - 1) mine[3].shape = {3, 300};
  if (world_size() > 1)  // one rank: its layout is rank 0's
    expect_error([&] { Shards(Exec(), MPI_COMM_WORLD, mine, layers); }, "differ from group rank 0's");
  expect_error([&] { Shards(Exec(), MPI_COMM_WORLD, specs, {{0, 2}, {2, 5}}); }, "the layers cover 5 of the 8");
}

// A band of rows of each kind of spec, checked field by field: of a whole tensor (read as the
// whole), of a weight shard's row slice (the same global tensor), of a column slice (a piece cut
// along two axes) and of a spec split along columns by one shard (the whole tensor).
TEST(BandOf, KeepsTheGlobalTensorAndTheCutsOfEachKindOfSpec) {
  const ParameterSpec whole{"w", {8, 6}};
  ParameterSpec band = lather::comm::band_of(whole, 2, 5);
  EXPECT_EQ(band.shape, (lather::TensorShape{3, 6}));
  EXPECT_TRUE(band.band_of_whole && band.split_axis == 0 && band.split_offset == 2);
  EXPECT_EQ(band.global(), whole.shape);

  ParameterSpec rows{"r", {4, 6}};  // rows [4, 8) of [8, 6]
  rows.split_axis = 0, rows.split_offset = 4, rows.global_shape = {8, 6};
  band = lather::comm::band_of(rows, 1, 3);
  EXPECT_TRUE(!band.band_of_whole && band.split_axis == 0 && band.split_offset == 5);
  EXPECT_EQ(band.global(), rows.global_shape);

  ParameterSpec columns{"c", {8, 3}};  // columns [3, 6) of [8, 6]
  columns.split_axis = 1, columns.split_offset = 3, columns.global_shape = {8, 6};
  band = lather::comm::band_of(columns, 2, 6);
  EXPECT_TRUE(!band.band_of_whole && band.split_axis == 1 && band.split_offset == 3 && band.row_offset == 2);
  EXPECT_EQ(band.shape, (lather::TensorShape{4, 3}));
  EXPECT_TRUE(band.row_band());
  EXPECT_NO_THROW(band.validate());
  EXPECT_FALSE(lather::comm::band_of(columns, 0, 8).row_band());  // every row: the slice itself

  ParameterSpec one_shard{"o", {8, 6}};  // split along columns over one shard: the whole
  one_shard.split_axis = 1, one_shard.global_shape = {8, 6};
  band = lather::comm::band_of(one_shard, 2, 6);
  EXPECT_TRUE(band.band_of_whole && band.split_axis == 0 && band.split_offset == 2 && band.row_offset == 0);

  // Rows outside the tensor, and a row offset without a later split axis, are refused.
  ParameterSpec bad = lather::comm::band_of(columns, 2, 6);
  bad.row_offset = 5;
  EXPECT_THROW(bad.validate(), lather::Error);
  bad = lather::comm::band_of(rows, 1, 3);
  bad.row_offset = 1;
  EXPECT_THROW(bad.validate(), lather::Error);
}

}  // namespace
