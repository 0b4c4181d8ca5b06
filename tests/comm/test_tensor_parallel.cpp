// Tensor-parallel layers and the vocabulary-parallel loss against the unsharded computation,
// done with plain loops in double on every rank. All world ranks are the shards of one replica,
// so 3 and 8 ranks give uneven splits (10 output features over 8 shards: 2, 2, 1, 1, 1, 1, 1, 1).
#include <lather/comm/mesh.hpp>
#include <lather/comm/tensor_parallel.hpp>
#include <lather/nn/parallel_linear.hpp>
#include <lather/nn/vocab_parallel_cross_entropy.hpp>

#include "comm_test_utils.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

using lather::comm::Mesh;
using lather::comm::ShardRange;
using lather::nn::ColumnParallelLinear;
using lather::nn::RowParallelLinear;
using lather::nn::VocabParallelCrossEntropy;
using namespace lather::test;

constexpr int batch = 4, in_features = 9, out_features = 10, vocab = 13;

/// A [rows, columns] matrix of input_value(0, id, i * columns + j): the same on every rank.
struct Dense {
  int rows, columns;
  std::vector<double> v;
  Dense(int r, int c, int id) : rows(r), columns(c), v(std::size_t(r) * c) {
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) v[std::size_t(i) * c + j] = input_value(0, id, std::int64_t(i) * c + j);
  }
  Dense(int r, int c) : rows(r), columns(c), v(std::size_t(r) * c, 0.0) {}
  double& operator()(int i, int j) { return v[std::size_t(i) * columns + j]; }
  double operator()(int i, int j) const { return v[std::size_t(i) * columns + j]; }
};

Dense product(const Dense& a, bool ta, const Dense& b, bool tb) {
  const int m = ta ? a.columns : a.rows, k = ta ? a.rows : a.columns, n = tb ? b.rows : b.columns;
  Dense c(m, n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int l = 0; l < k; ++l) c(i, j) += (ta ? a(l, i) : a(i, l)) * (tb ? b(j, l) : b(l, j));
  return c;
}

/// Rows [r0, r0 + nr) and columns [c0, c0 + nc) of `m` as a device View of T.
template <class T>
lather::comm::Matrix<T, Memory> block(const Dense& m, int r0, int nr, int c0, int nc) {
  lather::comm::Matrix<T, Memory> view("block", nr, nc);
  auto host = Kokkos::create_mirror_view(view);
  for (int i = 0; i < nr; ++i)
    for (int j = 0; j < nc; ++j) host(i, j) = T(m(r0 + i, c0 + j));
  Kokkos::deep_copy(view, host);
  return view;
}

template <class T>
void expect_block(const lather::comm::Matrix<T, Memory>& got, const Dense& expected, int r0, int c0, double tolerance,
                  const char* what) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
  ASSERT_EQ(int(host.extent(1)) + c0 <= expected.columns, true) << what;
  for (std::size_t i = 0; i < host.extent(0); ++i)
    for (std::size_t j = 0; j < host.extent(1); ++j)
      ASSERT_NEAR(double(host(i, j)), expected(int(i) + r0, int(j) + c0), tolerance) << what << " " << i << "," << j;
}

/// Products of <= in_features terms of magnitude <= 1 rounded in T: k eps per entry, with room.
template <class T>
double tolerance() {
  return 4.0 * in_features * std::numeric_limits<T>::epsilon();
}

template <class T>
class TensorParallel : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(TensorParallel, Scalars);

TEST(ShardRange, FirstShardsHoldTheRemainder) {
  EXPECT_EQ(lather::comm::shard_range(10, 8, 0).count, 2);
  EXPECT_EQ(lather::comm::shard_range(10, 8, 2).begin, 4);
  EXPECT_EQ(lather::comm::shard_range(10, 8, 7).count, 1);
  EXPECT_EQ(lather::comm::shard_range(2, 4, 3).count, 0);
}

TYPED_TEST(TensorParallel, LayersEqualTheUnshardedComputation) {
  using T = TypeParam;
  const int n = world_size();
  Mesh mesh(MPI_COMM_WORLD, n);  // one replica, every rank a shard
  const int d = mesh.shard();
  const Dense x(batch, in_features, 1), w(in_features, out_features, 2), bias(1, out_features, 3),
      dy(batch, out_features, 4);
  const Dense y = product(x, false, w, false);  // + bias below
  const Dense dx = product(dy, false, w, true), dw = product(x, true, dy, false);
  Dense db(1, out_features);
  for (int i = 0; i < batch; ++i)
    for (int j = 0; j < out_features; ++j) db(0, j) += dy(i, j);
  Dense y_biased = y;
  for (int i = 0; i < batch; ++i)
    for (int j = 0; j < out_features; ++j) y_biased(i, j) += bias(0, j);
  auto row_vector = [](const lather::comm::Matrix<T, Memory>& m) {
    return Kokkos::View<T*, Memory>(m.data(), m.extent(1));
  };

  {  // Column-parallel: W split by output columns.
    ColumnParallelLinear<Exec, T> layer(mesh.shards(), in_features, out_features);
    const ShardRange r = layer.local_out();
    EXPECT_EQ(r.begin, lather::comm::shard_range(out_features, n, d).begin);
    const auto x_view = block<T>(x, 0, batch, 0, in_features);
    const auto w_d = block<T>(w, 0, in_features, r.begin, r.count);
    const auto b_d = block<T>(bias, 0, 1, r.begin, r.count);
    lather::comm::Matrix<T, Memory> y_d("y_d", batch, r.count), dx_view("dx", batch, in_features),
        dw_d("dw_d", in_features, r.count), db_d("db_d", 1, r.count);
    layer.forward(Exec(), x_view, w_d, row_vector(b_d), y_d);
    expect_block<T>(y_d, y_biased, 0, r.begin, tolerance<T>(), "column-parallel Y_d");
    layer.backward(Exec(), x_view, w_d, block<T>(dy, 0, batch, r.begin, r.count), dx_view, dw_d, row_vector(db_d));
    expect_block<T>(dx_view, dx, 0, 0, tolerance<T>(), "column-parallel dX (all-reduced)");
    expect_block<T>(dw_d, dw, 0, r.begin, tolerance<T>(), "column-parallel dW_d");
    expect_block<T>(db_d, db, 0, r.begin, tolerance<T>(), "column-parallel db_d");
  }
  {  // Row-parallel: W split by input rows, the input sharded the same way.
    RowParallelLinear<Exec, T> layer(mesh.shards(), in_features, out_features);
    const ShardRange r = layer.local_in();
    const auto x_d = block<T>(x, 0, batch, r.begin, r.count);
    const auto w_d = block<T>(w, r.begin, r.count, 0, out_features);
    const auto b = block<T>(bias, 0, 1, 0, out_features);
    lather::comm::Matrix<T, Memory> y_view("y", batch, out_features), dx_d("dx_d", batch, r.count),
        dw_d("dw_d", r.count, out_features), db_view("db", 1, out_features);
    layer.forward(Exec(), x_d, w_d, row_vector(b), y_view);
    expect_block<T>(y_view, y_biased, 0, 0, tolerance<T>(), "row-parallel Y (bias once)");
    layer.backward(Exec(), x_d, w_d, block<T>(dy, 0, batch, 0, out_features), dx_d, dw_d, row_vector(db_view));
    expect_block<T>(dx_d, dx, 0, r.begin, tolerance<T>(), "row-parallel dX_d");
    expect_block<T>(dw_d, dw, r.begin, 0, tolerance<T>(), "row-parallel dW_d");
    expect_block<T>(db_view, db, 0, 0, tolerance<T>(), "row-parallel db");
  }
  {  // All-gather of a sharded activation.
    const ShardRange r = lather::comm::shard_range(out_features, n, d);
    lather::comm::Matrix<T, Memory> gathered("gathered", batch, out_features);
    lather::comm::all_gather_features<Exec, T>(Exec(), mesh.shards(), block<T>(y_biased, 0, batch, r.begin, r.count),
                                               gathered);
    // The blocks travel unchanged: the only difference to the double reference is rounding to T.
    expect_block<T>(gathered, y_biased, 0, 0, 4 * std::numeric_limits<T>::epsilon(), "all-gathered activation");
  }
}

TYPED_TEST(TensorParallel, VocabParallelCrossEntropyNeverGathersTheLogits) {
  using T = TypeParam;
  const int n = world_size();
  Mesh mesh(MPI_COMM_WORLD, n);
  // Logits up to +-60: exp would overflow float without the max shift.
  Dense logits(batch, vocab, 5);
  for (auto& v : logits.v) v *= 60.0;
  const std::vector<int> labels = {0, 12, 5, 7};
  // The unsharded loss and gradient, plainly.
  std::vector<double> loss(batch);
  Dense grad(batch, vocab);
  double mean = 0;
  for (int i = 0; i < batch; ++i) {
    double m = -1e300, s = 0;
    for (int j = 0; j < vocab; ++j) m = std::max(m, double(T(logits(i, j))));
    for (int j = 0; j < vocab; ++j) s += std::exp(double(T(logits(i, j))) - m);
    loss[i] = std::log(s) + m - double(T(logits(i, labels[i])));
    mean += loss[i] / batch;
    for (int j = 0; j < vocab; ++j)
      grad(i, j) = (std::exp(double(T(logits(i, j))) - m) / s - (j == labels[i] ? 1.0 : 0.0)) / batch;
  }
  VocabParallelCrossEntropy<Exec, T> criterion(mesh.shards(), vocab);
  const ShardRange r = criterion.local_vocab();
  Kokkos::View<int*, Memory> label_view("labels", batch);
  auto label_host = Kokkos::create_mirror_view(label_view);
  for (int i = 0; i < batch; ++i) label_host(i) = labels[i];
  Kokkos::deep_copy(label_view, label_host);
  Kokkos::View<T*, Memory> loss_view("loss", batch);
  lather::comm::Matrix<T, Memory> grad_d("grad_d", batch, r.count);
  const double got =
      criterion.forward_backward(Exec(), block<T>(logits, 0, batch, r.begin, r.count), label_view, loss_view, grad_d);
  // Losses are O(100): log-sum-exp in double, stored in T.
  const double loss_tolerance = 4 * 100 * std::numeric_limits<T>::epsilon();
  EXPECT_NEAR(got, mean, loss_tolerance);
  const auto loss_got = read_view(loss_view);
  for (int i = 0; i < batch; ++i) EXPECT_NEAR(loss_got[i], loss[i], loss_tolerance) << i;
  expect_block<T>(grad_d, grad, 0, r.begin, 4 * std::numeric_limits<T>::epsilon(), "vocab-parallel gradient");

  // The general form: the summed loss's gradient with PaLM's z-loss, and the accuracy, against
  // the same plain formulas: d/dz [log Z + w (log Z)^2 - z_label] = p (1 + 2 w log Z) - onehot.
  const double w = 0.1;
  double z_sum = 0, loss_sum = 0;
  long correct = 0;
  Dense z_grad(batch, vocab);
  for (int i = 0; i < batch; ++i) {
    double m = -1e300, s = 0;
    for (int j = 0; j < vocab; ++j) m = std::max(m, double(T(logits(i, j))));
    for (int j = 0; j < vocab; ++j) s += std::exp(double(T(logits(i, j))) - m);
    const double log_z = std::log(s) + m;
    z_sum += w * log_z * log_z;
    loss_sum += loss[i];
    correct += double(T(logits(i, labels[i]))) >= m ? 1 : 0;
    for (int j = 0; j < vocab; ++j)
      z_grad(i, j) = std::exp(double(T(logits(i, j))) - m) / s * (1 + 2 * w * log_z) - (j == labels[i] ? 1.0 : 0.0);
  }
  lather::nn::CrossEntropyTerms terms;
  terms.gradient_scale = 1;
  terms.z_loss = w;
  const auto sums = criterion.forward_backward(Exec(), block<T>(logits, 0, batch, r.begin, r.count), label_view,
                                               loss_view, grad_d, terms);
  EXPECT_NEAR(sums.loss, loss_sum, batch * loss_tolerance);
  // log Z ~ 60 here: w (log Z)^2 ~ 360, its gradient factor ~ 13; T rounding of the logits is shared.
  EXPECT_NEAR(sums.z_loss, z_sum, 1e-9 * z_sum);
  EXPECT_EQ(sums.correct, correct);
  expect_block<T>(grad_d, z_grad, 0, r.begin, 64 * std::numeric_limits<T>::epsilon(), "z-loss gradient");

  // A label outside the vocabulary is an error on every shard.
  if (mesh.shard() == 0) label_host(1) = vocab;
  Kokkos::deep_copy(label_view, label_host);
  expect_error(
      [&] {
        criterion.forward_backward(Exec(), block<T>(logits, 0, batch, r.begin, r.count), label_view, loss_view, grad_d);
      },
      "label 13 of row 1 is not a class");
}

TEST(TensorParallelErrors, MismatchedBatchesAreAnErrorOnEveryShard) {
  const int n = world_size();
  if (n == 1) GTEST_SKIP() << "needs two shards to disagree";
  Mesh mesh(MPI_COMM_WORLD, n);
  RowParallelLinear<Exec, double> layer(mesh.shards(), in_features, out_features);
  const int rows = mesh.shard() == 0 ? batch + 1 : batch;
  const Dense x(rows, in_features, 1), w(in_features, out_features, 2), bias(1, out_features, 3);
  const ShardRange r = layer.local_in();
  lather::comm::Matrix<double, Memory> y("y", rows, out_features);
  const auto b = block<double>(bias, 0, 1, 0, out_features);
  expect_error(
      [&] {
        layer.forward(Exec(), block<double>(x, 0, rows, r.begin, r.count),
                      block<double>(w, r.begin, r.count, 0, out_features),
                      Kokkos::View<double*, Memory>(b.data(), out_features), y);
      },
      "batch size differs");
  expect_error([&] { ColumnParallelLinear<Exec, float>(mesh.shards(), in_features, mesh.shard() == 0 ? 11 : 10); },
               "out_features differs");
}

}  // namespace
