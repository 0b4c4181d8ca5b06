// Sum, mean and token-weighted mean over the world, against references computed on every rank
// from every rank's inputs (input_value is a function of (rank, tensor, index), so each rank can
// generate all of them); fusion bucket counts; agreement errors on every rank; 16-bit wires.
#include <lather/comm/reduce.hpp>
#include <lather/core/parameters.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace {

using lather::comm::GradientReducer;
using lather::comm::ReduceOptions;
using lather::comm::WirePrecision;
using namespace lather::test;

template <class T>
class Reduce : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Reduce, Scalars);

// Sizes with an empty tensor, single elements, tensors larger than a 4 KiB fusion buffer and one
// larger than the 1 MiB pieces a mean is scaled in.
const std::vector<std::int64_t> mixed_sizes = {1, 7, 0, 300, 1500, 33, 2, 5000, 64, 300000};

/// sum_r input(r, t, i) in double over the stored (rounded) inputs.
template <class T>
double reference_sum(int ranks, int t, std::int64_t i, int salt = 0) {
  double total = 0;
  for (int r = 0; r < ranks; ++r) total += stored_input<T>(r, t, i, salt);
  return total;
}

/// MPI sums n values of magnitude <= 1 in T, in some order: each partial sum rounds with relative
/// error <= eps/2, so |error| <= (n - 1) * eps/2 * n; we allow n * n * eps (and 1 ulp of the mean).
template <class T>
double sum_tolerance(int n) {
  return double(n) * n * std::numeric_limits<T>::epsilon() + std::numeric_limits<T>::epsilon();
}

TYPED_TEST(Reduce, SumAndMeanEqualTheReferenceForEveryFusionSize) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  // A 4 KiB fusion buffer: several buckets, and tensors larger than a bucket reduced in place;
  // tensors allocated one by one (packed into the fusion buffer) and one after the other in one
  // buffer (reduced where they are, the mean scaled piece by piece).
  // Through MPI and (the default, all ranks here sharing one node) through the node-shared window.
  for (bool shared_memory : {false, true})
    for (std::size_t fusion_bytes : {std::size_t(4096)})
      for (bool contiguous : {false, true}) {
        ReduceOptions options;
        options.fusion_bytes = fusion_bytes;
        options.shared_memory = shared_memory;
        GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
        for (bool mean : {false, true}) {
          const auto tensors =
              contiguous ? make_contiguous_inputs<T>(rank, mixed_sizes) : make_inputs<T>(rank, mixed_sizes);
          if (mean)
            reducer.mean(Exec(), tensors);
          else
            reducer.sum(Exec(), tensors);
          for (std::size_t t = 0; t < mixed_sizes.size(); ++t) {
            const auto got = read_view(tensors[t]);
            for (std::int64_t i = 0; i < mixed_sizes[t]; ++i) {
              const double expected = reference_sum<T>(n, int(t), i) / (mean ? n : 1);
              ASSERT_NEAR(got[i], expected, sum_tolerance<T>(n))
                  << (mean ? "mean" : "sum") << " tensor " << t << " index " << i << " fusion " << fusion_bytes
                  << (contiguous ? " contiguous" : " separate") << (shared_memory ? " shared memory" : " MPI");
            }
          }
        }
      }
}

// Every rank ends with the same bits, whichever rank summed an element (on two ranks each sums
// half of every piece and sends it back): odd lengths, a single element, more than one piece.
TYPED_TEST(Reduce, MeanLeavesTheSameBitsOnEveryRank) {
  using T = TypeParam;
  const int rank = world_rank();
  const std::vector<std::int64_t> sizes = {1, 3, 300001};
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD);
  const auto tensors = make_contiguous_inputs<T>(rank, sizes);
  reducer.mean(Exec(), tensors);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    auto mine = read_view(tensors[t]);
    auto first = mine;
    MPI_Bcast(first.data(), int(first.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
    ASSERT_EQ(std::memcmp(mine.data(), first.data(), mine.size() * sizeof(T)), 0) << "tensor " << t;
  }
}

// Every operation on tensors that lie one after the other in memory (reduced in place) gives
// bit for bit what it gives on the same tensors allocated one by one (packed into the fusion
// buffer): the same values reach MPI in the same order.
TEST(ReduceInPlace, ContiguousListsEqualSeparateOnes) {
  using T = float;
  const int rank = world_rank();
  const std::vector<std::int64_t> sizes = {3, 700, 1, 40, 2000, 9};
  ReduceOptions options;
  options.fusion_bytes = 4096;
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
  using Call = std::function<void(const lather::TensorList<T, Memory>&)>;
  const std::vector<std::pair<const char*, Call>> operations = {
      {"adasum", [&](const auto& t) { reducer.adasum(Exec(), t); }},
      {"adasum_approx", [&](const auto& t) { reducer.adasum_approx(Exec(), t); }},
      {"broadcast", [&](const auto& t) { reducer.broadcast(Exec(), t, world_size() - 1); }}};
  for (const auto& [name, call] : operations) {
    const auto separate = make_inputs<T>(rank, sizes), contiguous = make_contiguous_inputs<T>(rank, sizes);
    call(separate);
    call(contiguous);
    for (std::size_t t = 0; t < sizes.size(); ++t)
      ASSERT_EQ(read_view(separate[t]), read_view(contiguous[t])) << name << " tensor " << t;
  }
}

// Statistics and errors do not depend on the element type: float only, to keep the collectives few.
TEST(ReduceStatistics, TwoHundredTensorsCostOneMessagePerBucket) {
  using T = float;
  const int n = world_size(), rank = world_rank();
  const std::vector<std::int64_t> sizes(200, 100);
  for (std::int64_t bucket_tensors : {std::int64_t(200), std::int64_t(50)}) {
    ReduceOptions options;
    options.fusion_bytes = std::size_t(bucket_tensors * 100) * sizeof(T);
    options.shared_memory = false;  // MPI's messages (the window sends none: below)
    GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
    const auto tensors = make_inputs<T>(rank, sizes);
    reducer.sum(Exec(), tensors);
    const auto stats = reducer.statistics();
    EXPECT_EQ(stats.agreements, 1);
    // One MPI_Allreduce per bucket of `bucket_tensors` tensors (two ranks: the two exchanges of
    // the pairwise sum, the bucket being one piece); nothing is sent on one rank.
    EXPECT_EQ(stats.data_messages, n == 1 ? 0 : (n == 2 ? 2 : 1) * 200 / bucket_tensors);
    const auto last = read_view(tensors[199]);
    for (std::int64_t i = 0; i < 100; ++i) ASSERT_NEAR(last[i], reference_sum<T>(n, 199, i), sum_tolerance<T>(n));
  }
}

// All ranks of the tests share one node: sums go through the window, one pass per bucket and no
// message carrying tensor data, and every rank holds the same bits (each element is summed by
// one rank, in rank order).
TEST(ReduceStatistics, OneNodeSumsThroughSharedMemoryWithoutMessages) {
  if (!lather::Impl::host_accessible<Memory>) GTEST_SKIP() << "the node window holds host memory only";
  using T = float;
  const int n = world_size(), rank = world_rank();
  const std::vector<std::int64_t> sizes(200, 100);
  ReduceOptions options;
  options.fusion_bytes = std::size_t(50 * 100) * sizeof(T);
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
  const auto tensors = make_inputs<T>(rank, sizes);
  reducer.mean(Exec(), tensors);
  const auto stats = reducer.statistics();
  EXPECT_EQ(stats.data_messages, 0);
  EXPECT_EQ(stats.shared_memory_sums, n == 1 ? 0 : 4);
  const auto last = read_view(tensors[199]);
  auto first = last;
  MPI_Bcast(first.data(), int(first.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::memcmp(last.data(), first.data(), last.size() * sizeof(T)), 0);
  for (std::int64_t i = 0; i < 100; ++i) ASSERT_NEAR(last[i], reference_sum<T>(n, 199, i) / n, sum_tolerance<T>(n));
}

// A ParameterList whose gradients were placed in the reducer's window is summed where it lies,
// its 4.8 MB bucket too (a bucket above 4 MiB that would have to be copied goes through MPI);
// a rank whose list is not placed while the others' are is an agreement error on every rank.
TEST(ReduceSharedMemory, PlacedGradientsAreSummedWhereTheyLie) {
  if (!lather::Impl::host_accessible<Memory>) GTEST_SKIP() << "the node window holds host memory only";
  using T = float;
  const int n = world_size(), rank = world_rank();
  const std::vector<std::int64_t> sizes = {7, 300000, 5, 1200000};
  std::vector<lather::ParameterSpec> specs;
  for (std::size_t t = 0; t < sizes.size(); ++t) specs.push_back({"p" + std::to_string(t), {sizes[t]}});
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD);
  lather::ParameterList<T, Memory> list(Exec(), specs);
  const auto storage = reducer.shared_gradient_storage(std::int64_t(list.gradient_buffer().extent(0)));
  if (n == 1) {
    EXPECT_EQ(storage.data(), nullptr) << "one rank has nothing to share";
    return;
  }
  ASSERT_NE(storage.data(), nullptr);
  list.place_gradients(Exec(), storage);
  ASSERT_EQ(list.gradient_buffer().data(), storage.data());
  const auto inputs = make_inputs<T>(rank, sizes);
  for (std::size_t t = 0; t < sizes.size(); ++t) Kokkos::deep_copy(list.gradient(t), inputs[t]);
  reducer.mean(Exec(), list.gradients());
  EXPECT_EQ(reducer.statistics().data_messages, 0);
  EXPECT_EQ(reducer.statistics().shared_memory_sums, 1);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto got = read_view(list.gradient(t));
    for (std::int64_t i = 0; i < sizes[t]; i += 997)
      ASSERT_NEAR(got[std::size_t(i)], reference_sum<T>(n, int(t), i) / n, sum_tolerance<T>(n)) << t << " " << i;
  }
  // The last rank reduces a copy of its gradients instead: the ranks disagree, every rank says so.
  const auto copies = make_contiguous_inputs<T>(rank, sizes);
  expect_error([&] { reducer.mean(Exec(), rank == n - 1 ? copies : list.gradients()); }, "shared window");
  // A window handed out is never reallocated: more is refused on every rank, and a bucket it
  // cannot hold goes through MPI (a 1 MB bucket beside a 4 KB window).
  GradientReducer<Exec, T> small(MPI_COMM_WORLD);
  ASSERT_NE(small.shared_gradient_storage(1000).data(), nullptr);
  expect_error([&] { small.shared_gradient_storage(rank == 0 ? 3000 : 10); }, "already handed out");
  const auto larger = make_inputs<T>(rank, {250000});
  small.mean(Exec(), larger);
  EXPECT_GT(small.statistics().data_messages, 0);
  EXPECT_EQ(small.statistics().shared_memory_sums, 0);
  const auto got = read_view(larger[0]);
  for (std::int64_t i = 0; i < 250000; i += 997)
    ASSERT_NEAR(got[std::size_t(i)], reference_sum<T>(n, 0, i) / n, sum_tolerance<T>(n)) << i;
}

TEST(ReduceStatistics, RepeatedCallsCostOneAgreementOrNone) {
  using T = float;
  const int rank = world_rank();
  const std::vector<std::int64_t> sizes = {10, 20};
  GradientReducer<Exec, T> checked(MPI_COMM_WORLD);
  for (int call = 0; call < 2; ++call) checked.sum(Exec(), make_inputs<T>(rank, sizes));
  EXPECT_EQ(checked.statistics().agreements, 2);
  ReduceOptions trusting;
  trusting.verify_layout = false;
  GradientReducer<Exec, T> unchecked(MPI_COMM_WORLD, trusting);
  for (int call = 0; call < 2; ++call) unchecked.sum(Exec(), make_inputs<T>(rank, sizes));
  EXPECT_EQ(unchecked.statistics().agreements, 1);
  EXPECT_EQ(unchecked.statistics().calls, 2);
}

TYPED_TEST(Reduce, WeightedMeanDividesBySumOfWeights) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  const std::vector<std::int64_t> sizes = {5, 1000, 3};
  // The gradients are sums over each rank's tokens; rank r had r + 1 tokens (rank 1 none, to show
  // a zero local weight is fine).
  auto weight = [](int r) { return r == 1 ? 0.0 : double(r + 1); };
  double total_weight = 0;
  for (int r = 0; r < n; ++r) total_weight += weight(r);
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD);
  const auto tensors = make_inputs<T>(rank, sizes);
  const double global = reducer.weighted_mean(Exec(), tensors, weight(rank));
  EXPECT_EQ(global, total_weight);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto got = read_view(tensors[t]);
    for (std::int64_t i = 0; i < sizes[t]; ++i)
      ASSERT_NEAR(got[i], reference_sum<T>(n, int(t), i) / total_weight, sum_tolerance<T>(n));
  }
}

TEST(ReduceErrors, BadWeightsAreAnErrorOnEveryRank) {
  using T = float;
  const int n = world_size(), rank = world_rank();
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD);
  const auto tensors = make_inputs<T>(rank, {4});
  expect_error([&] { reducer.weighted_mean(Exec(), tensors, 0.0); }, "global weight");
  expect_error([&] { reducer.weighted_mean(Exec(), tensors, rank == n - 1 ? -1.0 : 1.0); },
               "local weight must be finite and >= 0, got -1");
  // The reducer is still usable after an error on every rank.
  reducer.sum(Exec(), tensors);
}

// check_finite: a NaN or Inf on one rank only is refused on every rank, naming the rank and the
// tensor, with and without the per-call layout agreement, and nothing is reduced. Off (the
// default), sum carries it through element by element: the element becomes Inf everywhere, its
// neighbours are untouched.
TEST(ReduceErrors, NonFiniteGradientsAreRefusedWhenAsked) {
  using T = float;
  const int n = world_size(), rank = world_rank();
  const bool odd_one = rank == n - 1;
  for (const bool verify : {true, false}) {
    ReduceOptions options;
    options.check_finite = true;
    options.verify_layout = verify;
    GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
    reducer.set_tensor_names({"dense/kernel", "dense/bias"});
    reducer.sum(Exec(), make_inputs<T>(rank, {5, 3}));  // learns the layout
    auto tensors = make_inputs<T>(rank, {5, 3});
    if (odd_one) Kokkos::deep_copy(Kokkos::subview(tensors[1], 1), std::numeric_limits<T>::infinity());
    const auto before = read_view(tensors[0]);
    expect_error([&] { reducer.weighted_mean(Exec(), tensors, 1.0); },
                 "'dense/bias' (3 elements) holds 1 NaN or Inf values on this rank");
    EXPECT_EQ(read_view(tensors[0]), before) << "nothing reduced";
    if (n > 1) {
      try {
        reducer.sum(Exec(), tensors);
        ADD_FAILURE() << "no error";
      } catch (const lather::Error& e) {
        EXPECT_NE(e.message().find("rank " + std::to_string(n - 1) + " of " + std::to_string(n)), std::string::npos)
            << e.message();
      }
    }
    // Usable afterwards.
    reducer.sum(Exec(), make_inputs<T>(rank, {5, 3}));
  }
  GradientReducer<Exec, T> plain(MPI_COMM_WORLD);
  auto tensors = make_inputs<T>(rank, {5});
  if (odd_one) Kokkos::deep_copy(Kokkos::subview(tensors[0], 2), std::numeric_limits<T>::infinity());
  plain.sum(Exec(), tensors);
  const auto summed = read_view(tensors[0]);
  EXPECT_TRUE(std::isinf(summed[2]));
  EXPECT_NEAR(summed[1], reference_sum<T>(n, 0, 1), sum_tolerance<T>(n));
}

TEST(ReduceErrors, MismatchedListsAreAnErrorOnEveryRankNotAHang) {
  using T = float;
  const int n = world_size(), rank = world_rank();
  if (n == 1) GTEST_SKIP() << "needs two ranks to disagree";
  GradientReducer<Exec, T> reducer(MPI_COMM_WORLD);
  const bool odd_one = rank == n - 1;
  // One tensor more on the last rank.
  expect_error(
      [&] {
        reducer.sum(Exec(), make_inputs<T>(
                                rank, odd_one ? std::vector<std::int64_t>{3, 4, 5} : std::vector<std::int64_t>{3, 4}));
      },
      "tensor count differs");
  // Same count, one size different: the agreement names the tensor.
  expect_error(
      [&] {
        reducer.mean(Exec(), make_inputs<T>(rank, {3, 4, odd_one ? 6 : 5}));
      },
      "element count of tensor 2 differs");
  // Same list, different operations.
  expect_error(
      [&] {
        const auto tensors = make_inputs<T>(rank, {3});
        if (odd_one)
          reducer.mean(Exec(), tensors);
        else
          reducer.sum(Exec(), tensors);
      },
      "operation");
  // Different calls with different agreement records: still the operation is named.
  expect_error(
      [&] {
        const auto tensors = make_inputs<T>(rank, {3});
        if (odd_one)
          reducer.broadcast(Exec(), tensors, 0);
        else
          reducer.sum(Exec(), tensors);
      },
      "operation");
  // Same list, different fusion sizes (the buckets, hence the messages, would differ).
  ReduceOptions other;
  other.fusion_bytes = odd_one ? 1024 : 2048;
  GradientReducer<Exec, T> mixed(MPI_COMM_WORLD, other);
  expect_error([&] { mixed.sum(Exec(), make_inputs<T>(rank, {3})); }, "fusion_bytes");
  // Still usable afterwards.
  const auto tensors = make_inputs<T>(rank, {3});
  reducer.sum(Exec(), tensors);
  EXPECT_NEAR(read_view(tensors[0])[2], reference_sum<T>(n, 0, 2), sum_tolerance<T>(n));
}

TYPED_TEST(Reduce, SixteenBitWiresStayWithinTheirRoundingBounds) {
  using T = TypeParam;
  const int n = world_size(), rank = world_rank();
  // With a 4 KiB fusion buffer: a bucket of two small tensors and a large one in two chunks.
  const std::vector<std::int64_t> sizes = {17, 1, 1500};
  for (auto wire : {WirePrecision::bfloat16, WirePrecision::float16}) {
    // Unit roundoff u: bfloat16 keeps 8 significant bits (u = 2^-8), fp16 11 (u = 2^-11).
    const double u = wire == WirePrecision::bfloat16 ? 0x1.0p-8 : 0x1.0p-11;
    ReduceOptions options;
    options.wire_precision = wire;
    options.fusion_bytes = 4096;
    GradientReducer<Exec, T> reducer(MPI_COMM_WORLD, options);
    {
      const bool mean = wire == WirePrecision::float16;  // bfloat16 sums, float16 averages
      const auto tensors = make_inputs<T>(rank, sizes, 7);
      if (mean)
        reducer.mean(Exec(), tensors);
      else
        reducer.sum(Exec(), tensors);
      const double factor = mean ? 1.0 / n : 1.0;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        const auto got = read_view(tensors[t]);
        for (std::int64_t i = 0; i < sizes[t]; ++i) {
          double exact = 0, magnitude = 0;
          for (int r = 0; r < n; ++r) {
            exact += stored_input<T>(r, int(t), i, 7);
            magnitude += std::fabs(stored_input<T>(r, int(t), i, 7));
          }
          // Each input is rounded once to 16 bits (<= u |x_r|, or half a subnormal step 2^-25
          // for fp16 near zero), summed in float (<= n 2^-24 sum |x_r|), scaled and rounded once
          // more (<= u |result|, <= u sum|x_r| * factor): the bound below. One rank sends
          // nothing and rounds nothing.
          const double bound =
              n == 1 ? sum_tolerance<T>(1) : factor * ((2 * u + n * 0x1.0p-23) * magnitude + n * 0x1.0p-24);
          ASSERT_NEAR(got[i], exact * factor, bound) << lather::comm::to_string(wire) << " t " << t << " i " << i;
        }
      }
    }
  }
}

TEST(ReduceOptions, ValidateNamesTheField) {
  ReduceOptions options;
  options.fusion_bytes = 4;
  expect_error([&] { options.validate(); }, "ReduceOptions::fusion_bytes");
  EXPECT_EQ(lather::comm::parse_wire_precision("bf16"), WirePrecision::bfloat16);
  expect_error([] { lather::comm::parse_wire_precision("fp8"); }, "unknown wire precision 'fp8'");
}

}  // namespace
