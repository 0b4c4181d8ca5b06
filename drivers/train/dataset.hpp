#pragma once
// The training driver's data: Fashion-MNIST (or any IDX pair) standardised with the training
// set's statistics, the global sample order of an epoch, how a batch is shared among replicas,
// and the host staging of a batch onto the device.

#include "training_options.hpp"

#include <lather/data/idx.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace lather::train {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;
using Labels = Kokkos::View<std::int32_t*, Memory>;

/// The training and test sets of `o.data`, cut to --train-samples / --test-samples, with the
/// pixels standardised by the training set's mean and deviation (the same on every rank).
struct DataSets {
  data::LabelledImages train, test;
};
DataSets load_data_sets(const TrainOptions& o);

/// The global sample order of an epoch: the same permutation on every rank.
std::vector<std::int32_t> epoch_order(long samples, std::uint64_t seed, long epoch);

/// [begin, end) of the part `index` of `parts` equal parts of `count` (the first count % parts
/// parts one larger).
std::pair<long, long> share(long count, long parts, long index);

/// Host staging of selected rows of a data set onto the device.
class Batch {
 public:
  Batch(long capacity, long features);
  /// Rows data[index[k]] (or data[k] when index is null) for k in [begin, end), copied on `space`.
  std::pair<Matrix, Labels> load(const Space& space, const data::LabelledImages& data, const std::int32_t* index,
                                 long begin, long end);

 private:
  Matrix m_x;
  Labels m_y;
  typename Matrix::HostMirror m_hx;
  typename Labels::HostMirror m_hy;
};

}  // namespace lather::train
