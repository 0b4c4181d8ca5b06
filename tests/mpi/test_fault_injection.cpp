// Fault injection at every point where a Lather step agrees on "did any rank fail" before a
// collective (issue 15): a lather::Error thrown on one rank, through the test-only hook of
// <lather/core/fault_injection.hpp>, must become a lather::Error on every rank of the group
// naming that rank and its message, no rank may block (ctest's TIMEOUT and coreutils `timeout`
// around mpiexec turn a hang into a failure), and the object must be usable afterwards where its
// header says so: then its next call must give what an object that never saw the failure gives.
// The failing rank varies with the point (the last rank, rank 1, rank 0).
#include <lather/comm/accumulate.hpp>
#include <lather/comm/mesh.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/comm/replicas.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/nn/parallel_linear.hpp>
#include <lather/nn/vocab_parallel_cross_entropy.hpp>
#include <lather/core/config.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/nn/mlp.hpp>
#include <lather/nn/transformer.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/shampoo.hpp>
#if LATHER_ENABLE_HDF5
#include <lather/checkpoint/checkpoint.hpp>
#endif

#include "fault_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace lather;

using namespace lather::test;
using namespace lather::test::faults;

// ---- the points ---------------------------------------------------------------------------------

const std::vector<std::int64_t> reduce_sizes = {5, 17, 3};

/// One reduction of `op` (weighted mean: weight rank + 1; broadcast: from rank 0).
double run_reduction(comm::GradientReducer<Exec, double>& reducer, const std::string& op,
                     const TensorList<double, Memory>& list) {
  if (op == "broadcast") {
    reducer.broadcast(Exec(), list, 0);
    return 0;
  }
  return reducer.reduce(Exec(), list, comm::parse_reduce_op(op), world_rank() + 1.0);
}

/// GradientReducer: the tensors are untouched by the failed call, and the next call reduces as a
/// reducer that never failed does.
void reducer_case(const std::string& op, int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  const int rank = world.rank();
  comm::GradientReducer<Exec, double> reducer(world);
  const auto list = tensors(rank, reduce_sizes);
  const auto before = host(list);
  if (expect_failure_everywhere("reduce." + op, failing, [&] { run_reduction(reducer, op, list); }) != world.size())
    return;
  EXPECT_EQ(host(list), before) << "the failed " << op << " changed the tensors";
  run_reduction(reducer, op, list);
  comm::GradientReducer<Exec, double> fresh(world);
  const auto reference = tensors(rank, reduce_sizes);
  run_reduction(fresh, op, reference);
  EXPECT_EQ(host(list), host(reference));
}

/// GradientAccumulator: the failed reduce() keeps the micro-batches; the next gives what a fresh
/// accumulator gives.
void accumulator_case(int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  const int rank = world.rank();
  auto fill = [&](comm::GradientAccumulator<Exec, double>& accumulator) {
    accumulator.accumulate(Exec(), tensors(rank, reduce_sizes, 1));
    accumulator.accumulate(Exec(), tensors(rank, reduce_sizes, 2));
  };
  comm::GradientAccumulator<Exec, double> accumulator(world, 2);
  fill(accumulator);
  const auto out = tensors(rank, reduce_sizes, 9);
  if (expect_failure_everywhere("accumulate.reduce", failing, [&] { accumulator.reduce(Exec(), out); }) != world.size())
    return;
  EXPECT_EQ(accumulator.accumulated(), 2);
  accumulator.reduce(Exec(), out);
  comm::GradientAccumulator<Exec, double> fresh(world, 2);
  fill(fresh);
  const auto reference = tensors(rank, reduce_sizes, 9);
  fresh.reduce(Exec(), reference);
  EXPECT_EQ(host(out), host(reference));
}

/// check_replicas: the next check finds the (identical) replicas consistent.
void replicas_case(int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  const auto list = tensors(0, reduce_sizes);  // the same on every rank
  if (expect_failure_everywhere("replicas.check", failing, [&] { comm::check_replicas(Exec(), world, list); }) !=
      world.size())
    return;
  const auto report = comm::check_replicas(Exec(), world, list);
  EXPECT_TRUE(report.consistent()) << report.describe();
}

constexpr int batch = 3, in_features = 9, out_features = 10, vocab = 13;

/// ColumnParallelLinear::backward over all ranks: nothing written by the failed call; the next
/// call gives a fresh layer's gradients.
void column_backward_case(int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  using Layer = nn::ColumnParallelLinear<Exec, double>;
  Layer layer(world, in_features, out_features);
  const auto mine = layer.local_out();
  const Matrix x = matrix(batch, in_features, 1), weight = matrix(in_features, mine.count, 2, mine.begin);
  const Matrix dy = matrix(batch, mine.count, 3, mine.begin);
  const auto run = [&](Layer& l, const Matrix& dx, const Matrix& dweight, const Kokkos::View<double*, Memory>& dbias) {
    l.backward(Exec(), x, weight, dy, dx, dweight, dbias);
  };
  Matrix dx("dx", batch, in_features), dweight("dweight", in_features, mine.count);
  Kokkos::View<double*, Memory> dbias("dbias", mine.count);
  if (expect_failure_everywhere("tensor_parallel.column_backward", failing, [&] { run(layer, dx, dweight, dbias); }) !=
      world.size())
    return;
  for (const auto& v : {host(dx), host(dweight), host(dbias)})
    for (double e : v) ASSERT_EQ(e, 0.0) << "the failed backward wrote its outputs";
  run(layer, dx, dweight, dbias);
  Layer fresh(world, in_features, out_features);
  Matrix dx2("dx", batch, in_features), dweight2("dweight", in_features, mine.count);
  Kokkos::View<double*, Memory> dbias2("dbias", mine.count);
  run(fresh, dx2, dweight2, dbias2);
  EXPECT_EQ(host(dx), host(dx2));
  EXPECT_EQ(host(dweight), host(dweight2));
  EXPECT_EQ(host(dbias), host(dbias2));
}

/// RowParallelLinear::forward: y untouched by the failed call; the next equals a fresh layer's.
void row_forward_case(int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  using Layer = nn::RowParallelLinear<Exec, double>;
  Layer layer(world, in_features, out_features);
  const auto mine = layer.local_in();
  const Matrix x = matrix(batch, mine.count, 1, mine.begin),
               weight = matrix(mine.count, out_features, 2, 0, mine.begin);
  const Kokkos::View<double*, Memory> bias("bias", out_features);
  Matrix y("y", batch, out_features), y2("y", batch, out_features);
  if (expect_failure_everywhere("tensor_parallel.row_forward", failing,
                                [&] { layer.forward(Exec(), x, weight, bias, y); }) != world.size())
    return;
  for (double e : host(y)) ASSERT_EQ(e, 0.0) << "the failed forward wrote y";
  layer.forward(Exec(), x, weight, bias, y);
  Layer fresh(world, in_features, out_features);
  fresh.forward(Exec(), x, weight, bias, y2);
  EXPECT_EQ(host(y), host(y2));
}

/// FeatureAllGather: the next gather gives the whole activation.
void all_gather_case(int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  comm::FeatureAllGather<Exec, double> gather(world);
  const auto mine = comm::shard_range(out_features, world.size(), world.rank());
  const Matrix local = matrix(batch, mine.count, 4, mine.begin), gathered("gathered", batch, out_features);
  if (expect_failure_everywhere("tensor_parallel.all_gather", failing, [&] { gather(Exec(), local, gathered); }) !=
      world.size())
    return;
  for (double e : host(gathered)) ASSERT_EQ(e, 0.0) << "the failed gather wrote its output";
  gather(Exec(), local, gathered);
  EXPECT_EQ(host(gathered), host(matrix(batch, out_features, 4)));
}

/// VocabParallelCrossEntropy: the next call equals a fresh criterion's.
void cross_entropy_case(int failing) {
  const comm::Group world(MPI_COMM_WORLD);
  using Criterion = nn::VocabParallelCrossEntropy<Exec, double>;
  Criterion criterion(world, vocab);
  const auto mine = criterion.local_vocab();
  const Matrix logits = matrix(batch, mine.count, 5, mine.begin);
  Kokkos::View<int*, Memory> labels("labels", batch);
  auto h = Kokkos::create_mirror_view(labels);
  for (int i = 0; i < batch; ++i) h(i) = (5 * i + 2) % vocab;
  Kokkos::deep_copy(labels, h);
  Kokkos::View<double*, Memory> loss("loss", batch), loss2("loss", batch);
  Matrix grad("grad", batch, mine.count), grad2("grad", batch, mine.count);
  double mean = 0;
  if (expect_failure_everywhere("tensor_parallel.cross_entropy", failing, [&] {
        mean = criterion.forward_backward(Exec(), logits, labels, loss, grad);
      }) != world.size())
    return;
  mean = criterion.forward_backward(Exec(), logits, labels, loss, grad);
  Criterion fresh(world, vocab);
  EXPECT_EQ(mean, fresh.forward_backward(Exec(), logits, labels, loss2, grad2));
  EXPECT_EQ(host(loss), host(loss2));
  EXPECT_EQ(host(grad), host(grad2));
}

// ---- Shampoo ------------------------------------------------------------------------------------

std::vector<optim::ParameterSpec> shampoo_specs() { return {{"bias", {9}}, {"dense", {20, 12}}, {"long", {70}}}; }

/// shampoo_specs plus "wide" [8, 16], split by columns over `shards` weight shards (whole blocks of 8).
std::vector<optim::ParameterSpec> sharded_specs(int shards, int shard) {
  auto specs = shampoo_specs();
  optim::ParameterSpec wide{"wide", {8, 16}};
  if (shards > 1) {
    wide.global_shape = wide.shape;
    wide.shape[1] /= shards;
    wide.split_axis = 1;
    wide.split_offset = wide.shape[1] * shard;
  }
  specs.push_back(wide);
  return specs;
}

optim::ShampooOptions shampoo_options(optim::StepMode mode) {
  optim::ShampooOptions o;
  o.learning_rate = optim::LearningRateSchedule::constant(0.02);
  o.block_size = 8;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;  // roots at steps 0, 2, ...
  o.step_mode = mode;
  return o;
}

TensorList<double, Memory> model_tensors(int id, const std::vector<optim::ParameterSpec>& specs = shampoo_specs(),
                                         int shard = 0) {
  std::vector<std::int64_t> sizes;
  for (const auto& s : specs) sizes.push_back(element_count(s.shape));
  return tensors(shard, sizes, id);  // replicas hold the same values and (reduced) gradients
}

/// Shampoo::step or state_arrays with a failure at `point`, on a mesh of `shards` weight shards
/// (the world's ranks r hold shard r mod S of replica r div S). Where the header says the optimizer
/// is usable afterwards (nothing moved), its next step must equal that of an optimizer that never
/// failed; where it says to restore or rebuild, a new optimizer on the same mesh must step and its
/// replicas agree (nothing was left in flight).
void shampoo_case(const std::string& point, optim::StepMode mode, int failing, int shards = 1) {
  const int size = world_size();
  if (size % shards != 0) GTEST_SKIP() << shards << " weight shards need a multiple of " << shards << " ranks";
  const comm::Mesh mesh(MPI_COMM_WORLD, shards);
  const auto specs = sharded_specs(shards, mesh.shard());
  const auto options = shampoo_options(mode);
  optim::Shampoo<Exec, double> shampoo(Exec(), specs, options, mesh);
  optim::Shampoo<Exec, double> clean(Exec(), specs, options, mesh);
  if (point == "shampoo.distributed_step" && !shampoo.distributed())
    GTEST_SKIP() << "one replica: the step is not distributed";
  const auto model = [&](int id) { return model_tensors(id, specs, mesh.shard()); };
  const auto params = model(0), reference = model(0);
  const bool usable = point == "shampoo.pack" || point == "shampoo.state_gather";
  if (usable) {
    // Past the first roots, so that the failed call meets a state that has moved.
    shampoo.step(Exec(), params, model(1));
    clean.step(Exec(), reference, model(1));
  }
  const auto before = host(params);
  const auto call = [&] {
    if (point == "shampoo.state_gather")
      shampoo.state_arrays(Exec());
    else
      shampoo.step(Exec(), params, model(2));
  };
  // The data-parallel group agrees first, so the message names the failing rank in it; with one
  // replica, the shards' agreement names it among the shards.
  const int replicas = size / shards;
  const Where where = replicas > 1 ? Where{failing / shards, replicas} : Where{failing % shards, shards};
  if (expect_failure_everywhere(point, failing, call, false, where) != size) return;
  if (usable) {
    EXPECT_EQ(host(params), before) << "the failed call moved the parameters";
    EXPECT_EQ(shampoo.step_count(), clean.step_count());
    if (point == "shampoo.state_gather") {
      shampoo.state_arrays(Exec());
      shampoo.state_released();
    }
    shampoo.step(Exec(), params, model(2));
    clean.step(Exec(), reference, model(2));
    EXPECT_EQ(host(params), host(reference));
  } else {
    optim::Shampoo<Exec, double> rebuilt(Exec(), specs, options, mesh);
    rebuilt.step(Exec(), reference, model(2));
    const auto report = comm::check_replicas(Exec(), mesh, reference);
    EXPECT_TRUE(report.consistent()) << report.describe();
  }
}

/// Construction (options, plan, allocations) failing on one rank: every rank of both groups
/// throws, and an optimizer built next on the same mesh steps with its replicas in agreement.
void shampoo_construct_case(optim::StepMode mode, int failing, int shards = 1) {
  const int size = world_size();
  if (size % shards != 0) GTEST_SKIP() << shards << " weight shards need a multiple of " << shards << " ranks";
  const comm::Mesh mesh(MPI_COMM_WORLD, shards);
  const auto specs = sharded_specs(shards, mesh.shard());
  const auto options = shampoo_options(mode);
  const auto call = [&] { optim::Shampoo<Exec, double> shampoo(Exec(), specs, options, mesh); };
  const int replicas = size / shards;
  const Where where = replicas > 1 ? Where{failing / shards, replicas} : Where{failing % shards, shards};
  if (expect_failure_everywhere("shampoo.construct", failing, call, false, where) != size) return;
  optim::Shampoo<Exec, double> rebuilt(Exec(), specs, options, mesh);
  auto values = model_tensors(0, specs, mesh.shard());
  rebuilt.step(Exec(), values, model_tensors(1, specs, mesh.shard()));
  const auto report = comm::check_replicas(Exec(), mesh, values);
  EXPECT_TRUE(report.consistent()) << report.describe();
}

/// Asynchronous roots: the failure happens on the root thread started at step 0 and is reported
/// by the step that installs its roots (step 2), on every rank; a rebuilt optimizer then steps.
void shampoo_async_roots_case(int failing) {
  const comm::Mesh mesh(MPI_COMM_WORLD, 1);
  auto options = shampoo_options(optim::StepMode::replicated);
  options.async_roots = true;
  options.root.method = linalg::RootMethod::eigh;
  optim::Shampoo<Exec, double> shampoo(Exec(), shampoo_specs(), options, mesh);
  const auto params = model_tensors(0);
  const auto call = [&] {
    for (int step = 0; step < 3; ++step) shampoo.step(Exec(), params, model_tensors(1 + step));
  };
  if (expect_failure_everywhere("shampoo.async_roots", failing, call, false, Where{failing, world_size()}) !=
      world_size())
    return;
  optim::Shampoo<Exec, double> rebuilt(Exec(), shampoo_specs(), options, mesh);
  const auto reference = model_tensors(0);
  for (int step = 0; step < 3; ++step) rebuilt.step(Exec(), reference, model_tensors(1 + step));
  const auto report = comm::check_replicas(Exec(), mesh, reference);
  EXPECT_TRUE(report.consistent()) << report.describe();
}

// ---- nn: the activations of the tensor-parallel models ------------------------------------------

/// Mlp split over all ranks: the next evaluation equals a fresh model's.
void mlp_case(int failing) {
  const int size = world_size();
  const comm::Mesh mesh(MPI_COMM_WORLD, size);
  const std::vector<int> sizes = {6, 4 * size, 2 * size, 3};
  nn::Mlp<Exec> model(Exec(), sizes, 7, mesh), fresh(Exec(), sizes, 7, mesh);
  const int rows = 4;
  Kokkos::View<float**, Kokkos::LayoutRight, Memory> x("x", rows, sizes[0]);
  Kokkos::View<std::int32_t*, Memory> y("y", rows);
  auto hx = Kokkos::create_mirror_view(x);
  auto hy = Kokkos::create_mirror_view(y);
  for (int i = 0; i < rows; ++i) {
    hy(i) = i % sizes.back();
    for (int k = 0; k < sizes[0]; ++k) hx(i, k) = float(value_of(0, 6, i * 100 + k));
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(y, hy);
  if (expect_failure_everywhere("mlp.allocate", failing, [&] { model.evaluate(Exec(), x, y); }) != size) return;
  const auto a = model.evaluate(Exec(), x, y), b = fresh.evaluate(Exec(), x, y);
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(a.correct, b.correct);
}

/// A one-layer transformer of 12 heads (split over 1 to 4 shards) and 11 tokens.
nn::TransformerConfig small_transformer() {
  nn::TransformerConfig config;
  config.vocab_size = 11;
  config.n_layer = 1;
  config.n_head = 12;
  config.d_model = 24;
  config.block_size = 4;
  return config;
}

/// A model split over all ranks, failing as it allocates and initialises its parameters: every
/// shard throws, and a model built next holds the same initial values as one built beside it.
template <class Build>
void construct_case(const char* point, int failing, const Build& build) {
  if (expect_failure_everywhere(point, failing, [&] { auto model = build(); }) != world_size()) return;
  auto model = build(), fresh = build();
  EXPECT_EQ(test::host_vectors(model.parameters().values()), test::host_vectors(fresh.parameters().values()));
}

void mlp_construct_case(int failing) {
  const comm::Mesh mesh(MPI_COMM_WORLD, world_size());
  const std::vector<int> sizes = {6, 4 * world_size(), 2 * world_size(), 3};
  construct_case("mlp.construct", failing, [&] { return nn::Mlp<Exec>(Exec(), sizes, 7, mesh); });
}

/// The Transformer has 12 heads: 1 to 4 shards.
void transformer_construct_case(int failing) {
  const comm::Mesh mesh(MPI_COMM_WORLD, world_size());
  const nn::TransformerConfig config = small_transformer();
  construct_case("transformer.construct", failing,
                 [&] { return nn::Transformer<Exec, double>(Exec(), config, 3, mesh); });
}

/// Transformer split over all ranks (12 heads: 1 to 4 shards): the next evaluation equals a
/// fresh model's.
void transformer_case(int failing) {
  const int size = world_size();
  const comm::Mesh mesh(MPI_COMM_WORLD, size);
  const nn::TransformerConfig config = small_transformer();
  using Model = nn::Transformer<Exec, double>;
  Model model(Exec(), config, 3, mesh), fresh(Exec(), config, 3, mesh);
  const int windows = 1, time = 4;
  Model::Tokens inputs("inputs", windows * time), targets("targets", windows * time);
  auto hi = Kokkos::create_mirror_view(inputs);
  auto ht = Kokkos::create_mirror_view(targets);
  for (int i = 0; i < windows * time; ++i)
    hi(i) = (3 * i + 1) % config.vocab_size, ht(i) = (7 * i + 2) % config.vocab_size;
  Kokkos::deep_copy(inputs, hi);
  Kokkos::deep_copy(targets, ht);
  if (expect_failure_everywhere("transformer.allocate", failing,
                                [&] { model.evaluate(Exec(), windows, time, inputs, targets); }) != size)
    return;
  const auto a = model.evaluate(Exec(), windows, time, inputs, targets);
  const auto b = fresh.evaluate(Exec(), windows, time, inputs, targets);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.correct, b.correct);
}

// ---- checkpoints --------------------------------------------------------------------------------

#if LATHER_ENABLE_HDF5
/// A fresh directory every rank agrees on (rank 0 creates it).
std::string shared_directory() {
  char name[512] = {};
  if (world_rank() == 0) {
    const std::string pattern = (std::filesystem::temp_directory_path() / "lather-fault-injection-XXXXXX").string();
    std::strncpy(name, pattern.c_str(), sizeof name - 1);
    if (!mkdtemp(name)) name[0] = '\0';
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

/// Checkpointer save or load through the public API. The points are placed by the checkpoint code
/// itself (src/checkpoint/checkpointer.cpp, inside its agreed work); a build in which no rank
/// reaches the point skips, saying so, rather than pass. After a failed save a second save
/// succeeds and restores; after a failed load a second load restores the saved values.
void checkpoint_case(const std::string& point, int failing) {
  const std::string directory = shared_directory();
  ASSERT_FALSE(directory.empty());
  const comm::Group world(MPI_COMM_WORLD);
  checkpoint::CheckpointOptions options;
  options.directory = directory;
  options.fsync = false;
  checkpoint::Checkpointer checkpointer(world, options);
  optim::AdamOptions adam;
  adam.learning_rate = optim::LearningRateSchedule::constant(0.01);
  optim::FirstOrder<Exec, double> optimizer(Exec(), shampoo_specs(), adam);
  const auto params = model_tensors(0);
  optimizer.step(Exec(), params, model_tensors(1));
  const auto saved = host(params);

  int threw = 0;
  if (point == "checkpoint.save") {
    threw = expect_failure_everywhere(
        point, failing, [&] { checkpointer.save(Exec(), optimizer, params); }, true);
    if (threw == world.size()) checkpointer.save(Exec(), optimizer, params);
  } else {
    checkpointer.save(Exec(), optimizer, params);
  }
  const std::string file = threw == 0 || threw == world.size() ? checkpointer.latest() : std::string();
  optim::FirstOrder<Exec, double> restored(Exec(), shampoo_specs(), adam);
  const auto loaded = model_tensors(5);
  if (point == "checkpoint.load" && !file.empty())
    threw = expect_failure_everywhere(
        point, failing, [&] { checkpointer.restore(Exec(), file, restored, loaded); }, true);
  if (!file.empty() && (threw == 0 || threw == world.size())) {
    checkpointer.restore(Exec(), file, restored, loaded);
    EXPECT_EQ(host(loaded), saved);
    EXPECT_EQ(restored.step_count(), optimizer.step_count());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(directory);
  EXPECT_NE(threw, 0) << point << " is not reached";
}
#endif

// ---- the list -------------------------------------------------------------------------------------

struct FaultCase {
  const char* point;  ///< the name passed to fault_point
  const char* label;  ///< the test's name (the point, with the mode where it matters)
  std::function<void(int failing)> run;
};

std::vector<FaultCase> fault_cases() {
  using optim::StepMode;
  std::vector<FaultCase> cases = {
      {"reduce.sum", "reduce_sum", [](int f) { reducer_case("sum", f); }},
      {"reduce.mean", "reduce_mean", [](int f) { reducer_case("mean", f); }},
      {"reduce.weighted_mean", "reduce_weighted_mean", [](int f) { reducer_case("weighted_mean", f); }},
      {"reduce.adasum", "reduce_adasum", [](int f) { reducer_case("adasum", f); }},
      {"reduce.adasum_approx", "reduce_adasum_approx", [](int f) { reducer_case("adasum_approx", f); }},
      {"reduce.broadcast", "reduce_broadcast", [](int f) { reducer_case("broadcast", f); }}};
  cases.push_back({"accumulate.reduce", "accumulate_reduce", accumulator_case});
  cases.push_back({"replicas.check", "replicas_check", replicas_case});
  cases.push_back({"tensor_parallel.column_backward", "tensor_parallel_column_backward", column_backward_case});
  cases.push_back({"tensor_parallel.row_forward", "tensor_parallel_row_forward", row_forward_case});
  cases.push_back({"tensor_parallel.all_gather", "tensor_parallel_all_gather", all_gather_case});
  cases.push_back({"tensor_parallel.cross_entropy", "tensor_parallel_cross_entropy", cross_entropy_case});
  cases.push_back({"shampoo.construct", "shampoo_construct_replicated",
                   [](int f) { shampoo_construct_case(StepMode::replicated, f); }});
  cases.push_back({"shampoo.construct", "shampoo_construct_distributed_shards2",
                   [](int f) { shampoo_construct_case(StepMode::distributed, f, 2); }});
  cases.push_back({"shampoo.pack", "shampoo_pack_replicated",
                   [](int f) { shampoo_case("shampoo.pack", StepMode::replicated, f); }});
  cases.push_back({"shampoo.pack", "shampoo_pack_distributed",
                   [](int f) { shampoo_case("shampoo.pack", StepMode::distributed, f); }});
  cases.push_back({"shampoo.root_exchange", "shampoo_root_exchange_replicated",
                   [](int f) { shampoo_case("shampoo.root_exchange", StepMode::replicated, f); }});
  cases.push_back({"shampoo.root_exchange", "shampoo_root_exchange_distributed",
                   [](int f) { shampoo_case("shampoo.root_exchange", StepMode::distributed, f); }});
  cases.push_back({"shampoo.distributed_step", "shampoo_distributed_step",
                   [](int f) { shampoo_case("shampoo.distributed_step", StepMode::distributed, f); }});
  cases.push_back({"shampoo.async_roots", "shampoo_async_roots", shampoo_async_roots_case});
  cases.push_back({"shampoo.state_gather", "shampoo_state_gather_replicated",
                   [](int f) { shampoo_case("shampoo.state_gather", StepMode::replicated, f); }});
  cases.push_back({"shampoo.state_gather", "shampoo_state_gather_distributed",
                   [](int f) { shampoo_case("shampoo.state_gather", StepMode::distributed, f); }});
  // Two weight shards (2 and 4 ranks): the failure also crosses the shard group.
  cases.push_back({"shampoo.pack", "shampoo_pack_distributed_shards2",
                   [](int f) { shampoo_case("shampoo.pack", StepMode::distributed, f, 2); }});
  cases.push_back({"shampoo.root_exchange", "shampoo_root_exchange_replicated_shards2",
                   [](int f) { shampoo_case("shampoo.root_exchange", StepMode::replicated, f, 2); }});
  cases.push_back({"shampoo.distributed_step", "shampoo_distributed_step_shards2",
                   [](int f) { shampoo_case("shampoo.distributed_step", StepMode::distributed, f, 2); }});
  cases.push_back({"mlp.allocate", "mlp_allocate", mlp_case});
  cases.push_back({"transformer.allocate", "transformer_allocate", transformer_case});
  cases.push_back({"mlp.construct", "mlp_construct", mlp_construct_case});
  cases.push_back({"transformer.construct", "transformer_construct", transformer_construct_case});
#if LATHER_ENABLE_HDF5
  cases.push_back({"checkpoint.save", "checkpoint_save", [](int f) { checkpoint_case("checkpoint.save", f); }});
  cases.push_back({"checkpoint.load", "checkpoint_load", [](int f) { checkpoint_case("checkpoint.load", f); }});
#endif
  return cases;
}

class FaultInjection : public ::testing::TestWithParam<std::size_t> {};

// The failing rank cycles over the last rank, rank 1 and rank 0 along the list, so that every
// position of the failing rank (the lowest, a middle one, the highest) is covered on 3 and 4 ranks.
TEST_P(FaultInjection, EveryRankReportsTheFailingRankAndNoneBlocks) {
  const auto cases = fault_cases();
  const std::size_t index = GetParam();
  const int size = world_size();
  const int failing = index % 3 == 0 ? size - 1 : index % 3 == 1 ? std::min(1, size - 1) : 0;
  SCOPED_TRACE(Impl::concat(cases[index].point, ": failure injected on rank ", failing, " of ", size));
  cases[index].run(failing);
}

INSTANTIATE_TEST_SUITE_P(Points, FaultInjection, ::testing::Range(std::size_t(0), fault_cases().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return std::string(fault_cases()[info.param].label);
                         });

// Without a hook every point is one relaxed load: a test that installs none sees nothing thrown.
TEST(FaultInjection, NoHookNoFailure) {
  EXPECT_EQ(Impl::fault_hook().load(), nullptr);
  EXPECT_NO_THROW(Impl::fault_point("reduce.mean"));
}

}  // namespace
