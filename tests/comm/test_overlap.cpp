// The reduction overlapped with the backward pass (GradientReducer::start, ready, progress,
// finish) against the blocking reduction of the same inputs with the same options: the same bits,
// whatever order each rank reports its tensors ready in (every rank a different order here), for
// every path a bucket can take (the node-shared window, two-rank pairs, MPI's allreduce, the
// 16-bit wire, Adasum at finish). And its failures: a rank that fails between start() and finish(),
// a fault injected in a bucket's local work, a NaN, a tensor never reported ready are the same
// error on every rank, and nobody waits forever (ctest's timeout).
#include <lather/comm/reduce.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/parameters.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>

namespace {

using lather::comm::GradientReducer;
using lather::comm::ReduceOp;
using lather::comm::ReduceOptions;
using lather::comm::WirePrecision;
using namespace lather::test;

// An empty tensor, single elements, tensors larger than the 4 KiB fusion buffer (their own
// buckets, reduced in place) and one larger than the 1 MiB pieces a mean is scaled in.
const std::vector<std::int64_t> sizes = {1, 7, 0, 300, 1500, 33, 2, 5000, 64, 300000};

/// Every tensor's bits, in list order.
template <class T>
std::vector<T> bits_of(const lather::TensorList<T, Memory>& tensors) {
  std::vector<T> out;
  for (const auto& tensor : tensors) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tensor);
    out.insert(out.end(), host.data(), host.data() + host.extent(0));
  }
  return out;
}

/// The overlapped reduction of `tensors`, reporting them ready one at a time in an order of this
/// rank's own (a shuffle seeded by the rank), with progress() between.
template <class T>
double reduce_overlapped(GradientReducer<Exec, T>& reducer, const lather::TensorList<T, Memory>& tensors, ReduceOp op,
                         double weight) {
  reducer.start(Exec(), tensors, op, weight);
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::mt19937 shuffle(1234u + unsigned(world_rank()));
  std::shuffle(order.begin(), order.end(), shuffle);
  for (const auto t : order) {
    reducer.ready(Exec(), t, t + 1);
    reducer.progress(Exec());
  }
  return reducer.finish(Exec());
}

struct Case {
  bool shared_memory;
  WirePrecision wire;
  bool contiguous;
  ReduceOp op;
};

std::string describe(const Case& c) {
  return "op " + lather::comm::to_string(c.op) + ", wire " + lather::comm::to_string(c.wire) +
         (c.shared_memory ? ", shared memory" : ", MPI") + (c.contiguous ? ", contiguous" : ", separate");
}

/// `rounds` > 1 reduces again with the same reducers: the layout and buffers are reused.
template <class T>
void expect_same_bits_as_blocking(const Case& c, int rounds = 1) {
  const int rank = world_rank();
  ReduceOptions options;
  options.fusion_bytes = 4096;
  options.shared_memory = c.shared_memory;
  options.wire_precision = c.wire;
  options.check_finite = true;
  GradientReducer<Exec, T> blocking(MPI_COMM_WORLD, options), overlapped(MPI_COMM_WORLD, options);
  const double weight = 1.0 + rank % 3;  // weighted mean: ranks weigh differently
  for (int round = 0; round < rounds; ++round) {
    const auto a = c.contiguous ? make_contiguous_inputs<T>(rank, sizes, round) : make_inputs<T>(rank, sizes, round);
    const auto b = c.contiguous ? make_contiguous_inputs<T>(rank, sizes, round) : make_inputs<T>(rank, sizes, round);
    const double expected = blocking.reduce(Exec(), a, c.op, weight);
    const double got = reduce_overlapped(overlapped, b, c.op, weight);
    EXPECT_EQ(got, expected) << describe(c);
    const auto want = bits_of(a), have = bits_of(b);
    ASSERT_EQ(want.size(), have.size());
    ASSERT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(T)), 0)
        << describe(c) << ", round " << round << ": the overlapped reduction's bits differ from the blocking one's";
  }
  EXPECT_FALSE(overlapped.overlapping());
}

template <class T>
class Overlap : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Overlap, Scalars);

TYPED_TEST(Overlap, SumsHaveTheBlockingReductionsBitsInAnyReadyOrder) {
  // The 16-bit wire's kernels take float and double alike: float covers them.
  const bool single = std::is_same<TypeParam, float>::value;
  for (bool shared_memory : {false, true})
    for (WirePrecision wire : {WirePrecision::native, WirePrecision::bfloat16})
      for (bool contiguous : {false, true})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::weighted_mean})
          if (single || wire == WirePrecision::native)
            expect_same_bits_as_blocking<TypeParam>({shared_memory, wire, contiguous, op},
                                                    op == ReduceOp::mean && contiguous ? 2 : 1);
}

TEST(Overlap, AdasumWaitsForFinishAndHasTheBlockingBits) {
  for (ReduceOp op : {ReduceOp::adasum, ReduceOp::adasum_approx})
    for (bool contiguous : {false, true})
      expect_same_bits_as_blocking<double>({false, WirePrecision::native, contiguous, op});
}

TEST(Overlap, PlacedGradientsHaveTheBlockingBits) {
  // A ParameterList's gradients in the reducer's node-shared window (lather-train's layout):
  // every bucket is summed where it lies, at its own offset.
  using T = float;
  const int rank = world_rank();
  const std::vector<std::int64_t> parameter_sizes = {1, 7, 300, 1500, 33, 2, 5000, 64, 300000};  // none empty
  std::vector<lather::ParameterSpec> specs;
  for (std::size_t t = 0; t < parameter_sizes.size(); ++t)
    specs.push_back({"p" + std::to_string(t), {parameter_sizes[t]}});
  ReduceOptions options;
  options.fusion_bytes = 4096;
  GradientReducer<Exec, T> blocking(MPI_COMM_WORLD, options), overlapped(MPI_COMM_WORLD, options);
  lather::ParameterList<T, Memory> a(Exec(), specs), b(Exec(), specs);
  for (auto* pair : {&a, &b}) {
    auto& reducer = pair == &a ? blocking : overlapped;
    const auto storage = reducer.shared_gradient_storage(std::int64_t(pair->gradient_buffer().extent(0)));
    if (storage.data() != nullptr) pair->place_gradients(Exec(), storage);
    const auto inputs = make_inputs<T>(rank, parameter_sizes);
    for (std::size_t t = 0; t < parameter_sizes.size(); ++t) Kokkos::deep_copy(pair->gradient(t), inputs[t]);
  }
  blocking.mean(Exec(), a.gradients());
  reduce_overlapped(overlapped, b.gradients(), ReduceOp::mean, 1.0);
  const auto want = bits_of(a.gradients()), have = bits_of(b.gradients());
  ASSERT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(T)), 0);
}

TEST(Overlap, TensorsReadyInReverseStartBucketsDuringTheBackward) {
  // The models' order: the last tensor first. Every bucket but the first has started (and, on
  // one rank, finished) before finish(); the transfers counted are the blocking reduction's.
  const int n = world_size(), rank = world_rank();
  ReduceOptions options;
  options.fusion_bytes = 4096;
  options.shared_memory = false;
  GradientReducer<Exec, float> blocking(MPI_COMM_WORLD, options), overlapped(MPI_COMM_WORLD, options);
  const auto a = make_inputs<float>(rank, sizes), b = make_inputs<float>(rank, sizes);
  blocking.mean(Exec(), a);
  overlapped.start(Exec(), b, ReduceOp::mean);
  for (std::size_t t = sizes.size(); t-- > 0;) overlapped.ready(Exec(), t, t + 1);
  const auto before_finish = overlapped.statistics();
  overlapped.finish(Exec());
  if (n > 1) EXPECT_GT(before_finish.data_messages, 0) << "no bucket started before finish()";
  EXPECT_EQ(overlapped.statistics().data_messages, blocking.statistics().data_messages);
  EXPECT_EQ(overlapped.statistics().bytes, blocking.statistics().bytes);
}

void throw_in_bucket_on_last_rank(const char* point) {
  if (std::strcmp(point, "reduce.overlapped") == 0 && world_rank() == world_size() - 1)
    throw lather::Error("injected failure in a bucket", nullptr, 0);
}

TEST(Overlap, AFailureOnOneRankIsAnErrorOnEveryRankAndTheReducerGoesOn) {
  const int n = world_size(), rank = world_rank();
  for (bool shared_memory : {false, true}) {
    ReduceOptions options;
    options.fusion_bytes = 4096;
    options.shared_memory = shared_memory;
    options.check_finite = true;
    GradientReducer<Exec, float> reducer(MPI_COMM_WORLD, options);
    const std::string where = n > 1 ? " (on group rank " + std::to_string(n - 1) : "";
    // The last rank's backward fails half-way: it reports its failure to finish().
    {
      const auto g = make_inputs<float>(rank, sizes);
      reducer.start(Exec(), g, ReduceOp::mean);
      const std::size_t stop = rank == n - 1 ? sizes.size() / 2 : 0;
      for (std::size_t t = sizes.size(); t-- > stop;) reducer.ready(Exec(), t, t + 1);
      expect_error([&] { reducer.finish(Exec(), rank == n - 1 ? "backward failed" : ""); }, "backward failed" + where);
    }
    // A bucket's local work fails on the last rank.
    {
      const auto g = make_inputs<float>(rank, sizes);
      lather::Impl::set_fault_hook(&throw_in_bucket_on_last_rank);
      expect_error([&] { reduce_overlapped(reducer, g, ReduceOp::sum, 1.0); }, "injected failure in a bucket" + where);
      lather::Impl::set_fault_hook(nullptr);
    }
    // A NaN in the last rank's gradients (check_finite), named with its tensor.
    {
      const auto g = make_inputs<float>(rank, sizes);
      if (rank == n - 1) Kokkos::deep_copy(Kokkos::subview(g[7], std::make_pair(3, 4)), std::nanf(""));
      expect_error([&] { reduce_overlapped(reducer, g, ReduceOp::mean, 1.0); }, "tensor 7 (5000 elements) holds 1 NaN");
    }
    // The last rank never reports tensor 4.
    {
      const auto g = make_inputs<float>(rank, sizes);
      reducer.start(Exec(), g, ReduceOp::sum);
      for (std::size_t t = 0; t < sizes.size(); ++t)
        if (!(rank == n - 1 && t == 4)) reducer.ready(Exec(), t, t + 1);
      expect_error([&] { reducer.finish(Exec()); }, "tensor 4 was never reported ready");
    }
    // Then the reducer reduces as if nothing had happened.
    const auto a = make_inputs<float>(rank, sizes), b = make_inputs<float>(rank, sizes);
    GradientReducer<Exec, float> fresh(MPI_COMM_WORLD, options);
    fresh.mean(Exec(), a);
    reduce_overlapped(reducer, b, ReduceOp::mean, 1.0);
    const auto want = bits_of(a), have = bits_of(b);
    ASSERT_EQ(std::memcmp(want.data(), have.data(), want.size() * sizeof(float)), 0);
  }
}

TEST(Overlap, MisuseIsRefused) {
  GradientReducer<Exec, float> reducer(MPI_COMM_WORLD);
  const auto g = make_inputs<float>(world_rank(), sizes);
  expect_error([&] { reducer.ready(Exec(), 0, 1); }, "no overlapped reduction in flight");
  expect_error([&] { reducer.finish(Exec()); }, "no overlapped reduction in flight");
  reducer.start(Exec(), g, ReduceOp::sum);
  expect_error([&] { reducer.sum(Exec(), g); }, "an overlapped reduction is in flight");
  expect_error([&] { reducer.ready(Exec(), 3, 11); }, "tensors [3, 11) of a list of 10");
  reducer.ready(Exec(), 0, sizes.size());
  reducer.finish(Exec());
}

}  // namespace
