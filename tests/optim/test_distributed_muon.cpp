// Muon on a group of ranks gives bit for bit the parameters one rank computes alone: each rank
// orthogonalizes its share of the matrices and one all-gather per step brings every rank every
// new value. The gathered momentum (state_arrays) equals the single-rank optimizer's and restores
// a fresh distributed optimizer exactly; a failure in one rank's share is an error on every rank.
// Every rank computes the single-rank reference itself (comm::Group() is one process).
#include <lather/comm/group.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/optim/muon.hpp>

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

/// More matrices than ranks at 1-4 ranks, fewer at 8 (ranks without a matrix still join the
/// all-gather); tall, wide, square and flattened 3-D/4-D shapes, AdamW parameters, one forced.
std::vector<ParameterSpec> specs() {
  return {{"bias", {9}},     {"dense", {20, 12}}, {"conv", {3, 3, 4, 6}}, {"wide", {8, 16}},
          {"tall", {32, 5}}, {"scale", {}},       {"square", {10, 10}},   {"embedding", {12, 4}}};
}

MuonOptions options() {
  MuonOptions o;
  o.learning_rate = LearningRateSchedule::cosine(0.03, 2, 10, 0.001);
  o.weight_decay = 0.01;
  o.adam_weight_decay = 0.02;
  o.adamw_parameters = {"embedding"};
  return o;
}

void set_gradients(const ParameterList<float, Mem>& params, int t) {
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto x = params.host_value(Space(), p);
    std::vector<float> g(x.size());
    for (std::size_t k = 0; k < g.size(); ++k)
      g[k] = float(0.1 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
    Kokkos::deep_copy(params.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
  }
}

ParameterList<float, Mem> initial_parameters() {
  ParameterList<float, Mem> params(Space(), specs());
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(params.value(p).extent(0));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(std::cos(0.23 * double(k + 1) + 0.7 * double(p)));
    params.set_value(Space(), p, v);
  }
  return params;
}

void run(Muon<Space, float>& muon, const ParameterList<float, Mem>& params, int first, int steps) {
  for (int t = first; t < first + steps; ++t) {
    set_gradients(params, t);
    muon.step(Space(), params);
  }
}

using test::fill_state;
using test::state_bytes;

TEST(DistributedMuon, EqualsOneRankAndRestores) {
  const comm::Group world(MPI_COMM_WORLD);
  auto alone = initial_parameters(), shared = initial_parameters();
  Muon<Space, float> single(Space(), alone, options());
  Muon<Space, float> distributed(Space(), shared, options(), world);
  EXPECT_EQ(distributed.distributed(), world.size() > 1);
  run(single, alone, 0, 7);
  run(distributed, shared, 0, 7);
  for (std::size_t p = 0; p < alone.size(); ++p)
    EXPECT_EQ(shared.host_value(Space(), p), alone.host_value(Space(), p)) << alone.spec(p).name << " after 7 steps";

  // The gathered state is the single-rank state, on every rank.
  const auto want = single.state_arrays(Space());
  const auto got = distributed.state_arrays(Space());
  ASSERT_EQ(got.size(), want.size());
  std::vector<std::vector<char>> saved;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    // State shaped like a parameter is written by every rank, a share each; the rest by rank 0.
    EXPECT_EQ(got[i].writer, got[i].parameter >= 0 || world.rank() == 0) << got[i].name;
    saved.push_back(state_bytes(got[i]));
    EXPECT_EQ(saved.back(), state_bytes(want[i])) << got[i].name;
  }
  distributed.state_released();

  // Restored into a fresh distributed optimizer, it goes on as the single-rank one.
  auto restored_params = initial_parameters();
  for (std::size_t p = 0; p < alone.size(); ++p) restored_params.set_value(Space(), p, shared.host_value(Space(), p));
  Muon<Space, float> restored(Space(), restored_params, options(), world);
  fill_state(restored.state_arrays(Space()), saved);
  restored.state_restored(Space(), 7);
  run(single, alone, 7, 5);
  run(restored, restored_params, 7, 5);
  for (std::size_t p = 0; p < alone.size(); ++p)
    EXPECT_EQ(restored_params.host_value(Space(), p), alone.host_value(Space(), p))
        << alone.spec(p).name << " after restoring and 5 more steps";
}

TEST(DistributedMuon, SharesTheWork) {
  const comm::Group world(MPI_COMM_WORLD);
  Muon<Space, float> muon(Space(), specs(), options(), world);
  std::vector<double> load(std::size_t(world.size()), 0.0);
  int matrices = 0;
  for (const auto& plan : muon.plan())
    if (plan.matrix) load[std::size_t(plan.owner)] += plan.cost(), ++matrices;
  EXPECT_EQ(matrices, 5);  // dense, conv, wide, tall, square
  // LPT: no rank carries more than the largest matrix on top of the average.
  double total = 0, largest = 0;
  for (const auto& plan : muon.plan()) total += plan.cost(), largest = std::max(largest, plan.cost());
  for (double l : load) EXPECT_LE(l, total / world.size() + largest);
  // Momentum only for the own matrices: the local bytes shrink with the group.
  std::int64_t own = 0;
  const auto all = specs();
  for (std::size_t p = 0; p < all.size(); ++p)
    own += element_count(all[p].shape) * (muon.plan()[p].matrix ? (muon.plan()[p].owner == world.rank()) : 2);
  EXPECT_EQ(muon.memory_report().local_bytes, own * std::int64_t(sizeof(float)));
}

TEST(DistributedMuon, FailureInOneShareIsAnErrorEverywhere) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  auto params = initial_parameters();
  Muon<Space, float> muon(Space(), params, options(), world);
  // The hook cannot capture: it reads this rank's number from a static.
  static bool this_rank_fails;
  this_rank_fails = world.rank() == 1;
  ::lather::Impl::set_fault_hook([](const char* point) {
    if (this_rank_fails && std::string(point) == "muon.distributed_step") throw std::runtime_error("injected failure");
  });
  set_gradients(params, 0);
  try {
    muon.step(Space(), params);
    ADD_FAILURE() << "no error on rank " << world.rank();
  } catch (const lather::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Muon::step 0"), std::string::npos) << what;
    EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
  }
  ::lather::Impl::set_fault_hook(nullptr);
}

TEST(DistributedMuon, DifferentParametersAreRefused) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  auto s = specs();
  if (world.rank() == world.size() - 1) s[1].shape = {20, 11};
  try {
    Muon<Space, float> muon(Space(), s, options(), world);
    ADD_FAILURE() << "accepted on rank " << world.rank();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("other parameters"), std::string::npos) << e.what();
  }
}

}  // namespace
