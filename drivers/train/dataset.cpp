#include "dataset.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace lather::train {

DataSets load_data_sets(const TrainOptions& o) {
  DataSets sets{data::load_mnist_like(o.data, "train"), data::load_mnist_like(o.data, "t10k")};
  // A count beyond the data set is refused rather than silently lowered to it.
  LATHER_REQUIRE(o.train_samples <= long(sets.train.count), "--train-samples ", o.train_samples, " is more than the ",
                 sets.train.count, " training samples of --data '", o.data, "'");
  LATHER_REQUIRE(o.test_samples <= long(sets.test.count), "--test-samples ", o.test_samples, " is more than the ",
                 sets.test.count, " test samples of --data '", o.data, "'");
  if (o.train_samples > 0) sets.train.count = o.train_samples;
  if (o.test_samples > 0) sets.test.count = o.test_samples;
  double sum = 0, squares = 0;
  const std::size_t n = std::size_t(sets.train.count * sets.train.features);
  for (std::size_t k = 0; k < n; ++k) {
    sum += sets.train.images[k];
    squares += double(sets.train.images[k]) * sets.train.images[k];
  }
  const double mean = sum / double(n), deviation = std::sqrt(std::max(squares / double(n) - mean * mean, 1e-12));
  for (auto* set : {&sets.train, &sets.test})
    for (auto& x : set->images) x = float((x - mean) / deviation);
  return sets;
}

std::vector<std::int32_t> epoch_order(long samples, std::uint64_t seed, long epoch) {
  std::vector<std::int32_t> order(samples);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 1000003ull + std::uint64_t(epoch) + 1);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

std::pair<long, long> share(long count, long parts, long index) {
  const long base = count / parts, extra = count % parts;
  const long begin = index * base + std::min(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

Batch::Batch(long capacity, long features) {
  m_x = Matrix(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather-train::x"), std::max(1L, capacity), features);
  m_y = Labels(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lather-train::y"), std::max(1L, capacity));
  m_hx = Kokkos::create_mirror_view(m_x);
  m_hy = Kokkos::create_mirror_view(m_y);
}

std::pair<Matrix, Labels> Batch::load(const Space& space, const data::LabelledImages& data, const std::int32_t* index,
                                      long begin, long end) {
  // The staging buffers are rewritten below: the copies of the previous batch must be done.
  space.fence();
  const long rows = end - begin, features = data.features;
  for (long k = 0; k < rows; ++k) {
    const long sample = index ? index[begin + k] : begin + k;
    std::copy_n(&data.images[std::size_t(sample) * features], features, &m_hx(k, 0));
    m_hy(k) = data.labels[sample];
  }
  Kokkos::deep_copy(space, m_x, m_hx);
  Kokkos::deep_copy(space, m_y, m_hy);
  return {Kokkos::subview(m_x, std::pair<long, long>(0, rows), Kokkos::ALL),
          Kokkos::subview(m_y, std::pair<long, long>(0, rows))};
}

}  // namespace lather::train
