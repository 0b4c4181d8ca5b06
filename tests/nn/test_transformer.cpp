// The sharded transformer against two references: central finite differences of its own loss (in
// double, on 1 and 2 shards: every parameter kind, so the embedding, LayerNorms, attention, the
// GELU MLP and the vocabulary-parallel cross-entropy with its z-loss are each checked through the
// sharded composition), and the same model unsharded on one process (a sharded run equals it).
#include <lather/comm/mesh.hpp>
#include <lather/core/error.hpp>
#include <lather/nn/transformer.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Memory = Exec::memory_space;
using Model = lather::nn::Transformer<Exec, double>;

lather::nn::TransformerConfig tiny() {
  lather::nn::TransformerConfig c;
  c.vocab_size = 11;  // uneven over 2 shards: 6 + 5
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.block_size = 6;
  c.z_loss = 1e-2;  // large enough to matter in the gradient
  return c;
}

struct Batch {
  int batch = 2, time = 5;
  Model::Tokens inputs, targets;
};

Batch make_batch(int vocab) {
  Batch b;
  const int n = b.batch * b.time;
  b.inputs = Model::Tokens("inputs", n);
  b.targets = Model::Tokens("targets", n);
  auto hi = Kokkos::create_mirror_view(b.inputs);
  auto ht = Kokkos::create_mirror_view(b.targets);
  std::mt19937 rng(7);
  for (int i = 0; i < n; ++i) hi(i) = int(rng() % unsigned(vocab)), ht(i) = int(rng() % unsigned(vocab));
  Kokkos::deep_copy(b.inputs, hi);
  Kokkos::deep_copy(b.targets, ht);
  return b;
}

double total_loss(const lather::nn::LanguageModelSums& s) { return s.loss + s.z_loss; }

std::vector<double> host(const Kokkos::View<double*, Memory>& v) {
  std::vector<double> out(v.extent(0));
  Kokkos::deep_copy(Kokkos::View<double*, Kokkos::HostSpace>(out.data(), out.size()), v);
  return out;
}

void set_entry(const Kokkos::View<double*, Memory>& v, std::size_t k, double value) {
  Kokkos::deep_copy(Kokkos::subview(v, k), value);
}

// Central differences: error O(h^2 f''') ~ 1e-10 for O(1) third derivatives at h = 1e-5, rounding
// O(eps |L| / h) ~ 5e-10 for |L| ~ 25; a wrong gradient term is off by O(1e-3) or more.
TEST(Transformer, GradientsMatchCentralDifferencesOnEveryShardCount) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world > 2) GTEST_SKIP() << "1 or 2 shards";
  const lather::comm::Mesh mesh(MPI_COMM_WORLD, world);
  const auto config = tiny();
  Model model(Exec(), config, 3, mesh);
  const Batch b = make_batch(config.vocab_size);
  model.train_batch(Exec(), b.batch, b.time, b.inputs, b.targets, false);
  const auto& params = model.parameters();
  std::vector<std::vector<double>> analytic;
  for (std::size_t i = 0; i < params.size(); ++i) analytic.push_back(host(params.gradient(i)));
  // accumulate=true adds a second batch's gradient: twice the same batch doubles it.
  model.train_batch(Exec(), b.batch, b.time, b.inputs, b.targets, true);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto twice = host(params.gradient(i));
    for (std::size_t k = 0; k < twice.size(); ++k)
      ASSERT_NEAR(twice[k], 2 * analytic[i][k], 1e-12) << params.spec(i).name;
  }
  const double h = 1e-5;
  int checked = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& spec = params.spec(i);
    const auto value = params.value(i);
    const auto original = host(value);
    // A split tensor's entries differ per shard: one shard perturbs at a time. A replicated one is
    // perturbed on every shard at once (its copies are tied), which is what the gradient means.
    const int turns = spec.split() ? mesh.weight_shards() : 1;
    for (int turn = 0; turn < turns; ++turn) {
      const bool mine = !spec.split() || turn == mesh.shard();
      for (std::size_t pick = 0; pick < 3; ++pick) {
        // Spread the probes: first, middle and last entry of this shard's part.
        const std::size_t n = original.size();
        const std::size_t k = n == 0 ? 0 : (pick == 0 ? 0 : pick == 1 ? n / 2 : n - 1);
        const bool perturb = mine && n > 0;
        if (perturb) set_entry(value, k, original[k] + h);
        const double up = total_loss(model.evaluate(Exec(), b.batch, b.time, b.inputs, b.targets));
        if (perturb) set_entry(value, k, original[k] - h);
        const double down = total_loss(model.evaluate(Exec(), b.batch, b.time, b.inputs, b.targets));
        if (perturb) set_entry(value, k, original[k]);
        if (!perturb) continue;
        const double numeric = (up - down) / (2 * h);
        EXPECT_NEAR(analytic[i][k], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
            << spec.name << " entry " << k << " on shard " << mesh.shard() << " of " << mesh.weight_shards();
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, int(params.size()) * 3 - 6);  // a shard may hold no position columns or tokens
}

// Two shards compute what one process computes with the whole model: losses and every gradient
// slice, in double to 1e-12 relative (only the summation order of the shard sums differs).
TEST(Transformer, ShardedEqualsUnsharded) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 2) GTEST_SKIP() << "two shards against one process";
  const lather::comm::Mesh mesh(MPI_COMM_WORLD, 2);
  auto config = tiny();
  config.vocab_size = 13;
  Model sharded(Exec(), config, 5, mesh);
  Model whole(Exec(), config, 5);
  const Batch b = make_batch(config.vocab_size);
  const auto s = sharded.train_batch(Exec(), b.batch, b.time, b.inputs, b.targets, false);
  const auto w = whole.train_batch(Exec(), b.batch, b.time, b.inputs, b.targets, false);
  EXPECT_NEAR(s.loss, w.loss, 1e-12 * std::abs(w.loss));
  EXPECT_NEAR(s.z_loss, w.z_loss, 1e-12 * std::abs(w.z_loss) + 1e-15);
  EXPECT_EQ(s.correct, w.correct);
  EXPECT_EQ(s.tokens, w.tokens);
  for (std::size_t i = 0; i < sharded.parameters().size(); ++i) {
    const auto& spec = sharded.parameters().spec(i);
    ASSERT_EQ(spec.name, whole.parameters().spec(i).name);
    const auto mine = host(sharded.parameters().gradient(i));
    const auto all = host(whole.parameters().gradient(i));
    const auto& global = spec.global();
    const std::int64_t columns = global.size() > 1 ? global[1] : 1;
    const std::int64_t local_columns = spec.shape.size() > 1 ? spec.shape[1] : 1;
    const std::int64_t row0 = spec.split_axis == 0 ? spec.split_offset : 0;
    const std::int64_t col0 = spec.split_axis == 1 ? spec.split_offset : 0;
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const std::int64_t r = std::int64_t(k) / local_columns, c = std::int64_t(k) % local_columns;
      const double expected = all[std::size_t((row0 + r) * columns + col0 + c)];
      ASSERT_NEAR(mine[k], expected, 1e-12 * std::max(1.0, std::abs(expected))) << spec.name << " entry " << k;
    }
  }
  // Sampling sees the whole vocabulary on every shard.
  const auto logits_sharded = sharded.next_token_logits(Exec(), {1, 2, 3});
  const auto logits_whole = whole.next_token_logits(Exec(), {1, 2, 3});
  ASSERT_EQ(logits_sharded.size(), std::size_t(config.vocab_size));
  for (int v = 0; v < config.vocab_size; ++v) EXPECT_NEAR(logits_sharded[v], logits_whole[v], 1e-12) << v;
}

TEST(Transformer, BadConfigurationsNameTheField) {
  auto c = tiny();
  c.d_model = 9;
  EXPECT_THROW(c.validate(), lather::Error);
  c = tiny();
  try {
    c.validate(3);
    FAIL() << "3 shards cannot split 2 heads";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find("must divide n_head 2"), std::string::npos) << e.message();
  }
  // Parameter count against the list the model allocates (one process: the whole model).
  Model model(Exec(), tiny(), 1);
  std::int64_t total = 0;
  for (const auto& spec : model.parameter_specs()) total += lather::element_count(spec.shape);
  EXPECT_EQ(total, tiny().parameter_count());
}

}  // namespace

namespace {

using lather::nn::PipelineAction;
using lather::nn::PipelineSchedule;

// Every stage's actions: each micro-batch forward once and backward once after it, backwards in
// micro-batch order, never more micro-batches alive than the slots, no slot reused while alive;
// 1F1B's first stage keeps min(P, M) alive; the bound is (P - 1) / (M + P - 1).
TEST(PipelineSchedule, ActionsKeepTheirPromises) {
  for (const auto schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_forward_one_backward})
    for (int stages = 1; stages <= 5; ++stages)
      for (int stage = 0; stage < stages; ++stage)
        for (int micro_batches = 1; micro_batches <= 9; ++micro_batches) {
          const auto actions = lather::nn::pipeline_actions(schedule, stages, stage, micro_batches);
          const int slots = lather::nn::activation_slots(schedule, stages, stage, micro_batches);
          ASSERT_EQ(actions.size(), 2u * std::size_t(micro_batches));
          std::vector<int> slot_of(std::size_t(micro_batches), -1);
          std::vector<int> occupant(std::size_t(slots), -1);
          int next_backward = 0, alive = 0, most_alive = 0;
          for (const auto& a : actions) {
            ASSERT_GE(a.slot, 0);
            ASSERT_LT(a.slot, slots);
            if (a.kind == PipelineAction::Kind::forward) {
              ASSERT_EQ(slot_of[std::size_t(a.micro_batch)], -1) << "forward twice";
              ASSERT_EQ(occupant[std::size_t(a.slot)], -1) << "slot " << a.slot << " still holds a micro-batch";
              slot_of[std::size_t(a.micro_batch)] = a.slot;
              occupant[std::size_t(a.slot)] = a.micro_batch;
              most_alive = std::max(most_alive, ++alive);
            } else {
              ASSERT_EQ(a.micro_batch, next_backward++) << "backwards in micro-batch order";
              ASSERT_EQ(slot_of[std::size_t(a.micro_batch)], a.slot) << "backward before its forward";
              occupant[std::size_t(a.slot)] = -1;
              --alive;
            }
          }
          EXPECT_EQ(most_alive, slots);
          if (schedule == PipelineSchedule::one_forward_one_backward)
            EXPECT_EQ(slots, std::min(stages - stage, micro_batches));
        }
  EXPECT_DOUBLE_EQ(lather::nn::bubble_bound(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(lather::nn::bubble_bound(1, 8), 0.0);
  // Against the longest schedule (5 s): 1 - 3/5 and 1 - 4/5.
  const auto idle = lather::nn::stage_idle_fractions({3.0, 4.0}, {5.0, 4.0});
  ASSERT_EQ(idle.size(), 2u);
  EXPECT_DOUBLE_EQ(idle[0], 0.4);
  EXPECT_DOUBLE_EQ(idle[1], 0.2);
  EXPECT_THROW(lather::nn::parse_pipeline_schedule("interleaved"), lather::Error);
}

// The split minimises the largest stage's cost by exhaustive comparison over every split.
TEST(PipelineSchedule, LayersSplitByCost) {
  auto config = tiny();
  config.vocab_size = 4096;  // a head worth half a block or more at this width
  config.d_model = 16;
  for (int layers = 1; layers <= 7; ++layers) {
    config.n_layer = layers;
    const double block = 6.0 * 12.0 * 16 * 16 + 12.0 * 16 * config.block_size, head = 6.0 * 16 * 4096;
    for (int stages = 1; stages <= layers; ++stages) {
      const auto split = lather::nn::split_layers(config, stages);
      ASSERT_EQ(int(split.size()), stages);
      const auto largest = [&](const std::vector<int>& ends) {
        double worst = 0;
        for (int s = 0, first = 0; s < stages; first = ends[std::size_t(s)], ++s)
          worst = std::max(worst, (ends[std::size_t(s)] - first) * block + (s == stages - 1 ? head : 0));
        return worst;
      };
      std::vector<int> ends;
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(split[std::size_t(s)].first, s == 0 ? 0 : split[std::size_t(s - 1)].end);
        EXPECT_GT(split[std::size_t(s)].end, split[std::size_t(s)].first);
        ends.push_back(split[std::size_t(s)].end);
      }
      EXPECT_EQ(ends.back(), layers);
      // Every split into non-empty consecutive ranges (stages - 1 cut points among layers - 1).
      double best = 1e300;
      for (unsigned mask = 0; mask < (1u << (layers - 1)); ++mask) {
        if (__builtin_popcount(mask) != stages - 1) continue;
        std::vector<int> cuts;
        for (int k = 0; k < layers - 1; ++k)
          if (mask & (1u << k)) cuts.push_back(k + 1);
        cuts.push_back(layers);
        best = std::min(best, largest(cuts));
      }
      EXPECT_DOUBLE_EQ(largest(ends), best) << layers << " layers on " << stages << " stages";
    }
  }
  config.n_layer = 2;
  EXPECT_THROW(lather::nn::split_layers(config, 3), lather::Error);
}

// P stages compute, in double, exactly what one process computes running the same micro-batches
// as gradient accumulation: every gradient of every stage's tensors, the loss sums, evaluation and
// the next token's logits on every stage (the same arithmetic; only where it runs differs).
TEST(Transformer, PipelineStagesEqualOneProcess) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2 || world > 4) GTEST_SKIP() << "2 to 4 stages";
  auto config = tiny();
  config.n_layer = 4;
  const lather::comm::Mesh mesh(MPI_COMM_WORLD, 1, world);
  Model staged(Exec(), config, 5, mesh);
  Model whole(Exec(), config, 5);
  std::vector<Batch> batches;
  std::vector<Model::MicroBatch> micro;
  for (int m = 0; m < 3; ++m) {
    batches.push_back(make_batch(config.vocab_size));
    // Different tokens per micro-batch: shift them.
    auto hi = Kokkos::create_mirror_view(batches.back().inputs);
    Kokkos::deep_copy(hi, batches.back().inputs);
    for (std::size_t i = 0; i < hi.extent(0); ++i) hi(i) = (hi(i) + m) % config.vocab_size;
    Kokkos::deep_copy(batches.back().inputs, hi);
    micro.push_back({batches.back().batch, batches.back().time, batches.back().inputs, batches.back().targets});
  }
  const auto reference = whole.train_micro_batches(Exec(), PipelineSchedule::gpipe, micro, false);
  for (const auto schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_forward_one_backward}) {
    lather::nn::PipelineTimes times;
    const auto sums = staged.train_micro_batches(Exec(), schedule, micro, false, &times);
    EXPECT_EQ(times.events.size(), 6u);
    EXPECT_LE(times.busy, times.seconds);
    if (mesh.last_stage()) {
      EXPECT_EQ(sums.loss, reference.loss);
      EXPECT_EQ(sums.tokens, reference.tokens);
    } else {
      EXPECT_EQ(sums.tokens, 0);
    }
    const auto& mine = staged.parameters();
    const auto& all = whole.parameters();
    int matched = 0;
    for (std::size_t i = 0; i < mine.size(); ++i)
      for (std::size_t j = 0; j < all.size(); ++j)
        if (all.spec(j).name == mine.spec(i).name) {
          EXPECT_EQ(host(mine.value(i)), host(all.value(j))) << mine.spec(i).name;
          EXPECT_EQ(host(mine.gradient(i)), host(all.gradient(j))) << mine.spec(i).name;
          ++matched;
        }
    EXPECT_EQ(matched, int(mine.size()));
  }
  const auto evaluated = staged.evaluate(Exec(), micro[1].batch, micro[1].time, micro[1].inputs, micro[1].targets);
  const auto expected = whole.evaluate(Exec(), micro[1].batch, micro[1].time, micro[1].inputs, micro[1].targets);
  if (mesh.last_stage()) EXPECT_EQ(evaluated.loss, expected.loss);
  EXPECT_EQ(staged.next_token_logits(Exec(), {1, 2, 3}), whole.next_token_logits(Exec(), {1, 2, 3}));
  const auto memory = staged.memory();
  EXPECT_GT(memory.kept_activations, 0);
  EXPECT_LT(memory.kept_activations, memory.activations);
}

}  // namespace
