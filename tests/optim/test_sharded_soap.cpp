// SOAP on bands of whole rows of its blocks spread over the ranks (as optim::soap_shard_layouts
// cuts them and comm::ParameterShards::slices() hands them over: ranks without a block of a small
// parameter, a tensor whose rows merge into one dimension) gives bit for bit the parameters SOAP
// computes on one rank from the whole gradients: every block is the whole tensor's, and
// normalize_grads sums every band's block sums in the whole tensor's block order. Its state
// arrays are its blocks' parts of SOAP's, which the ranks' parts make whole one after the other
// in rank order; restored from them, it goes on bit for bit; float and quantized state. A band
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

/// Each array of `whole` from every rank's part of it, as a sharded checkpoint assembles it: the
/// lowest rank's that holds all of it (a replicated scalar's), else the parts one after the other
/// in rank order (collective).
std::map<std::string, std::vector<char>> joined(const comm::Group& group, const std::vector<StateArray<Mem>>& parts,
                                                const std::vector<StateArray<Mem>>& whole) {
  std::map<std::string, std::vector<char>> mine, out;
  for (const auto& a : parts) mine[a.name] = test::state_bytes(a);
  for (const auto& a : whole) {
    const auto& part = mine[a.name];
    std::vector<std::size_t> sizes(std::size_t(group.size()));
    const std::size_t size = part.size(), wanted = test::state_bytes(a).size();
    group.allgather(&size, 1, sizes.data());
    std::vector<std::size_t> offsets(1, 0);
    for (auto s : sizes) offsets.push_back(offsets.back() + s);
    std::vector<char> all(offsets.back());
    group.allgatherv(part.data(), all.data(), sizes);
    const auto whole_on = std::find(sizes.begin(), sizes.end(), wanted);
    if (offsets.back() != wanted && whole_on != sizes.end()) {
      const auto r = std::size_t(whole_on - sizes.begin());
      all = std::vector<char>(all.begin() + std::ptrdiff_t(offsets[r]), all.begin() + std::ptrdiff_t(offsets[r + 1]));
    }
    out[a.name] = all;
  }
  return out;
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

    // The ranks' parts, joined in rank order, are SOAP's arrays.
    const auto want = alone.state_arrays(Space());
    const auto got = sharded.state_arrays(Space());
    const auto whole = joined(world, got, want);
    for (const auto& a : want)
      if (a.name != "step") EXPECT_EQ(whole.at(a.name), test::state_bytes(a)) << what << ": " << a.name;
    std::vector<std::vector<char>> saved;
    for (const auto& a : got) saved.push_back(test::state_bytes(a));
    sharded.state_released();

    // Restored into a fresh optimizer, it goes on as SOAP does.
    Soap<Space, float> restored(Space(), r.mine.specs(), o, comm::Group(), world);
    test::fill_state(restored.state_arrays(Space()), saved);
    restored.state_restored(Space(), 7);
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

// SOAP on weight shards' slices (and bands of them) steps bit for bit as SOAP on the whole
// parameters: every block is the whole tensor's, and normalize_grads sums every piece's block sums
// over the ranks in the whole tensor's block order, each piece counted once. Its state cannot be
// checkpointed yet: state_arrays refuses, naming the parameter.
TEST(ShardedSoap, EqualsSoapOnWeightShardsSlices) {
  const comm::Group world(MPI_COMM_WORLD);
  const auto o = options(false);
  const auto r = slices_of(world);
  Soap<Space, float> alone(Space(), r.whole, o);
  Soap<Space, float> sliced(Space(), r.mine.specs(), o, comm::Group(), world);
  for (int t = 0; t < 7; ++t) {
    r.set_gradients(t);
    alone.step(Space(), r.whole);
    sliced.step(Space(), r.mine);
  }
  r.expect_pieces_equal("after 7 steps");
  if (world.size() % 2 != 0) return;  // one shard: no slices
  try {
    (void)sliced.state_arrays(Space());
    ADD_FAILURE() << "no error on rank " << world.rank();
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'dense' is a weight shard's slice"), std::string::npos) << e.what();
  }
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
