// Gradient accumulation against the big batch: K micro-batches per rank reduced once must equal
// the reduction of all n K micro-batches at once, computed plainly on every rank.
#include <lather/comm/accumulate.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace {

using lather::comm::AccumulationMode;
using lather::comm::GradientAccumulator;
using namespace lather::test;

template <class T>
class Accumulate : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Accumulate, Scalars);

const std::vector<std::int64_t> sizes = {3, 250, 1};
constexpr int micro_batches = 3;

/// Micro-batch k of rank r: salt k, so every (rank, micro-batch) has its own gradient.
template <class T>
double micro_value(int r, int k, int t, std::int64_t i) {
  return stored_input<T>(r, t, i, 100 + k);
}

double tokens_of(int r, int k) { return double(1 + r + 2 * k); }

// Accumulating K values of <= 1 (scaled by 1/K) rounds K times, the reduction n times more:
// |error| <= (K + n) * eps * (sum of magnitudes <= n K); we allow 2 (K + n) n K eps.
template <class T>
double tolerance(int n) {
  return 2.0 * (micro_batches + n) * n * micro_batches * std::numeric_limits<T>::epsilon();
}

TYPED_TEST(Accumulate, MeanOfMicroBatchesEqualsTheBigBatch) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  GradientAccumulator<Exec, T> accumulator(MPI_COMM_WORLD, micro_batches);
  const auto gradients = make_inputs<T>(rank, sizes, 99);  // overwritten by reduce()
  for (int cycle = 0; cycle < 2; ++cycle) {                // the second cycle reuses the accumulators
    for (int k = 0; k < micro_batches; ++k) accumulator.accumulate(Exec(), make_inputs<T>(rank, sizes, 100 + k));
    EXPECT_EQ(accumulator.reduce(Exec(), gradients), double(n * micro_batches));
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto got = read_view(gradients[t]);
      for (std::int64_t i = 0; i < sizes[t]; ++i) {
        double big_batch = 0;  // mean over all n K micro-batch gradients
        for (int r = 0; r < n; ++r)
          for (int k = 0; k < micro_batches; ++k) big_batch += micro_value<T>(r, k, int(t), i);
        ASSERT_NEAR(got[i], big_batch / (n * micro_batches), tolerance<T>(n)) << "t " << t << " i " << i;
      }
    }
  }
}

TYPED_TEST(Accumulate, TokenWeightedEqualsTheBigBatchTokenMean) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  GradientAccumulator<Exec, T> accumulator(MPI_COMM_WORLD, micro_batches, AccumulationMode::token_weighted);
  for (int k = 0; k < micro_batches; ++k)
    accumulator.accumulate(Exec(), make_inputs<T>(rank, sizes, 100 + k), tokens_of(rank, k));
  const auto gradients = make_inputs<T>(rank, sizes, 99);
  double all_tokens = 0;
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < micro_batches; ++k) all_tokens += tokens_of(r, k);
  EXPECT_EQ(accumulator.reduce(Exec(), gradients), all_tokens);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto got = read_view(gradients[t]);
    for (std::int64_t i = 0; i < sizes[t]; ++i) {
      double token_sum = 0;  // the micro-batch gradients are sums over their tokens
      for (int r = 0; r < n; ++r)
        for (int k = 0; k < micro_batches; ++k) token_sum += micro_value<T>(r, k, int(t), i);
      ASSERT_NEAR(got[i], token_sum / all_tokens, tolerance<T>(n)) << "t " << t << " i " << i;
    }
  }
}

TEST(AccumulateErrors, CountMismatchesAreClearErrors) {
  using T = float;
  const int n = world_size(), rank = world_rank();
  GradientAccumulator<Exec, T> accumulator(MPI_COMM_WORLD, micro_batches);
  const auto gradients = make_inputs<T>(rank, sizes);
  // A step before K micro-batches: an error on every rank.
  accumulator.accumulate(Exec(), gradients);
  expect_error([&] { accumulator.reduce(Exec(), gradients); }, "accumulated micro-batches must be 3 on every rank");
  // One rank short while the others are complete: still an error on every rank, not a hang.
  for (int k = 1; k < micro_batches - (rank == n - 1 ? 1 : 0); ++k) accumulator.accumulate(Exec(), gradients);
  expect_error([&] { accumulator.reduce(Exec(), gradients); }, "accumulated micro-batches");
  // More than K: refused locally, before anything is communicated.
  if (rank == n - 1) accumulator.accumulate(Exec(), gradients);
  expect_error([&] { accumulator.accumulate(Exec(), gradients); }, "micro-batch 4 of a cycle of 3");
  // Shapes must stay those of the first micro-batch of the cycle.
  accumulator.reset();
  accumulator.accumulate(Exec(), gradients);
  expect_error(
      [&] {
        accumulator.accumulate(Exec(), make_inputs<T>(rank, {3, 251, 1}));
      },
      "tensor 1 of micro-batch 2 has 251 elements");
  expect_error([] { GradientAccumulator<Exec, T>(MPI_COMM_WORLD, 0); }, "micro_batches must be >= 1");
}

}  // namespace
