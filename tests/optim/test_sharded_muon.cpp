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

#include "common/pieces.hpp"
#include "common/row_bands.hpp"
#include "common/state_bytes.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
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

using Problem = test::BandedProblem<Mem>;

/// Rows shared out one by one; a scalar and `held_everywhere` whole on every rank.
std::vector<test::RowBand> bands_of(const comm::Group& group) {
  return test::row_bands(group, whole_specs(), std::vector<std::int64_t>(whole_specs().size(), 1), {held_everywhere});
}

void run(Muon<Space, float>& alone, ShardedMuon<Space, float>& sharded, const Problem& r, int first, int steps) {
  for (int t = first; t < first + steps; ++t) {
    r.set_gradients(t);
    alone.step(Space(), r.whole);
    sharded.step(Space(), r.mine);
  }
}

TEST(ShardedMuon, EqualsMuonOnTheWholeParametersAndRestores) {
  const comm::Group world(MPI_COMM_WORLD);
  const Problem r(whole_specs(), bands_of(world));
  Muon<Space, float> alone(Space(), r.whole, options());
  ShardedMuon<Space, float> sharded(Space(), r.mine.specs(), options(), world);
  run(alone, sharded, r, 0, 7);
  r.expect_rows_equal("after 7 steps");

  // Its arrays are this rank's rows of Muon's, named alike.
  const auto want = alone.state_arrays(Space());
  const auto got = sharded.state_arrays(Space());
  ASSERT_EQ(got.size(), want.size());
  std::vector<std::vector<char>> saved;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    saved.push_back(test::state_bytes(got[i]));
    auto expected = test::state_bytes(want[i]);
    if (want[i].parameter >= 0) expected = r.rows_of_bytes(expected, std::size_t(want[i].parameter));
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
  r.expect_rows_equal("after restoring and 5 more steps");
}

/// The pieces weight shards and sharded parameters give Muon together: the ranks are replicas x
/// shards (shard = rank % shards, two shards on an even group); a matrix's columns (axis 1) are
/// cut over the shards and each slice's rows over the replicas (pieces cut along two axes, some
/// without rows); "tall" is cut over the shards only, so every replica holds its shard's slice (a
/// piece several ranks hold alike); "dense" is cut in rows over every rank; the scalar and
/// `held_everywhere` are whole; the bias is cut over the shards.
test::PieceProblem<Mem> muon_pieces(const comm::Group& group) {
  const int shards = group.size() % 2 == 0 ? 2 : 1, replicas = group.size() / shards;
  const int shard = group.rank() % shards, replica = group.rank() / shards;
  std::vector<test::Cut> cuts;
  for (const auto& spec : whole_specs()) {
    if (spec.shape.empty() || spec.name == held_everywhere)
      cuts.push_back(test::Cut::whole());
    else if (spec.name == "dense")
      cuts.push_back(test::Cut::band(group.rank(), group.size(), 1));
    else if (spec.shape.size() == 1)
      cuts.push_back(test::Cut::slice(0, shard, shards));
    else if (spec.name == "tall")
      cuts.push_back(test::Cut::slice(1, shard, shards));
    else
      cuts.push_back(test::Cut::slice(1, shard, shards).rows_of(replica, replicas, 1));
  }
  return test::PieceProblem<Mem>(whole_specs(), cuts);
}

// On the pieces of weight shards and sharded parameters together, ShardedMuon steps as Muon does on
// the whole parameters, bit for bit, and its state arrays are its pieces of Muon's.
TEST(ShardedMuon, EqualsMuonOnPiecesCutAlongTwoAxes) {
  const comm::Group world(MPI_COMM_WORLD);
  const auto r = muon_pieces(world);
  Muon<Space, float> alone(Space(), r.whole, options());
  ShardedMuon<Space, float> sharded(Space(), r.mine.specs(), options(), world);
  for (int t = 0; t < 7; ++t) {
    r.set_gradients(t);
    alone.step(Space(), r.whole);
    sharded.step(Space(), r.mine);
  }
  r.expect_pieces_equal("after 7 steps");
  const auto want = alone.state_arrays(Space());
  const auto got = sharded.state_arrays(Space());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    if (want[i].parameter < 0) continue;
    const auto bytes = test::state_bytes(want[i]);
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    const auto piece = r.piece(values, std::size_t(want[i].parameter));
    std::vector<char> expected(piece.size() * sizeof(float));
    std::memcpy(expected.data(), piece.data(), expected.size());
    EXPECT_EQ(test::state_bytes(got[i]), expected) << got[i].name;
  }
}

TEST(ShardedMuon, AFailureAtAnOwnerIsAnErrorEverywhere) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  const Problem r(whole_specs(), bands_of(world));
  ShardedMuon<Space, float> sharded(Space(), r.mine.specs(), options(), world);
  // The hook cannot capture: it reads this rank's number from a static.
  static bool this_rank_fails;
  this_rank_fails = world.rank() == 1;
  ::lather::Impl::set_fault_hook([](const char* point) {
    if (this_rank_fails && std::string(point) == "muon.distributed_step") throw std::runtime_error("injected failure");
  });
  r.set_gradients(0);
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
  bands[1] = test::RowBand{0, 20 / world.size(), 12};  // every rank claims the first rows of "dense"
  try {
    ShardedMuon<Space, float> sharded(Space(), test::band_specs(whole_specs(), bands), options(), world);
    ADD_FAILURE() << "accepted on rank " << world.rank();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'dense' do not cover its 20 x 12 once"), std::string::npos) << e.what();
  }
}

}  // namespace
