// Checkpoints of pipeline stages: each stage's ranks hold a consecutive range of one parameter
// list and an optimizer over just those, and the stages write one file, the file a single stage
// over the whole list writes. On every layout (replicas x stages x shards) the world size allows,
// with 1 to 4 stages, a run of three steps saves; the file must hold, dataset by dataset and byte
// for byte, what a one-process run of the same steps over the whole list saves; it is restored
// into a one-stage layout and into one of another stage count, where the parameters and (saved
// again) every optimizer array must equal that run's, and one more step must give its parameters.
// For Shampoo (distributed and replicated steps) and AdamW.
//
// Why bit for bit: the gradients are the same global values whatever the layout (a function of
// the global element index and of the parameter's value there), and every number of the update
// is computed from the same numbers in the same order wherever it is computed. Shampoo is grafted
// per block (GraftGranularity::block), so no sum runs over blocks of other ranks, shards or
// stages: a block's statistics, roots (one rank computes each and sends its bytes), graft and
// update depend on that block alone, and so do AdamW's element-wise updates. Every stage holds a
// statistic of the block size, so every stage's stack pads to the same size as the whole model's.
#include "checkpoint_test_support.hpp"
#include "integrity_support.hpp"

#include <lather/comm/mesh.hpp>
#include <lather/core/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace lather;
using namespace lather::test;

struct Layout {
  int replicas, stages, shards;
  std::string name() const {
    return std::to_string(replicas) + "x" + std::to_string(stages) + "x" + std::to_string(shards);
  }
};

/// Every layout of `world` ranks with 1 to 4 stages; past 4 ranks (8, oversubscribed on the CI's
/// 2 cores) those with at most 2 shards, which still cover replicas, stages and shards together.
std::vector<Layout> layouts(int world) {
  std::vector<Layout> out;
  const int most_shards = world > 4 ? 2 : world;
  for (int stages = 1; stages <= 4; ++stages) {
    if (world % stages != 0) continue;
    for (int shards = 1; shards <= std::min(most_shards, world / stages); ++shards)
      if ((world / stages) % shards == 0) out.push_back({world / (stages * shards), stages, shards});
  }
  return out;
}

/// The whole model: 2-D parameters of a few blocks (block size 4), 1-D ones, a scalar, and one
/// (index 2) split over the weight shards along its columns, in slices of whole blocks for every
/// shard count up to 8.
std::vector<optim::ParameterSpec> global_specs() {
  return {{"embed", {24, 4}},         {"scale", {}},        {"layer0/kernel", {4, 96}}, {"layer0/bias", {6}},
          {"layer1/kernel", {10, 6}}, {"layer1/bias", {5}}, {"norm/gain", {7}},         {"head/kernel", {6, 9}}};
}
constexpr std::size_t split_parameter = 2;

/// What one rank holds: its stage's consecutive range of the list (stage s of P: parameters
/// [s n / P, (s + 1) n / P)), the split one as this shard's columns.
struct Model {
  std::vector<std::size_t> global;  ///< each parameter's index in the whole list
  std::vector<optim::ParameterSpec> specs;
};

Model model_of(const comm::Mesh& mesh, const std::vector<optim::ParameterSpec>& all = global_specs()) {
  const std::size_t n = all.size(), stages = std::size_t(mesh.pipeline_stages()), stage = std::size_t(mesh.stage());
  Model model;
  for (std::size_t p = stage * n / stages; p < (stage + 1) * n / stages; ++p) {
    auto spec = all[p];
    if (p == split_parameter && spec.shape.size() == 2 && mesh.weight_shards() > 1) {
      const std::int64_t columns = spec.shape[1] / mesh.weight_shards();
      spec.global_shape = spec.shape;
      spec.shape[1] = columns;
      spec.split_axis = 1;
      spec.split_offset = columns * mesh.shard();
    }
    model.global.push_back(p);
    model.specs.push_back(spec);
  }
  return model;
}

Model whole_model(const std::vector<optim::ParameterSpec>& all = global_specs()) {
  Model model;
  model.specs = all;
  for (std::size_t p = 0; p < model.specs.size(); ++p) model.global.push_back(p);
  return model;
}

/// The index in the whole tensor of element k of a (possibly split) parameter.
std::int64_t global_element(const optim::ParameterSpec& spec, std::int64_t k) {
  if (!spec.split()) return k;
  const std::int64_t columns = spec.shape[1], all = spec.global()[1];
  return (k / columns) * all + spec.split_offset + k % columns;
}

std::vector<std::vector<float>> initial_values(const Model& model) {
  std::vector<std::vector<float>> values;
  for (std::size_t p = 0; p < model.specs.size(); ++p) {
    std::vector<float> v(std::size_t(element_count(model.specs[p].shape)));
    for (std::size_t k = 0; k < v.size(); ++k)
      v[k] = float(
          std::cos(0.31 * double(global_element(model.specs[p], std::int64_t(k)) + 1) + 0.5 * double(model.global[p])));
    values.push_back(std::move(v));
  }
  return values;
}

TensorList<float, Mem> to_device(const std::vector<std::vector<float>>& values) {
  TensorList<float, Mem> out;
  for (const auto& v : values) {
    FlatTensor<float, Mem> t("param", v.size());
    Kokkos::deep_copy(t, Kokkos::View<const float*, Kokkos::HostSpace>(v.data(), v.size()));
    out.push_back(t);
  }
  return out;
}

/// Steps [from, to): g = 0.05 p + sin(global element, step, global parameter).
void run(optim::Optimizer<Space, float>& optimizer, const Model& model, const TensorList<float, Mem>& params, long from,
         long to) {
  const auto grads = make_like(params);
  for (long step = from; step < to; ++step) {
    const auto values = host_vectors(params);
    for (std::size_t p = 0; p < params.size(); ++p) {
      std::vector<float> g(values[p].size());
      for (std::size_t k = 0; k < g.size(); ++k)
        g[k] = float(0.05 * double(values[p][k]) +
                     std::sin(0.37 * double(global_element(model.specs[p], std::int64_t(k)) + 1) +
                              1.1 * double(step + 1) + 0.61 * double(model.global[p])));
      Kokkos::deep_copy(grads[p], Kokkos::View<const float*, Kokkos::HostSpace>(g.data(), g.size()));
    }
    optimizer.step(Space(), params, grads);
  }
}

/// This rank's parts of whole parameters.
std::vector<std::vector<float>> slices(const Model& model, const std::vector<std::vector<float>>& whole) {
  std::vector<std::vector<float>> out;
  for (std::size_t p = 0; p < model.specs.size(); ++p) {
    std::vector<float> v(std::size_t(element_count(model.specs[p].shape)));
    for (std::size_t k = 0; k < v.size(); ++k)
      v[k] = whole[model.global[p]][std::size_t(global_element(model.specs[p], std::int64_t(k)))];
    out.push_back(std::move(v));
  }
  return out;
}

enum class Kind { shampoo_distributed, shampoo_replicated, adamw };
const char* name(Kind kind) {
  return kind == Kind::shampoo_distributed  ? "shampoo_distributed"
         : kind == Kind::shampoo_replicated ? "shampoo_replicated"
                                            : "adamw";
}

std::unique_ptr<optim::Optimizer<Space, float>> make_optimizer(Kind kind, const Model& model, const comm::Mesh& mesh) {
  if (kind == Kind::adamw) {
    optim::AdamOptions o;
    o.learning_rate = optim::LearningRateSchedule::constant(0.01);
    o.weight_decay = 0.01;
    o.decoupled_weight_decay = true;
    return std::make_unique<optim::FirstOrder<Space, float>>(Space(), model.specs, o);
  }
  optim::ShampooOptions o;
  o.learning_rate = optim::LearningRateSchedule::constant(0.02);
  o.block_size = 4;
  o.merge_small_dims_block_size = 8;
  o.start_preconditioning_step = 1;
  o.preconditioning_compute_steps = 2;
  o.graft_type = optim::GraftType::rmsprop;
  o.graft_granularity = optim::GraftGranularity::block;
  o.step_mode = kind == Kind::shampoo_distributed ? optim::StepMode::distributed : optim::StepMode::replicated;
  return std::make_unique<optim::Shampoo<Space, float>>(Space(), model.specs, o, mesh);
}

checkpoint::CheckpointOptions options_in(const std::string& directory) {
  checkpoint::CheckpointOptions options;
  options.directory = directory;
  options.fsync = false;
  return options;
}

/// Every dataset of a checkpoint as bytes, read on this process alone.
std::map<std::string, std::vector<char>> datasets_of(const std::string& file) {
  const auto summary = checkpoint::describe_checkpoint(file);
  std::vector<checkpoint::ArraySlice> arrays;
  std::map<std::string, std::vector<char>> out;
  for (const auto& d : summary.datasets) {
    checkpoint::ArraySlice a;
    a.path = d.path;
    for (DType t : {DType::float32, DType::float64, DType::int8, DType::int16, DType::int32, DType::int64})
      if (to_string(t) == d.type) a.dtype = t;
    a.shape = d.shape;
    auto& bytes = out[d.path];
    bytes.resize(a.bytes());
    a.data = bytes.data();
    arrays.push_back(a);
  }
  checkpoint::Checkpointer(comm::Group(), options_in(std::filesystem::path(file).parent_path().string()))
      .load(file, arrays);
  return out;
}

/// Rank 0: `file` holds the same datasets as `reference`, byte for byte (a failure, not an
/// exception, where it cannot be read: the other ranks go on to the next collective).
void expect_same_datasets(const std::string& file, const std::string& reference, const std::string& what) {
  if (world_rank() != 0) return;
  std::map<std::string, std::vector<char>> got, want;
  try {
    got = datasets_of(file);
    want = datasets_of(reference);
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": " << e.message();
    return;
  }
  std::vector<std::string> got_names, want_names;
  for (const auto& [path, bytes] : got) got_names.push_back(path);
  for (const auto& [path, bytes] : want) want_names.push_back(path);
  ASSERT_EQ(got_names, want_names) << what;
  for (const auto& [path, bytes] : want) EXPECT_TRUE(got.at(path) == bytes) << what << ": dataset '" << path << "'";
}

void remove_directory(const std::string& directory) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(directory);
}

TEST(CheckpointStages, AnyLayoutResumesOnAnyOther) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto all = layouts(world);
  std::vector<Layout> one_stage;
  for (const auto& l : all)
    if (l.stages == 1) one_stage.push_back(l);
  const std::string root = shared_directory("stages");
  ASSERT_FALSE(root.empty());
  const std::vector<std::uint64_t> rng = {0x0123456789abcdefull, 7, 42};
  checkpoint::TrainingState with_rng;
  with_rng.rng = rng;

  for (Kind kind : {Kind::shampoo_distributed, Kind::shampoo_replicated, Kind::adamw}) {
    // The reference: one process over the whole list (every rank runs it; rank 0 saves it).
    const Model whole = whole_model();
    auto reference = make_optimizer(kind, whole, comm::Mesh());
    const auto reference_params = to_device(initial_values(whole));
    run(*reference, whole, reference_params, 0, 3);
    const auto after3 = host_vectors(reference_params);
    const std::string reference_dir = root + "/" + name(kind) + "-reference";
    std::string reference_file;
    if (world_rank() == 0)
      reference_file = checkpoint::Checkpointer(comm::Group(), options_in(reference_dir))
                           .save(Space(), *reference, reference_params, with_rng);
    run(*reference, whole, reference_params, 3, 4);
    const auto after4 = host_vectors(reference_params);

    for (std::size_t li = 0; li < all.size(); ++li) {
      const Layout& layout = all[li];
      const std::string what = std::string(name(kind)) + " saved by " + layout.name();
      const std::string dir = root + "/" + name(kind) + "-" + layout.name();
      std::string file;
      {
        const comm::Mesh mesh(MPI_COMM_WORLD, layout.shards, layout.stages);
        const Model model = model_of(mesh);
        auto optimizer = make_optimizer(kind, model, mesh);
        const auto params = to_device(initial_values(model));
        run(*optimizer, model, params, 0, 3);
        file = checkpoint::Checkpointer(mesh, options_in(dir + "/saved")).save(Space(), *optimizer, params, with_rng);
      }
      expect_same_datasets(file, reference_file, what);

      // Restored into a one-stage layout and into one of another stage count.
      std::vector<Layout> targets = {one_stage[li % one_stage.size()]};
      std::vector<Layout> other;
      for (const auto& l : all)
        if (l.stages != layout.stages) other.push_back(l);
      if (!other.empty()) targets.push_back(other[li % other.size()]);
      for (const Layout& target : targets) {
        const std::string where = what + ", restored on " + target.name();
        const comm::Mesh mesh(MPI_COMM_WORLD, target.shards, target.stages);
        const Model model = model_of(mesh);
        auto optimizer = make_optimizer(kind, model, mesh);
        auto values = initial_values(model);
        for (auto& v : values) std::fill(v.begin(), v.end(), -7.0f);
        const auto params = to_device(values);
        checkpoint::Checkpointer checkpointer(mesh, options_in(dir + "/on-" + target.name()));
        const auto loaded = checkpointer.restore(Space(), file, *optimizer, params);
        EXPECT_EQ(loaded.pipeline_stages, layout.stages) << where;
        EXPECT_EQ(loaded.weight_shards, layout.shards) << where;
        EXPECT_EQ(loaded.rng, rng) << where;
        EXPECT_EQ(optimizer->step_count(), 3) << where;
        EXPECT_EQ(host_vectors(params), slices(model, after3)) << where;
        // Every optimizer array, as this layout saves it again.
        const std::string again = checkpointer.save(Space(), *optimizer, params, with_rng);
        expect_same_datasets(again, reference_file, where + ", saved again");
        run(*optimizer, model, params, 3, 4);
        EXPECT_EQ(host_vectors(params), slices(model, after4)) << where << ", one step on";
      }
      remove_directory(dir);
    }
    remove_directory(reference_dir);
  }
  remove_directory(root);
}

// Arrays that several stages hold must combine: one that is not stacked must have one shape on
// every stage, a stacked one the same dimensions but the first. Otherwise every rank throws,
// naming the array and the stages, before the file is made.
TEST(CheckpointStages, StagesWhoseArraysDoNotCombineAreAnErrorOnEveryRank) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs two stages";
  const int stages = world.size() % 2 == 0 ? 2 : world.size();
  const comm::Mesh mesh(MPI_COMM_WORLD, 1, stages);
  const std::string dir = shared_directory("stages-errors");
  checkpoint::Checkpointer checkpointer(mesh, options_in(dir));
  std::vector<std::int64_t> values(64, 7);
  auto expect_everywhere = [&](const checkpoint::ArraySlice& a, const std::string& said) {
    std::string message;
    try {
      checkpointer.save(1, {a}, {});
    } catch (const Error& e) {
      message = e.message();
    }
    EXPECT_EQ(world.allreduce(int(!message.empty()), comm::Combine::min), 1) << said;
    EXPECT_NE(message.find("'" + a.path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("stage 0"), std::string::npos) << message;
    EXPECT_NE(message.find(said), std::string::npos) << message;
  };
  checkpoint::ArraySlice counts;
  counts.path = "training/counts";
  counts.dtype = DType::int64;
  counts.shape = {mesh.stage() + 1};
  counts.writer = mesh.stage_ranks().rank() == 0;
  counts.data = values.data();
  expect_everywhere(counts, "one shape on every stage");
  checkpoint::ArraySlice stacked = counts;
  stacked.path = "optimizer/global/statistics";
  stacked.stacked = true;
  stacked.shape = {2, mesh.stage() + 1, 3};
  expect_everywhere(stacked, "every dimension but the first");
  // Nothing was left behind: a save that combines goes through.
  stacked.shape = {mesh.stage() + 1, 3, 3};
  const std::string file = checkpointer.save(1, {stacked}, {});
  if (world.rank() == 0) {
    const auto summary = checkpoint::describe_checkpoint(file);
    ASSERT_EQ(summary.datasets.size(), 1u);
    EXPECT_EQ(summary.datasets[0].shape, (TensorShape{stages * (stages + 1) / 2, 3, 3}));
  }
  remove_directory(dir);
}

// Ranks and stages that store no statistics: distributed Shampoo hands a rank only the blocks the
// cost split gives it (here one block for several ranks), and a stage of unpreconditioned
// parameters (here the scalar) has none at all. They take part with no rows, and the file is still
// the one-process file.
TEST(CheckpointStages, RanksAndStagesWithoutStatistics) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world == 1) GTEST_SKIP() << "one rank stores every statistic";
  const std::vector<optim::ParameterSpec> specs = {{"kernel", {4, 4}}, {"scale", {}}};
  const std::string root = shared_directory("stages-without");
  const Model whole = whole_model(specs);
  auto reference = make_optimizer(Kind::shampoo_distributed, whole, comm::Mesh());
  const auto reference_params = to_device(initial_values(whole));
  run(*reference, whole, reference_params, 0, 2);
  std::string reference_file;
  if (world_rank() == 0)
    reference_file = checkpoint::Checkpointer(comm::Group(), options_in(root + "/reference"))
                         .save(Space(), *reference, reference_params);
  run(*reference, whole, reference_params, 2, 3);
  const auto after3 = host_vectors(reference_params);

  std::vector<Layout> cases = {{world, 1, 1}};
  if (world % 2 == 0) cases.push_back({world / 2, 2, 1});
  for (const Layout& layout : cases) {
    const comm::Mesh mesh(MPI_COMM_WORLD, layout.shards, layout.stages);
    const Model model = model_of(mesh, specs);
    checkpoint::Checkpointer checkpointer(mesh, options_in(root + "/" + layout.name()));
    std::string file;
    {
      auto optimizer = make_optimizer(Kind::shampoo_distributed, model, mesh);
      const auto params = to_device(initial_values(model));
      run(*optimizer, model, params, 0, 2);
      file = checkpointer.save(Space(), *optimizer, params);
    }
    expect_same_datasets(file, reference_file, layout.name());
    auto optimizer = make_optimizer(Kind::shampoo_distributed, model, mesh);
    const auto params = to_device(initial_values(model));
    checkpointer.restore(Space(), file, *optimizer, params);
    run(*optimizer, model, params, 2, 3);
    EXPECT_EQ(host_vectors(params), slices(model, after3)) << layout.name();
  }
  remove_directory(root);
}

}  // namespace
