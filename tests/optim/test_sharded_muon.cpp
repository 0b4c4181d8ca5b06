// ShardedMuon on bands of rows spread over the ranks (as comm::ParameterShards::slices() gives
// them: some ranks without rows of a small matrix, a scalar and one matrix whole on every rank)
// gives bit for bit the parameters Muon computes on one rank from the whole gradients: the
// momentum and AdamW are elementwise, and each matrix's owner orthogonalizes exactly the matrix
// one rank would. Its state is this rank's rows of Muon's arrays and restores a fresh optimizer
// exactly; a failure at an owner and bands that do not tile a matrix are errors on every rank.
// Every rank computes the single-rank reference itself (comm::Group() is one process).
#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/sharded_muon.hpp>

#include "common/state_bytes.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <stdexcept>

namespace {

using namespace lather;
using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

/// Tall, wide, square and flattened 4-D matrices, one with fewer rows than 4 and 8 ranks, AdamW
/// parameters (a bias, a scalar, a forced matrix).
std::vector<ParameterSpec> whole_specs() {
  return {{"bias", {9}}, {"dense", {20, 12}}, {"conv", {3, 3, 4, 6}}, {"wide", {8, 16}},     {"tall", {32, 5}},
          {"scale", {}}, {"tiny", {3, 7}},    {"square", {10, 10}},   {"embedding", {12, 4}}};
}
const std::string held_everywhere = "square";

MuonOptions options() {
  MuonOptions o;
  o.learning_rate = LearningRateSchedule::cosine(0.03, 2, 10, 0.001);
  o.weight_decay = 0.01;
  o.adam_weight_decay = 0.02;
  o.adamw_parameters = {"embedding"};
  return o;
}

/// This rank's rows [first, first + rows) of each parameter: an even share, a scalar and
/// `held_everywhere` whole.
struct Band {
  std::int64_t first = 0, rows = 0, row_elements = 1;
};
std::vector<Band> bands_of(const comm::Group& group) {
  std::vector<Band> bands;
  for (const auto& spec : whole_specs()) {
    Band b;
    const std::int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
    b.row_elements = element_count(spec.shape) / std::max<std::int64_t>(rows, 1);
    if (spec.shape.empty() || spec.name == held_everywhere) {
      b.rows = rows;
    } else {
      b.first = rows * group.rank() / group.size();
      b.rows = rows * (group.rank() + 1) / group.size() - b.first;
    }
    bands.push_back(b);
  }
  return bands;
}
std::vector<ParameterSpec> band_specs(const std::vector<Band>& bands) {
  auto specs = whole_specs();
  for (std::size_t p = 0; p < specs.size(); ++p) {
    if (specs[p].shape.empty() || bands[p].rows == specs[p].shape[0]) continue;
    specs[p].global_shape = specs[p].shape;
    specs[p].split_axis = 0;
    specs[p].split_offset = bands[p].first;
    specs[p].shape[0] = bands[p].rows;
  }
  return specs;
}

std::vector<float> rows_of(const std::vector<float>& whole, const Band& b) {
  return std::vector<float>(whole.begin() + b.first * b.row_elements,
                            whole.begin() + (b.first + b.rows) * b.row_elements);
}

/// The whole gradients of step t, and this rank's rows of them.
void set_gradients(const ParameterList<float, Mem>& whole, const ParameterList<float, Mem>& mine,
                   const std::vector<Band>& bands, int t) {
  for (std::size_t p = 0; p < whole.size(); ++p) {
    const auto x = whole.host_value(Space(), p);
    std::vector<float> g(x.size());
    for (std::size_t k = 0; k < g.size(); ++k)
      g[k] = float(0.1 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
    Kokkos::deep_copy(whole.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
    const auto part = rows_of(g, bands[p]);
    Kokkos::deep_copy(mine.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(part.data(), part.size()));
  }
}

struct Runs {
  ParameterList<float, Mem> whole, mine;
  std::vector<Band> bands;
};
Runs initial(const comm::Group& group) {
  Runs r{ParameterList<float, Mem>(Space(), whole_specs()), {}, bands_of(group)};
  r.mine = ParameterList<float, Mem>(Space(), band_specs(r.bands));
  for (std::size_t p = 0; p < r.whole.size(); ++p) {
    std::vector<float> v(r.whole.value(p).extent(0));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(std::cos(0.23 * double(k + 1) + 0.7 * double(p)));
    r.whole.set_value(Space(), p, v);
    r.mine.set_value(Space(), p, rows_of(v, r.bands[p]));
  }
  return r;
}

void run(Muon<Space, float>& alone, ShardedMuon<Space, float>& sharded, Runs& r, int first, int steps) {
  for (int t = first; t < first + steps; ++t) {
    set_gradients(r.whole, r.mine, r.bands, t);
    alone.step(Space(), r.whole);
    sharded.step(Space(), r.mine);
  }
}

void expect_rows_equal(const Runs& r, const std::string& when) {
  for (std::size_t p = 0; p < r.whole.size(); ++p)
    EXPECT_EQ(r.mine.host_value(Space(), p), rows_of(r.whole.host_value(Space(), p), r.bands[p]))
        << r.whole.spec(p).name << " " << when;
}

TEST(ShardedMuon, EqualsMuonOnTheWholeParametersAndRestores) {
  const comm::Group world(MPI_COMM_WORLD);
  auto r = initial(world);
  Muon<Space, float> alone(Space(), r.whole, options());
  ShardedMuon<Space, float> sharded(Space(), r.mine.specs(), options(), world);
  run(alone, sharded, r, 0, 7);
  expect_rows_equal(r, "after 7 steps");

  // Its arrays are this rank's rows of Muon's, named alike.
  const auto want = alone.state_arrays(Space());
  const auto got = sharded.state_arrays(Space());
  ASSERT_EQ(got.size(), want.size());
  std::vector<std::vector<char>> saved;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    saved.push_back(test::state_bytes(got[i]));
    auto expected = test::state_bytes(want[i]);
    if (want[i].parameter >= 0) {
      const auto& b = r.bands[std::size_t(want[i].parameter)];
      const std::size_t row = std::size_t(b.row_elements) * sizeof(float);
      expected = std::vector<char>(expected.begin() + std::ptrdiff_t(std::size_t(b.first) * row),
                                   expected.begin() + std::ptrdiff_t(std::size_t(b.first + b.rows) * row));
    }
    EXPECT_EQ(saved.back(), expected) << got[i].name;
  }
  // The state is 1/P of the matrices' momentum: this rank's rows only.
  std::int64_t rows_held = 0;
  for (std::size_t p = 0; p < r.mine.size(); ++p)
    rows_held += element_count(r.mine.spec(p).shape) * (sharded.plan()[p].matrix ? 1 : 2);
  EXPECT_EQ(sharded.memory_report().local_bytes, rows_held * std::int64_t(sizeof(float)));

  // Restored into a fresh optimizer, it goes on as Muon does.
  ShardedMuon<Space, float> restored(Space(), r.mine.specs(), options(), world);
  test::fill_state(restored.state_arrays(Space()), saved);
  restored.state_restored(Space(), 7);
  run(alone, restored, r, 7, 5);
  expect_rows_equal(r, "after restoring and 5 more steps");
}

TEST(ShardedMuon, AFailureAtAnOwnerIsAnErrorEverywhere) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  auto r = initial(world);
  ShardedMuon<Space, float> sharded(Space(), r.mine.specs(), options(), world);
  // The hook cannot capture: it reads this rank's number from a static.
  static bool this_rank_fails;
  this_rank_fails = world.rank() == 1;
  ::lather::Impl::set_fault_hook([](const char* point) {
    if (this_rank_fails && std::string(point) == "muon.distributed_step") throw std::runtime_error("injected failure");
  });
  set_gradients(r.whole, r.mine, r.bands, 0);
  try {
    sharded.step(Space(), r.mine);
    ADD_FAILURE() << "no error on rank " << world.rank();
  } catch (const lather::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Muon::step 0"), std::string::npos) << what;
    EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
  }
  ::lather::Impl::set_fault_hook(nullptr);
}

TEST(ShardedMuon, BandsThatDoNotTileAMatrixAreRefused) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  auto bands = bands_of(world);
  bands[1] = Band{0, 20 / world.size(), 12};  // every rank claims the first rows of "dense"
  try {
    ShardedMuon<Space, float> sharded(Space(), band_specs(bands), options(), world);
    ADD_FAILURE() << "accepted on rank " << world.rank();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'dense' do not cover its 20 rows"), std::string::npos) << e.what();
  }
}

}  // namespace
