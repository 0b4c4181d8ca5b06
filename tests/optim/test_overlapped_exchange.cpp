// The distributed step's exchange by layers (Optimizer::overlap_exchange) against the whole
// exchange inside step(): Shampoo, SOAP and Muon on a group of ranks give bit for bit the same
// parameters when each layer's values are only completed just before a simulated forward reads
// them, because the values and every sum are the same; only when the other ranks' blocks arrive
// differs. The gradients are computed from the values a layer's forward reads, so a layer left
// stale, unpacked twice or unpacked from the wrong place changes the trajectory. Where the exchange
// is deferred (MPI's all-gather), the values before values_needed() are the old ones somewhere;
// where it cannot be (Shampoo's node-shared window), step() completes it. A failure in one rank's
// share is an error on every rank, with no all-gather left in flight; a checkpoint saved with the
// layers in flight holds the step's values.
#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/soap.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

using namespace lather;
using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Params = ParameterList<float, Mem>;
using Layers = std::vector<std::pair<std::size_t, std::size_t>>;

/// An MLP's kernels and biases, plus a 3-D tensor: several blocks per tensor at block size 8, more
/// blocks than ranks at 1-4 ranks.
std::vector<ParameterSpec> specs() {
  return {{"dense0/kernel", {20, 12}}, {"dense0/bias", {12}},    {"dense1/kernel", {12, 16}}, {"dense1/bias", {16}},
          {"conv/kernel", {3, 4, 10}}, {"head/kernel", {16, 6}}, {"head/bias", {6}}};
}
Layers layers() { return {{0, 2}, {2, 4}, {4, 5}, {5, 7}}; }

Params initial_parameters() {
  Params params(Space(), specs());
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::vector<float> v(params.value(p).extent(0));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = float(0.5 * std::cos(0.23 * double(k + 1) + 0.7 * double(p)));
    params.set_value(Space(), p, v);
  }
  return params;
}

/// The gradients of parameters [first, last) at step t, from the values the forward reads.
void set_gradients(const Params& params, int t, std::size_t first, std::size_t last) {
  for (std::size_t p = first; p < last; ++p) {
    const auto x = params.host_value(Space(), p);
    std::vector<float> g(x.size());
    for (std::size_t k = 0; k < g.size(); ++k)
      g[k] = float(0.3 * double(x[k]) + std::sin(0.37 * double(k + 1) + 1.3 * double(t + 1) + 0.61 * double(p)));
    Kokkos::deep_copy(params.gradient(p), Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
  }
}

using Make = std::function<std::unique_ptr<Optimizer<Space, float>>(const Params&, const comm::Group&)>;

std::unique_ptr<Optimizer<Space, float>> make_shampoo(const Params& params, const comm::Group& group,
                                                      bool shared_window) {
  ShampooOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.start_preconditioning_step = 2;
  o.preconditioning_compute_steps = 2;
  o.weight_decay = 0.01;
  o.shared_memory_gather = shared_window;
  return std::make_unique<Shampoo<Space, float>>(Space(), params.specs(), o, group);
}
std::unique_ptr<Optimizer<Space, float>> make_soap(const Params& params, const comm::Group& group) {
  SoapOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.01);
  o.precondition_frequency = 2;
  o.block_size = 8;
  o.weight_decay = 0.02;
  return std::make_unique<Soap<Space, float>>(Space(), params, o, group);
}
std::unique_ptr<Optimizer<Space, float>> make_muon(const Params& params, const comm::Group& group) {
  MuonOptions o;
  o.learning_rate = LearningRateSchedule::constant(0.02);
  o.weight_decay = 0.01;
  return std::make_unique<Muon<Space, float>>(Space(), params, o, group);
}

/// Whether any value of `a` differs from `b`'s, on any rank of `group`.
bool differ_anywhere(const comm::Group& group, const Params& a, const Params& b) {
  int differs = 0;
  for (std::size_t p = 0; p < a.size(); ++p) differs |= int(a.host_value(Space(), p) != b.host_value(Space(), p));
  return group.allreduce(differs, comm::Combine::max) != 0;
}

/// Step t of both runs: the whole exchange's, and the one by layers, whose forward completes each
/// layer just before computing its gradients from its values.
void step_both(Optimizer<Space, float>& blocking, const Params& whole, Optimizer<Space, float>& overlapped,
               const Params& by_layers, int t) {
  set_gradients(whole, t, 0, whole.size());
  for (const auto& [first, last] : layers()) {
    overlapped.values_needed(Space(), first, last);
    set_gradients(by_layers, t, first, last);
  }
  blocking.step(Space(), whole);
  overlapped.step(Space(), by_layers);
}

/// `steps` steps of the whole exchange and of the exchange by layers, the latter's forward
/// completing each layer just before reading it. `deferred`: whether the layers' values should
/// still be old right after step() on some rank.
void expect_equal_trajectories(const Make& make, bool deferred, int steps = 6) {
  const comm::Group world(MPI_COMM_WORLD);
  const Params whole = initial_parameters(), by_layers = initial_parameters();
  const auto blocking = make(whole, world);
  const auto overlapped = make(by_layers, world);
  EXPECT_EQ(overlapped->overlap_exchange(Space(), layers()), world.size() > 1);
  bool stale_seen = false;
  for (int t = 0; t < steps; ++t) {
    step_both(*blocking, whole, *overlapped, by_layers, t);
    if (t > 0 && world.size() > 1) stale_seen = stale_seen || differ_anywhere(world, by_layers, whole);
  }
  overlapped->values_needed(Space());
  for (std::size_t p = 0; p < whole.size(); ++p)
    EXPECT_EQ(by_layers.host_value(Space(), p), whole.host_value(Space(), p))
        << whole.spec(p).name << " after " << steps << " steps on rank " << world.rank();
  EXPECT_EQ(stale_seen, deferred && world.size() > 1) << "the other ranks' blocks before values_needed()";
  // Back to the whole exchange: one more step each, the same values.
  overlapped->overlap_exchange(Space(), {});
  set_gradients(whole, steps, 0, whole.size());
  set_gradients(by_layers, steps, 0, by_layers.size());
  blocking->step(Space(), whole);
  overlapped->step(Space(), by_layers);
  EXPECT_FALSE(differ_anywhere(world, by_layers, whole)) << "after the exchange by layers was switched off";
}

TEST(OverlappedExchange, ShampooEqualsTheWholeExchange) {
  expect_equal_trajectories([](const Params& p, const comm::Group& g) { return make_shampoo(p, g, false); }, true);
}

TEST(OverlappedExchange, ShampooOnASharedWindowCompletesInTheStep) {
  // One node: the segments live in a node-shared window that the other ranks rewrite after the
  // next collective, so nothing may wait for the forward.
  expect_equal_trajectories([](const Params& p, const comm::Group& g) { return make_shampoo(p, g, true); }, false);
}

TEST(OverlappedExchange, SoapEqualsTheWholeExchange) { expect_equal_trajectories(make_soap, true); }

TEST(OverlappedExchange, MuonEqualsTheWholeExchange) { expect_equal_trajectories(make_muon, true); }

// A checkpoint saved while a step's layers are still in flight holds that step's values (the
// Checkpointer completes the exchange first), and restores the whole exchange's parameters.
TEST(OverlappedExchange, ACheckpointHoldsTheStepsValues) {
  const comm::Group world(MPI_COMM_WORLD);
  int pid = int(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto dir = std::filesystem::temp_directory_path() / ("lather-overlapped-exchange-" + std::to_string(pid));
  const Params whole = initial_parameters(), by_layers = initial_parameters();
  const auto blocking = make_muon(whole, world);
  const auto overlapped = make_muon(by_layers, world);
  overlapped->overlap_exchange(Space(), layers());
  for (int t = 0; t < 3; ++t) step_both(*blocking, whole, *overlapped, by_layers, t);
  checkpoint::CheckpointOptions options;
  options.directory = dir.string();
  checkpoint::Checkpointer checkpointer(world, options);
  const std::string file = checkpointer.save(Space(), *overlapped, by_layers);
  const Params restored = initial_parameters();
  for (std::size_t p = 0; p < restored.size(); ++p) Kokkos::deep_copy(restored.value(p), -7.0f);
  const auto fresh = make_muon(restored, world);
  checkpointer.restore(Space(), file, *fresh, restored.values());
  for (std::size_t p = 0; p < whole.size(); ++p)
    EXPECT_EQ(restored.host_value(Space(), p), whole.host_value(Space(), p))
        << whole.spec(p).name << " restored on rank " << world.rank();
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(OverlappedExchange, LayersMustCoverTheParameters) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a distributed step";
  const Params params = initial_parameters();
  const auto muon = make_muon(params, world);
  EXPECT_THROW(muon->overlap_exchange(Space(), {{0, 2}, {3, 7}}), lather::Error);  // a gap
  EXPECT_THROW(muon->overlap_exchange(Space(), {{0, 2}, {2, 6}}), lather::Error);  // short of the end
}

TEST(OverlappedExchange, FailureInOneShareIsAnErrorEverywhere) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  static bool this_rank_fails;
  this_rank_fails = world.rank() == world.size() - 1;
  ::lather::Impl::set_fault_hook([](const char* point) {
    if (this_rank_fails &&
        (std::string(point) == "soap.distributed_step" || std::string(point) == "muon.distributed_step"))
      throw std::runtime_error("injected failure");
  });
  for (const Make& make : {Make(make_soap), Make(make_muon)}) {
    const Params params = initial_parameters();
    const auto optimizer = make(params, world);
    ASSERT_TRUE(optimizer->overlap_exchange(Space(), layers()));
    for (int t = 0; t < 2; ++t) {  // SOAP's first step only builds its factors
      set_gradients(params, t, 0, params.size());
      try {
        optimizer->step(Space(), params);
        if (t == 1) ADD_FAILURE() << optimizer->name() << ": no error on rank " << world.rank();
      } catch (const lather::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
        EXPECT_NE(what.find("rank " + std::to_string(world.size() - 1)), std::string::npos) << what;
      }
    }
    // Nothing was left in flight: the values are complete, and a step still agrees.
    optimizer->values_needed(Space());
  }
  ::lather::Impl::set_fault_hook(nullptr);
}

}  // namespace
