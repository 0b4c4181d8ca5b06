#pragma once
// A model's trainable tensors as Lather sees them: one list of named parameters, each with its
// shape, its value and its gradient (1-D Views, row-major). The list either allocates the
// tensors itself -- all values in one contiguous buffer and all gradients in another, so that a
// reduction can work on the whole gradient at once -- or wraps Views the application owns.
//
//   lather::ParameterList<float> params(space, {{"dense/kernel", {16, 4}}, {"dense/bias", {4}}});
//   params.gradient("dense/bias")            // a View to write the gradient into
//   optimizer.step(space, params);            // values += update(gradients)

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/tensor.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lather {

/// What a model's backward pass reports as it goes, as PyTorch DDP's autograd hooks do: after a
/// layer has written its parameters' gradients for the last time in the step, the range
/// [first, last) of their indices in the model's ParameterList (the last layer first); between
/// layers, an empty range, where a reduction in flight may progress
/// (comm::GradientReducer::ready and progress).
using GradientsReady = std::function<void(std::size_t first, std::size_t last)>;

/// What a model's passes ask for before a layer computes, in the forward pass (first layer first)
/// and again before the layer's backward (last layer first): the values of the parameters
/// [first, last) of its ParameterList must be in place when the call returns. Sharded parameters
/// (comm::ParameterShards::need) all-gather them here and start gathering the next layer's.
using ParametersNeeded = std::function<void(std::size_t first, std::size_t last)>;

/// A trainable tensor: a name for messages and checkpoints, and the shape of the tensor this rank
/// holds. With weight sharding (tensor parallelism) the tensor is this rank's slice of a global
/// tensor split along `split_axis`: it holds [split_offset, split_offset + shape[split_axis]) of
/// global_shape[split_axis], which may be empty (a rank holding none of the rows).
struct ParameterSpec {
  std::string name;
  TensorShape shape;
  int split_axis = -1;  ///< -1: not split (the tensor is the whole parameter)
  std::int64_t split_offset = 0;
  TensorShape global_shape = {};  ///< empty: same as shape (initialised: `{name, shape}` leaves no field missing)
  /// With split_axis 0: the slice is a band of rows cut where the whole tensor's blocks are cut
  /// (comm::ParameterShards), so an optimizer reads the whole tensor's shape and takes the blocks
  /// inside the band (Shampoo merges small dimensions as for the unsplit tensor). Without it, a
  /// weight shard's split axis stays a dimension of its own.
  bool band_of_whole = false;
  /// With split_axis above 0: the slice may also be a band of rows (comm::ParameterShards over a
  /// weight shard's column slice): it holds rows [row_offset, row_offset + shape[0]) of
  /// global_shape[0] as well, cut where the blocks of the slice's reading are cut.
  std::int64_t row_offset = 0;

  const TensorShape& global() const { return global_shape.empty() ? shape : global_shape; }
  bool split() const { return split_axis >= 0; }
  /// True for a band of rows of a slice split along a later axis (a piece cut along two axes).
  bool row_band() const { return split_axis > 0 && (row_offset != 0 || shape.front() != global().front()); }
  void validate() const;  ///< Throws lather::Error naming the parameter when inconsistent.
};

template <class Scalar, class MemorySpace = DefaultExecutionSpace::memory_space>
class ParameterList {
 public:
  using tensor = FlatTensor<Scalar, MemorySpace>;
  using tensor_list = TensorList<Scalar, MemorySpace>;

  ParameterList() = default;
  /// Allocates zero values and gradients for `specs` on `space`: the values in one buffer and
  /// the gradients in another, each in list order.
  template <class ExecutionSpace>
  ParameterList(const ExecutionSpace& space, const std::vector<ParameterSpec>& specs) {
    std::int64_t total = 0;
    for (const auto& spec : specs) {
      spec.validate();
      total += element_count(spec.shape);
    }
    m_value_buffer = tensor(Kokkos::view_alloc(space, "Lather::ParameterList::values"), std::size_t(total));
    m_gradient_buffer = tensor(Kokkos::view_alloc(space, "Lather::ParameterList::gradients"), std::size_t(total));
    std::size_t offset = 0;
    for (const auto& spec : specs) {
      const auto range = std::make_pair(offset, offset + std::size_t(element_count(spec.shape)));
      append(spec, Kokkos::subview(m_value_buffer, range), Kokkos::subview(m_gradient_buffer, range));
      offset = range.second;
    }
  }

  /// Adds a parameter whose storage the caller owns; both Views hold element_count(spec.shape)
  /// elements and do not overlap. A list built this way has no gradient_buffer().
  void add(ParameterSpec spec, tensor value, tensor gradient) {
    append(std::move(spec), std::move(value), std::move(gradient));
    m_value_buffer = m_gradient_buffer = tensor();
  }

  std::size_t size() const { return m_specs.size(); }
  const std::vector<ParameterSpec>& specs() const { return m_specs; }
  const ParameterSpec& spec(std::size_t i) const { return m_specs.at(i); }
  const tensor_list& values() const { return m_values; }
  const tensor_list& gradients() const { return m_gradients; }
  const tensor& value(std::size_t i) const { return m_values.at(i); }
  const tensor& gradient(std::size_t i) const { return m_gradients.at(i); }
  const tensor& value(const std::string& name) const { return m_values[checked_index(name)]; }
  const tensor& gradient(const std::string& name) const { return m_gradients[checked_index(name)]; }
  /// Position of the parameter called `name`, or -1.
  int index_of(const std::string& name) const {
    for (std::size_t i = 0; i < m_specs.size(); ++i)
      if (m_specs[i].name == name) return int(i);
    return -1;
  }

  /// Every gradient as one View (list order) when the list allocated them, else an empty View.
  const tensor& gradient_buffer() const { return m_gradient_buffer; }
  /// Every value as one View (list order) when the list allocated them, else an empty View.
  const tensor& value_buffer() const { return m_value_buffer; }

  /// Moves the gradients into `storage` (at least gradient_buffer().extent(0) elements, in this
  /// list's memory space, alive as long as the list is used): their values are copied on `space`,
  /// then gradient(i) and gradient_buffer() view `storage`, in list order. For memory a reduction
  /// sums where it lies (comm::GradientReducer::shared_gradient_storage). Needs a list that
  /// allocated its gradients. Views of the gradients taken before keep the old memory.
  template <class ExecutionSpace>
  void place_gradients(const ExecutionSpace& space, const tensor& storage) {
    LATHER_REQUIRE(m_gradient_buffer.data() != nullptr || m_specs.empty(),
                   "ParameterList::place_gradients: the list does not own a gradient buffer (built with add())");
    const std::size_t total = m_gradient_buffer.extent(0);
    LATHER_REQUIRE(storage.extent(0) >= total, "ParameterList::place_gradients: the storage holds ", storage.extent(0),
                   " elements; the gradients need ", total);
    const tensor placed = Kokkos::subview(storage, std::make_pair(std::size_t(0), total));
    Kokkos::deep_copy(space, placed, m_gradient_buffer);
    Impl::fence(space, "Lather::ParameterList::place_gradients: copied");
    std::size_t offset = 0;
    for (std::size_t i = 0; i < m_specs.size(); ++i) {
      const std::size_t n = m_gradients[i].extent(0);
      m_gradients[i] = Kokkos::subview(placed, std::make_pair(offset, offset + n));
      offset += n;
    }
    m_gradient_buffer = placed;
  }

  /// value(i) := host (element_count of its shape values), copied on `space`; waits for the copy.
  template <class ExecutionSpace>
  void set_value(const ExecutionSpace& space, std::size_t i, const std::vector<Scalar>& host) const {
    const auto& v = m_values.at(i);
    LATHER_REQUIRE(host.size() == v.extent(0), "ParameterList::set_value: parameter '", m_specs[i].name, "' has ",
                   v.extent(0), " elements, got ", host.size());
    Kokkos::deep_copy(space, v, Kokkos::View<const Scalar*, Kokkos::HostSpace>(host.data(), host.size()));
    Impl::fence(space, "Lather::ParameterList::set_value: copied");
  }
  /// A host copy of value(i), made on `space`.
  template <class ExecutionSpace>
  std::vector<Scalar> host_value(const ExecutionSpace& space, std::size_t i) const {
    const auto& v = m_values.at(i);
    std::vector<Scalar> out(v.extent(0));
    Kokkos::deep_copy(space, Kokkos::View<Scalar*, Kokkos::HostSpace>(out.data(), out.size()), v);
    Impl::fence(space, "Lather::ParameterList::host_value: copied");
    return out;
  }

 private:
  void append(ParameterSpec spec, tensor value, tensor gradient) {
    spec.validate();
    const auto n = std::size_t(element_count(spec.shape));
    LATHER_REQUIRE(value.extent(0) == n && gradient.extent(0) == n, "ParameterList: parameter '", spec.name,
                   "' of shape ", to_string(spec.shape), " needs ", n, " elements; got a value of ", value.extent(0),
                   " and a gradient of ", gradient.extent(0));
    LATHER_REQUIRE(index_of(spec.name) < 0, "ParameterList: parameter name '", spec.name, "' is used twice");
    LATHER_REQUIRE(n == 0 || value.data() != gradient.data(), "ParameterList: parameter '", spec.name,
                   "' and its gradient share memory");
    m_specs.push_back(std::move(spec));
    m_values.push_back(value);
    m_gradients.push_back(gradient);
  }
  std::size_t checked_index(const std::string& name) const {
    const int i = index_of(name);
    LATHER_REQUIRE(i >= 0, "ParameterList: no parameter called '", name, "'");
    return std::size_t(i);
  }

  std::vector<ParameterSpec> m_specs;
  tensor_list m_values, m_gradients;
  tensor m_value_buffer, m_gradient_buffer;
};

}  // namespace lather
