// SOAP on bands of whole rows of its blocks spread over the ranks (as optim::soap_shard_layouts
// cuts them and comm::ParameterShards::slices() hands them over: ranks without a block of a small
// parameter, a tensor whose rows merge into one dimension) gives bit for bit the parameters SOAP
// computes on one rank from the whole gradients: every block is the whole tensor's, and
// normalize_grads sums every band's block sums in the whole tensor's block order. Its state
// arrays are rows of SOAP's (one row per block of the whole tensor), which the ranks' rows make
// whole as a checkpoint does, each row written once; restored from them, on the same layout or
// another, it goes on bit for bit; float and quantized state. The same for weight shards' slices.
// A checkpoint of a layout that blocks a tensor otherwise is refused, naming the parameter. A band
// that cuts a block is an error on every rank. Every rank computes the single-rank reference itself.
#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>
#include <lather/optim/sharding.hpp>
#include <lather/optim/soap.hpp>

#include "common/pieces.hpp"
#include "common/row_bands.hpp"
#include "common/state_bytes.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <map>

namespace {

using namespace lather;
using namespace lather::optim;
using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Problem = test::BandedProblem<Mem>;

/// Blocked matrices and a 3-D tensor, a side above max_precond_dim, vectors (precondition_1d), a
/// scalar, and two tensors merged into one dimension (square: 8 rows of 8; pairs: 32 rows of 2).
std::vector<ParameterSpec> specs() {
  return {{"dense", {20, 12}}, {"bias", {13}},     {"slab", {12, 6, 5}}, {"wide", {6, 40}},
          {"scale", {}},       {"square", {8, 8}}, {"tall", {30, 4}},    {"pairs", {32, 2}}};
}

SoapOptions options(bool quantized) {
  SoapOptions o;
  o.best_effort_memory_usage_reduction = quantized;
  o.learning_rate = LearningRateSchedule::constant(0.01);
  o.precondition_frequency = 2;
  o.block_size = 8;
  o.max_precond_dim = 24;  // wide's 40 and tall's 30 get no factor
  o.merge_small_dims_block_size = 64;
  o.precondition_1d = true;
  o.normalize_grads = true;
  o.weight_decay = 0.02;
  return o;
}

std::vector<test::RowBand> bands_of(const comm::Group& group, const SoapOptions& o) {
  std::vector<std::int64_t> units;
  for (const auto& layout : soap_shard_layouts(specs(), o)) units.push_back(layout.unit_rows);
  return test::row_bands(group, specs(), units);
}

void run(Soap<Space, float>& alone, Soap<Space, float>& sharded, const Problem& r, int first, int steps) {
  for (int t = first; t < first + steps; ++t) {
    r.set_gradients(t);
    alone.step(Space(), r.whole);
    sharded.step(Space(), r.mine);
  }
}

/// A checkpoint's arrays, whole, by name.
using Saved = std::map<std::string, std::vector<char>>;

std::size_t row_bytes(const StateArray<Mem>& a) { return std::size_t(a.row_elements()) * size_of(a.dtype); }

/// The rows an array holds: those it lists, else all of them.
std::vector<std::int64_t> rows_of(const StateArray<Mem>& a) {
  if (!a.rows.empty()) return a.rows;
  std::vector<std::int64_t> all(std::size_t(a.shape.empty() ? 1 : a.shape[0]));
  for (std::size_t k = 0; k < all.size(); ++k) all[k] = std::int64_t(k);
  return all;
}

/// Each array named in `listed` (the same list on every rank) as a checkpoint writes it from the
/// ranks' `arrays` (collective): an array held whole from the lowest rank that writes it, else
/// every writer's rows placed by index, each row written by exactly one rank. A rank may hold none
/// of an array (a band without a block of it).
Saved save(const comm::Group& group, const std::vector<StateArray<Mem>>& arrays,
           const std::vector<StateArray<Mem>>& listed) {
  std::map<std::string, const StateArray<Mem>*> mine;
  for (const auto& a : arrays) mine[a.name] = &a;
  Saved out;
  for (const auto& l : listed) {
    if (l.name == "step") continue;
    const auto found = mine.find(l.name);
    const StateArray<Mem>* a = found == mine.end() ? nullptr : found->second;
    if (a) EXPECT_EQ(a->shape, l.shape) << l.name;
    int whole_from = a && a->writer && a->rows.empty() ? group.rank() : group.size();
    whole_from = group.allreduce(whole_from, comm::Combine::min);
    const bool writes = a && a->writer && (!a->rows.empty() || group.rank() == whole_from);
    const std::vector<std::int64_t> rows = writes ? rows_of(*a) : std::vector<std::int64_t>();
    const std::vector<char> bytes = writes ? test::state_bytes(*a) : std::vector<char>();
    const std::size_t size = rows.size(), per_row = row_bytes(l);
    std::vector<std::size_t> counts(std::size_t(group.size()));
    group.allgather(&size, 1, counts.data());
    std::size_t total = 0;
    for (auto c : counts) total += c;
    std::vector<std::int64_t> every_row(total);
    std::vector<char> every_byte(total * per_row);
    group.allgatherv(rows.data(), every_row.data(), counts);
    for (auto& c : counts) c *= per_row;
    group.allgatherv(bytes.data(), every_byte.data(), counts);
    const auto stored = std::size_t(l.shape.empty() ? 1 : l.shape[0]);
    std::vector<int> written(stored, 0);
    auto& whole = out[l.name];
    whole.assign(stored * per_row, 0);
    for (std::size_t k = 0; k < total; ++k) {
      if (every_row[k] < 0 || std::size_t(every_row[k]) >= stored) {
        ADD_FAILURE() << l.name << ": row " << every_row[k] << " of " << stored;
        continue;
      }
      ++written[std::size_t(every_row[k])];
      std::copy_n(every_byte.data() + k * per_row, per_row, whole.data() + std::size_t(every_row[k]) * per_row);
    }
    for (std::size_t r = 0; r < stored; ++r) EXPECT_EQ(written[r], 1) << l.name << " row " << r << " writers";
  }
  return out;
}

/// `optimizer`'s state := its rows of `saved`, as a checkpoint loads them (throws what
/// state_restored throws).
void restore(Soap<Space, float>& optimizer, const Saved& saved, long step) {
  for (const auto& a : optimizer.state_arrays(Space())) {
    if (a.name == "step") continue;
    const auto& whole = saved.at(a.name);
    std::vector<char> mine;
    for (auto r : rows_of(a))
      mine.insert(mine.end(), whole.begin() + std::ptrdiff_t(std::size_t(r) * row_bytes(a)),
                  whole.begin() + std::ptrdiff_t(std::size_t(r + 1) * row_bytes(a)));
    test::fill_state(std::vector<StateArray<Mem>>{a}, {mine});
  }
  optimizer.state_restored(Space(), step);
}

TEST(ShardedSoap, EqualsSoapOnTheWholeParametersAndRestores) {
  const comm::Group world(MPI_COMM_WORLD);
  for (bool quantized : {false, true}) {
    const std::string what = quantized ? "quantized" : "float";
    const auto o = options(quantized);
    const Problem r(specs(), bands_of(world, o));
    Soap<Space, float> alone(Space(), r.whole, o);
    Soap<Space, float> sharded(Space(), r.mine.specs(), o, comm::Group(), world);
    run(alone, sharded, r, 0, 7);
    r.expect_rows_equal(what + ", after 7 steps");

    // The ranks' rows, placed by index, are SOAP's arrays.
    const auto want = alone.state_arrays(Space());
    const Saved saved = save(world, sharded.state_arrays(Space()), want);
    for (const auto& a : want)
      if (a.name != "step") EXPECT_EQ(saved.at(a.name), test::state_bytes(a)) << what << ": " << a.name;
    sharded.state_released();
    alone.state_released();

    // Restored into a fresh optimizer, it goes on as SOAP does.
    Soap<Space, float> restored(Space(), r.mine.specs(), o, comm::Group(), world);
    restore(restored, saved, 7);
    run(alone, restored, r, 7, 5);
    r.expect_rows_equal(what + ", after restoring and 5 more steps");
  }
}

/// Weight shards' slices as lather-train hands them to SOAP, with sharded parameters' bands of
/// them: the ranks are replicas x shards (shard = rank % shards, two on an even group); "dense"
/// and "wide" are cut in columns (axis 1) over the shards, dense's slices in bands of whole block
/// rows over the replicas (pieces cut along two axes), wide's held by every replica alike;
/// "rows" is cut along axis 0 over the shards (a row-parallel slice); the rest are whole. The
/// shapes merge to themselves with their split axis apart or not, so SOAP on the whole parameters
/// reads them as the pieces' reading does, and the pieces hold whole blocks.
std::vector<ParameterSpec> sliced_specs() {
  return {{"dense", {20, 16}}, {"bias", {13}}, {"wide", {6, 48}}, {"scale", {}}, {"rows", {16, 12}}};
}

test::PieceProblem<Mem> slices_of(const comm::Group& group) {
  const int shards = group.size() % 2 == 0 ? 2 : 1, replicas = group.size() / shards;
  const int shard = group.rank() % shards, replica = group.rank() / shards;
  return test::PieceProblem<Mem>(sliced_specs(), {test::Cut::slice(1, shard, shards, 8).rows_of(replica, replicas, 8),
                                                  test::Cut::whole(), test::Cut::slice(1, shard, shards, 8),
                                                  test::Cut::whole(), test::Cut::slice(0, shard, shards, 8)});
}

/// lather-train's layout of the same slices: the replicas of a shard share its blocks (their
/// group), the shards sum their norms, and no slice is cut in bands.
test::PieceProblem<Mem> train_slices_of(int shard, int shards) {
  return test::PieceProblem<Mem>(
      sliced_specs(), {test::Cut::slice(1, shard, shards, 8), test::Cut::whole(), test::Cut::slice(1, shard, shards, 8),
                       test::Cut::whole(), test::Cut::slice(0, shard, shards, 8)});
}

// SOAP on weight shards' slices (and bands of them) steps bit for bit as SOAP on the whole
// parameters: every block is the whole tensor's, and normalize_grads sums every piece's block sums
// over the ranks in the whole tensor's block order, each piece counted once. Its checkpoint is
// SOAP's on the whole parameters, and restored into the same layout, into lather-train's (the
// replicas of a shard sharing its blocks) and into SOAP on the whole parameters, each goes on bit
// for bit as the uninterrupted run; float and quantized state.
TEST(ShardedSoap, EqualsSoapOnWeightShardsSlicesAndRestoresOnOtherLayouts) {
  const comm::Group world(MPI_COMM_WORLD);
  const int shards = world.size() % 2 == 0 ? 2 : 1, shard = world.rank() % shards;
  const comm::Group replicas = world.split(shard, world.rank());
  const comm::Group across = world.split(world.rank() / shards, world.rank());
  for (bool quantized : {false, true}) {
    const std::string what = quantized ? "quantized" : "float";
    const auto o = options(quantized);
    const auto r = slices_of(world);
    Soap<Space, float> alone(Space(), r.whole, o);
    Soap<Space, float> sliced(Space(), r.mine.specs(), o, comm::Group(), world);
    for (int t = 0; t < 7; ++t) {
      r.set_gradients(t);
      alone.step(Space(), r.whole);
      sliced.step(Space(), r.mine);
    }
    r.expect_pieces_equal(what + ", after 7 steps");
    const auto want = alone.state_arrays(Space());
    const Saved saved = save(world, sliced.state_arrays(Space()), want);
    for (const auto& a : want)
      if (a.name != "step") EXPECT_EQ(saved.at(a.name), test::state_bytes(a)) << what << ": " << a.name;
    sliced.state_released();
    alone.state_released();

    const auto other = train_slices_of(shard, shards);
    for (std::size_t p = 0; p < r.whole.size(); ++p) {
      const auto values = r.whole.host_value(Space(), p);
      other.whole.set_value(Space(), p, values);
      other.mine.set_value(Space(), p, other.piece(values, p));
    }
    Soap<Space, float> same_layout(Space(), r.mine.specs(), o, comm::Group(), world);
    Soap<Space, float> train_layout(Space(), other.mine.specs(), o, replicas, across);
    Soap<Space, float> whole(Space(), other.whole, o);
    restore(same_layout, saved, 7);
    restore(train_layout, saved, 7);
    restore(whole, saved, 7);
    for (int t = 7; t < 12; ++t) {
      r.set_gradients(t);
      alone.step(Space(), r.whole);
      same_layout.step(Space(), r.mine);
      other.set_gradients(t);
      whole.step(Space(), other.whole);
      train_layout.step(Space(), other.mine);
    }
    r.expect_pieces_equal(what + ", restored on the same layout, after 5 more steps");
    other.expect_pieces_equal(what + ", restored on lather-train's layout, after 5 more steps");
    for (std::size_t p = 0; p < r.whole.size(); ++p)
      EXPECT_EQ(other.whole.host_value(Space(), p), r.whole.host_value(Space(), p))
          << what << ", restored whole: " << r.whole.spec(p).name;
  }
}

// With weight shards SOAP keeps a slice's split axis apart from the small dimensions merged around
// it: [32, 4, 4, 4] split along axis 1 reads as [32, 4, 16], whole as [32, 16, 4], in as many
// blocks of as many elements (blocks of 2), so every state array has the same shape in both; the
// "blocks" array refuses the other reading's state, naming the parameter, before any is loaded.
TEST(ShardedSoap, AStateBlockedOtherwiseIsRefused) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs two weight shards";
  SoapOptions o = options(false);
  o.block_size = 2;
  o.merge_small_dims_block_size = 16;
  const test::PieceProblem<Mem> r({{"cube", {32, 4, 4, 4}}}, {test::Cut::slice(1, world.rank() % 2, 2, 2)});
  Soap<Space, float> sliced(Space(), r.mine.specs(), o, comm::Group(), world);
  Soap<Space, float> whole(Space(), r.whole, o);
  ASSERT_EQ(sliced.partition(0).shape(), (TensorShape{32, 4, 16}));
  ASSERT_EQ(whole.partition(0).shape(), (TensorShape{32, 16, 4}));
  for (int t = 0; t < 2; ++t) {
    r.set_gradients(t);
    sliced.step(Space(), r.mine);
    whole.step(Space(), r.whole);
  }
  const auto sliced_arrays = sliced.state_arrays(Space());
  const Saved from_slices = save(world, sliced_arrays, sliced_arrays);
  const auto whole_arrays = whole.state_arrays(Space());
  const Saved from_whole = save(comm::Group(), whole_arrays, whole_arrays);  // each rank's own
  for (const auto& [name, bytes] : from_slices) ASSERT_EQ(bytes.size(), from_whole.at(name).size()) << name;
  const auto expect_refused = [](Soap<Space, float>& fresh, const Saved& saved) {
    try {
      restore(fresh, saved, 2);
      ADD_FAILURE() << "restored";
    } catch (const lather::Error& e) {
      EXPECT_NE(std::string(e.what()).find("state of parameter 'cube' (soap/cube/blocks) is blocked otherwise"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(fresh.step_count(), 0);
  };
  Soap<Space, float> fresh_whole(Space(), r.whole, o);
  expect_refused(fresh_whole, from_slices);
  Soap<Space, float> fresh_sliced(Space(), r.mine.specs(), o, comm::Group(), world);
  expect_refused(fresh_sliced, from_whole);
}

TEST(ShardedSoap, ABandThatCutsABlockIsRefusedOnEveryRank) {
  const comm::Group world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs a group";
  // Rows one by one: dense's 20 rows cut between ranks inside a block of 8.
  const auto bands = test::row_bands(world, specs(), std::vector<std::int64_t>(specs().size(), 1));
  try {
    Soap<Space, float> sharded(Space(), test::band_specs(specs(), bands), options(false), comm::Group(), world);
    ADD_FAILURE() << "accepted on rank " << world.rank();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuts its block"), std::string::npos) << e.what();
  }
}

}  // namespace
