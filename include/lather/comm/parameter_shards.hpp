#pragma once
// Fully sharded parameters over a data-parallel group (ZeRO stage 3, PyTorch FSDP): each rank
// stores only a band of rows of every parameter -- its values, its gradient and (through an
// optimizer built on owned()) its optimizer state -- and the model's passes see whole layers
// through two gather buffers:
//
//  * before a layer's forward, and again before its backward, ParametersNeeded (need()) makes
//    the layer's values whole in the gather buffer of its parity (layer l uses buffer l % 2), and
//    starts the all-gather of the next layer of the pass into the other buffer, so that it moves
//    while this layer computes;
//  * after a layer's backward, GradientsReady (ready()) reduce-scatters the layer's gradients in
//    place in its gradient buffer to the ranks owning each band, which add them to their owned
//    gradients (every micro-batch of a step: the gradients never exist whole between layers);
//  * finish_step() agrees on the step over the group -- any rank's failure, any non-finite owned
//    gradient -- and turns the owned sums into the weighted mean; the optimizer then updates the
//    owned bands only.
//
// A band is rows [begin, end) of a parameter's leading dimension, contiguous in the row-major
// value, the ranks' bands in rank order, so that a gather and a reduce-scatter are one MPI call
// per parameter. What a band may cut is the optimizer's to say (ShardLayout, per parameter):
// any row for the elementwise optimizers (SGD, Adagrad, Adam, AdamW) and for Muon, whose state is
// elementwise (it gathers a matrix's rows to orthogonalise it); whole rows of blocks for Shampoo
// and SOAP, whose blocks then never straddle two ranks (optim/sharding.hpp gives each optimizer's
// layouts). The units (runs of rows) are assigned by
// the distributed step's greedy longest-processing-time rule, each to the rank least loaded so
// far, and a parameter's units then lie in rank order. A parameter may also be replicated: every
// rank holds it whole and its gradient is all-reduced (a scalar; a tensor no band of which an
// optimizer reads as it reads the whole).
//
// Every rank issues the same collectives in the same order: the schedule of a step is fixed by
// its pass count (start_step), one pass being the forward need() of every layer, then need() and
// ready() of every layer in reverse. A rank with no samples in a pass runs pass_without_data();
// a rank whose passes failed hands the failure to finish_step(), which first runs the rest of the
// schedule with zero gradients, so that no rank waits for it, then makes the failure an error on
// every rank, before any optimizer state or value changes.
//
//   ParameterShards<Space, float> shards(space, mesh.data_parallel(), model.parameter_specs(), layers);
//   shards.scatter_values(space, model.parameters().values());   // the model's initial values
//   model.adopt_parameters(shards.gathered());                   // the model's own are released
//   shards.start_step(space, micro_batches);
//   model.train_batch(space, x, y, false, shards.ready_hook(space), shards.needed_hook(space));
//   shards.finish_step(space, samples, "");                      // owned gradients: the mean
//   optimizer.step(space, shards.owned());
//   shards.values_changed();

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>
#include <lather/comm/request.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/parameters.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lather::comm {

/// How the ranks may divide one parameter (what its optimizer updates whole).
struct ShardLayout {
  /// Bands begin and end at multiples of this many rows (the last unit of a parameter may be
  /// shorter); the parameter's rows or more: it is owned whole by one rank. >= 1.
  std::int64_t unit_rows = 1;
  /// The relative cost of one whole unit, which the assignment balances; 0: its elements.
  double unit_cost = 0;
  /// Every rank holds the parameter whole, and its gradient is all-reduced (always for a scalar).
  bool replicated = false;
};

/// The spec of rows [begin, end) of a model's parameter as slices() hands it to an optimizer: a
/// band of a weight shard's slice along its rows stays a slice of the same global tensor, read as
/// that shard's is; a band of a slice along a later axis is that slice's rows too
/// (ParameterSpec::row_offset), read as the slice is; any other band is a slice of the tensor this
/// rank holds, read as the whole tensor is (ParameterSpec::band_of_whole).
ParameterSpec band_of(const ParameterSpec& model, std::int64_t begin, std::int64_t end);

/// Bytes this rank holds for sharded parameters, by kind (measured from the Views' extents).
struct ShardMemory {
  std::int64_t owned_values = 0, owned_gradients = 0;
  std::int64_t gather_values = 0, gather_gradients = 0;  ///< the two buffers of each
  std::int64_t total() const { return owned_values + owned_gradients + gather_values + gather_gradients; }
};

template <class ExecutionSpace, class Scalar>
class ParameterShards {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using Parameters = ParameterList<Scalar, memory_space>;
  using tensor = typename Parameters::tensor;
  using tensor_list = typename Parameters::tensor_list;
  /// The parameters [first, last) of the model's list that one layer's passes read together.
  struct Layer {
    std::size_t first = 0, last = 0;
  };

  /// `specs`: the model's parameters (with weight shards, this shard's slices); `layers`:
  /// consecutive ranges covering them in order; `layouts`: one per parameter, or none (bands of
  /// any rows). Allocates the owned bands (zero) and the gather buffers. Collective over `group`
  /// (the ranks agree on the layout and on any failure).
  ParameterShards(const ExecutionSpace& space, const Group& group, const std::vector<ParameterSpec>& specs,
                  std::vector<Layer> layers, std::vector<ShardLayout> layouts = {});
  ~ParameterShards();
  ParameterShards(const ParameterShards&) = delete;
  ParameterShards& operator=(const ParameterShards&) = delete;

  const Group& group() const { return m_group; }
  const std::vector<Layer>& layers() const { return m_layers; }
  /// The model's parameters, whole.
  const std::vector<ParameterSpec>& specs() const { return m_specs; }
  /// Elements of parameter i that each rank of the group holds (its band), in rank order.
  const std::vector<std::size_t>& counts(std::size_t parameter) const { return m_counts.at(parameter); }
  /// This rank's rows [begin, end) of parameter i's leading dimension.
  std::pair<std::int64_t, std::int64_t> band(std::size_t parameter) const { return m_bands.at(parameter); }
  /// Whether parameter i is held whole by every rank (ShardLayout::replicated).
  bool replicated(std::size_t parameter) const { return m_layouts.at(parameter).replicated; }
  /// This rank's bands that hold any row, as parameters named like the model's, of shape
  /// [band rows, trailing dimensions...]: what the optimizer updates (optimizer.step(space,
  /// owned())). owned_index(k) is entry k's position in the model's list. A band of some rows
  /// is a slice (split_axis 0 at its first row, global_shape the parameter's); a whole one is not.
  const Parameters& owned() const { return m_owned; }
  /// Every parameter of the model's list, in order, as this rank's band_of() its rows (empty
  /// where it holds no row, whole where it holds all; a replicated parameter as the model gave
  /// it): for an optimizer that must see the same list on every rank (Shampoo built with the group
  /// as its weight shards sums a tensor's norms over the bands).
  const Parameters& slices() const { return m_slices; }
  std::size_t owned_index(std::size_t k) const { return m_owned_index.at(k); }
  /// The model's parameters at full shape, their values and gradients in the gather buffers (a
  /// layer's in those of its parity): hand them to the model (Mlp::adopt_parameters). Whole only
  /// between need() and the next need() of the other layers of that parity.
  const Parameters& gathered() const { return m_gathered; }
  ShardMemory memory() const;

  /// Owned values := this rank's bands of `full` (the model's values at full shape). Local.
  void scatter_values(const ExecutionSpace& space, const tensor_list& full);
  /// full := every parameter's values, all-gathered (for a checkpoint). Collective.
  void gather_values(const ExecutionSpace& space, const tensor_list& full);

  // ---- a step ----------------------------------------------------------------------------------

  /// Begins a step of `passes` forward-and-backward passes (the same count on every rank; a rank
  /// without samples in a pass runs pass_without_data()). Local.
  void start_step(const ExecutionSpace& space, int passes);
  /// ParametersNeeded: the values of the layer [first, last) whole in its gather buffer (waiting
  /// for its prefetch, or gathering them now), and the next layer of the pass's gather started.
  /// Collective. Outside a step (evaluation: forward passes only) as well.
  void need(const ExecutionSpace& space, std::size_t first, std::size_t last);
  /// GradientsReady: the layer [first, last)'s gradients, summed over the group, added to the
  /// owned gradients of their bands. Collective. An empty range does nothing.
  void ready(const ExecutionSpace& space, std::size_t first, std::size_t last);
  ParametersNeeded needed_hook(const ExecutionSpace& space);
  GradientsReady ready_hook(const ExecutionSpace& space);
  /// One pass's collectives for a rank without samples in it: it contributes zero gradients.
  void pass_without_data(const ExecutionSpace& space);
  /// A forward pass's collectives for a rank without samples in an evaluation round.
  void forward_without_data(const ExecutionSpace& space);
  /// Ends an evaluation round's forward pass: where this rank's pass failed part-way, or before
  /// its first layer (`local_error`), the gathers it still owes run first; then one agreement over
  /// the group makes a failure the same lather::Error on every rank.
  void finish_forward(const ExecutionSpace& space, const std::string& local_error);
  /// Ends the step: with `local_error` (this rank's passes failed), the rest of the schedule runs
  /// first with zero gradients. Then one agreement over the group: a failure, or a NaN or Inf in
  /// any owned gradient, throws the same lather::Error on every rank (naming the rank, and the
  /// parameter). Else the owned gradients become the weighted mean (divided by the sum over the
  /// group of `local_weight`, this rank's samples or tokens), which this returns.
  double finish_step(const ExecutionSpace& space, double local_weight, const std::string& local_error);
  /// After the owned values changed (the optimizer's step, a checkpoint load): the gather buffers
  /// are stale. Local.
  void values_changed();

 private:
  std::size_t layer_of(std::size_t first, std::size_t last, const char* call) const;
  void start_gather(const ExecutionSpace& space, std::size_t layer);
  void wait_gather(std::size_t layer);
  void advance(bool is_need, std::size_t layer);
  void run_rest_of_step(const ExecutionSpace& space);

  Group m_group;
  std::vector<ParameterSpec> m_specs;
  std::vector<Layer> m_layers;
  std::vector<ShardLayout> m_layouts;                          ///< per parameter
  std::vector<std::int64_t> m_row_elements;                    ///< per parameter
  std::vector<std::pair<std::int64_t, std::int64_t>> m_bands;  ///< per parameter: this rank's rows
  std::vector<std::vector<std::size_t>> m_counts;              ///< per parameter: elements per rank
  std::vector<std::int64_t> m_offset_in_layer;                 ///< per parameter: in its gradient buffer
  std::vector<std::int64_t> m_value_offset_in_layer;           ///< per parameter: in its value buffer
  std::vector<std::size_t> m_layer_of;                         ///< per parameter
  tensor m_owned_values, m_owned_gradients;                    ///< every band of this rank, in list order
  std::vector<tensor> m_band_values, m_band_gradients;         ///< per parameter (empty without rows)
  Parameters m_owned, m_slices, m_gathered;
  std::vector<std::size_t> m_owned_index;
  std::vector<int> m_owned_slot;  ///< per parameter: its entry in m_owned, -1 when it holds no row
  tensor m_values[2], m_gradients[2];
  int m_holds[2] = {-1, -1};  ///< the layer whose values each value buffer holds whole (-1: none)
  int m_in_flight = -1;       ///< the layer whose gather is in flight (-1: none)
  std::vector<Request> m_requests;
  // The step's schedule: passes of (L needs forward, then L x (need, ready) backward).
  long m_step_ops = 0, m_done_ops = 0;
  bool m_in_step = false;
  std::size_t m_forward_position = 0;  ///< outside a step: the layers of this forward pass gathered
  long m_forwards_completed = 0;       ///< outside a step: forward passes since finish_forward()
};

}  // namespace lather::comm
