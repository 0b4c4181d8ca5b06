// A NaN or Inf in one rank's gradient is an error on every rank of the group before any state
// moves, for the optimizers that split their step over the ranks: Shampoo (step_mode
// distributed), SOAP and Muon. In turn for each parameter, rank 0's gradient holds one Inf; on
// more than one rank the blocks are spread over the ranks, so some of those parameters are updated
// by another rank only, whose share reads its own (finite) copy of the gradient: rank 0 never
// reads the Inf for its share. Every rank throws the same error naming the parameter, and the
// parameters and the state stay those of a twin optimizer that never saw the bad gradients: the
// gathered state arrays are equal byte for byte, and so are the parameters after one more, finite,
// step of both (the twin runs the same kernels on the same numbers). ctest's timeout catches a hang.
#include <lather/comm/group.hpp>
#include <lather/core/parameters.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/soap.hpp>

#include "common/host_copies.hpp"
#include "common/state_bytes.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace lather;
using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Parameters = ParameterList<float, Mem>;
using Optimizer = optim::Optimizer<Space, float>;

/// Matrices (blocked at 8), a 4-D kernel, vectors and a scalar: more blocks than ranks up to 8,
/// small enough for 8 oversubscribed ranks.
std::vector<ParameterSpec> specs() {
  return {{"bias", {9}},     {"dense", {20, 12}}, {"conv", {3, 3, 4, 6}},
          {"wide", {8, 16}}, {"scale", {}},       {"tall", {24, 5}}};
}

Parameters initial_parameters() {
  Parameters params(Space(), specs());
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(params.value(p).extent(0));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(std::cos(0.23 * double(k + 1) + 0.7 * double(p)));
    params.set_value(Space(), p, v);
  }
  return params;
}

void set_gradients(const Parameters& params, int t) {
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto x = params.host_value(Space(), p);
    std::vector<float> g(x.size());
    for (std::size_t k = 0; k < g.size(); ++k)
      g[k] = float(0.1 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
    Kokkos::deep_copy(params.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
  }
}

std::vector<std::vector<float>> host_values(const Parameters& params) {
  std::vector<std::vector<float>> out;
  for (std::size_t p = 0; p < params.size(); ++p) out.push_back(params.host_value(Space(), p));
  return out;
}

/// "" when `got` and `want` hold the same bits, else where they first differ (array, element).
template <class T>
std::string first_difference(const std::vector<std::vector<T>>& got, const std::vector<std::vector<T>>& want) {
  if (got.size() != want.size()) return std::to_string(got.size()) + " arrays, expected " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != want[i].size()) return "array " + std::to_string(i) + " has another size";
    for (std::size_t k = 0; k < got[i].size(); ++k)
      if (std::memcmp(&got[i][k], &want[i][k], sizeof(T)) != 0)
        return "array " + std::to_string(i) + " differs at element " + std::to_string(k);
  }
  return {};
}

using Make = std::function<std::unique_ptr<Optimizer>(const comm::Group&)>;

/// The check of the file's comment, for the optimizer `make` builds on the world (`who`: the name
/// its step's errors start with).
void expect_refused_everywhere(const Make& make, const std::string& who) {
  const comm::Group world(MPI_COMM_WORLD);
  auto params = initial_parameters(), twin_params = initial_parameters();
  const auto tested = make(world), twin = make(world);
  // A finite first step: state to keep (SOAP's first step builds its factors and bases).
  set_gradients(params, 0);
  set_gradients(twin_params, 0);
  tested->step(Space(), params);
  twin->step(Space(), twin_params);
  set_gradients(params, 1);
  const float inf = std::numeric_limits<float>::infinity();
  for (std::size_t p = 0; p < params.size(); ++p) {
    const auto gradient = params.gradient(p);
    const auto finite = test::host_vector(gradient);
    if (world.rank() == 0) Kokkos::deep_copy(Kokkos::subview(gradient, gradient.extent(0) - 1), inf);
    int threw = 0;
    try {
      tested->step(Space(), params);
    } catch (const Error& e) {
      threw = 1;
      const std::string what = e.message();
      EXPECT_NE(what.find(who + "::step 1"), std::string::npos) << what;
      EXPECT_NE(what.find("the gradient of '" + specs()[p].name + "' contains NaN or Inf"), std::string::npos) << what;
    }
    EXPECT_EQ(threw, 1) << who << ": rank " << world.rank() << " of " << world.size()
                        << " took rank 0's Inf in the gradient of '" << specs()[p].name << "'";
    ASSERT_EQ(world.allreduce(threw, comm::Combine::min), world.allreduce(threw, comm::Combine::max))
        << "ranks disagree on the failed step";
    Kokkos::deep_copy(gradient, Kokkos::View<const float*, Kokkos::HostSpace>(finite.data(), finite.size()));
  }
  EXPECT_EQ(tested->step_count(), 1);
  EXPECT_EQ(first_difference(host_values(params), host_values(twin_params)), "")
      << who << ": the refused steps changed the parameters";
  EXPECT_EQ(first_difference(test::state_bytes(tested->state_arrays(Space())),
                             test::state_bytes(twin->state_arrays(Space()))),
            "")
      << who << ": the refused steps changed the state";
  tested->state_released();
  twin->state_released();
  set_gradients(twin_params, 1);
  tested->step(Space(), params);
  twin->step(Space(), twin_params);
  EXPECT_EQ(first_difference(host_values(params), host_values(twin_params)), "")
      << who << ": the next finite step differs";
}

TEST(DistributedNonFinite, ShampooRefusesAnInfThatAnotherRanksShareWouldNotRead) {
  ShampooOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;
  o.step_mode = StepMode::distributed;
  expect_refused_everywhere(
      [&](const comm::Group& group) { return std::make_unique<Shampoo<Space, float>>(Space(), specs(), o, group); },
      "Shampoo");
}

TEST(DistributedNonFinite, SoapRefusesAnInfThatAnotherRanksShareWouldNotRead) {
  SoapOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.01);
  o.precondition_frequency = 2;
  o.block_size = 8;
  o.precondition_1d = true;
  o.normalize_grads = true;
  expect_refused_everywhere(
      [&](const comm::Group& group) { return std::make_unique<Soap<Space, float>>(Space(), specs(), o, group); },
      "Soap");
}

TEST(DistributedNonFinite, MuonRefusesAnInfThatAnotherRanksShareWouldNotRead) {
  MuonOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.02);
  o.adamw_parameters = {"tall"};
  expect_refused_everywhere(
      [&](const comm::Group& group) { return std::make_unique<Muon<Space, float>>(Space(), specs(), o, group); },
      "Muon");
}

}  // namespace
