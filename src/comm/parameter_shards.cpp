#include <lather/comm/device_mpi.hpp>
#include <lather/comm/parameter_shards.hpp>

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/hash.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <queue>

namespace lather::comm {

namespace {

/// The leading dimension of a shape (a scalar is one row).
std::int64_t leading(const TensorShape& shape) { return shape.empty() ? 1 : shape.front(); }

/// Each rank's rows [begin, end) of every parameter, by greedy longest-processing-time over the
/// units: the parameters by descending unit cost (ties: list order), each unit to the rank least
/// loaded so far (ties: the lower rank). A parameter's units then lie in rank order, as many on
/// each rank as it took, so that its bands are contiguous. Replicated parameters are whole on
/// every rank. The same on every rank.
std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> assign_bands(const std::vector<ParameterSpec>& specs,
                                                                             const std::vector<ShardLayout>& layouts,
                                                                             int parts) {
  const std::size_t n = specs.size();
  std::vector<std::int64_t> rows(n), unit(n), units(n, 0);  // per parameter: rows, rows per unit, units
  std::vector<double> cost(n, 0);
  std::vector<std::vector<std::int64_t>> taken(n, std::vector<std::int64_t>(std::size_t(parts), 0));
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i) {
    rows[i] = leading(specs[i].shape);
    unit[i] = std::min(layouts[i].unit_rows, rows[i]);
    if (layouts[i].replicated) continue;
    units[i] = (rows[i] + unit[i] - 1) / unit[i];
    cost[i] =
        layouts[i].unit_cost > 0 ? layouts[i].unit_cost : double(unit[i] * (element_count(specs[i].shape) / rows[i]));
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(std::size_t(parts), 0.0);
  using Load = std::pair<double, int>;  // the least loaded rank on top (ties: the lower rank)
  for (std::size_t i : order) {
    std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least;
    for (int r = 0; r < parts; ++r) least.push({load[std::size_t(r)], r});
    for (std::int64_t k = 0; k < units[i]; ++k) {
      const auto [l, r] = least.top();
      least.pop();
      ++taken[i][std::size_t(r)];
      least.push({l + cost[i], r});
    }
    for (; !least.empty(); least.pop()) load[std::size_t(least.top().second)] = least.top().first;
    // The parameter's last unit may be shorter: it lies on the last rank holding any, which then
    // carries only its rows' share of a unit's cost.
    const std::int64_t short_rows = rows[i] - (units[i] - 1) * unit[i];
    for (int r = parts; r-- > 0;)
      if (taken[i][std::size_t(r)] > 0) {
        load[std::size_t(r)] -= cost[i] * double(unit[i] - short_rows) / double(unit[i]);
        break;
      }
  }
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> bands(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t at = 0;
    for (int r = 0; r < parts; ++r) {
      if (layouts[i].replicated) {
        bands[i].emplace_back(0, rows[i]);
        continue;
      }
      const std::int64_t end = std::min(rows[i], at + taken[i][std::size_t(r)] * unit[i]);
      bands[i].emplace_back(at, end);
      at = end;
    }
  }
  return bands;
}

}  // namespace

ParameterSpec band_of(const ParameterSpec& model, std::int64_t begin, std::int64_t end) {
  ParameterSpec band = model;
  if (band.shape.empty()) return band;  // a scalar has no rows
  band.shape.front() = end - begin;
  if (model.split_axis == 0) {
    band.split_offset = model.split_offset + begin;
  } else if (model.split_axis > 0 && model.shape != model.global()) {  // a weight shard's column slice: its rows too
    band.row_offset = model.row_offset + begin;
  } else {
    band.split_axis = 0;
    band.split_offset = begin;
    band.global_shape = model.shape;
    band.band_of_whole = true;
  }
  return band;
}

template <class ExecutionSpace, class Scalar>
ParameterShards<ExecutionSpace, Scalar>::ParameterShards(const ExecutionSpace& space, const Group& group,
                                                         const std::vector<ParameterSpec>& specs,
                                                         std::vector<Layer> layers, std::vector<ShardLayout> layouts)
    : m_group(group), m_specs(specs), m_layers(std::move(layers)), m_layouts(std::move(layouts)) {
  if (m_layouts.empty()) m_layouts.resize(specs.size());
  // A scalar has no rows to split: every rank holds it.
  for (std::size_t i = 0; i < specs.size() && i < m_layouts.size(); ++i)
    if (specs[i].shape.empty()) m_layouts[i].replicated = true;
  const int parts = group.size(), part = group.rank();
  // The layout is checked, and the memory allocated, inside one agreement: a rank whose layout
  // differs from rank 0's, or whose allocation fails, is an error on every rank.
  ::lather::Impl::Fnv1a layout;
  for (const auto& spec : specs) {
    layout.add(spec.name);
    for (auto d : spec.shape) layout.add(std::uint64_t(d));
  }
  for (const auto& layer : m_layers) layout.add(std::uint64_t(layer.first)).add(std::uint64_t(layer.last));
  for (const auto& l : m_layouts) {
    std::uint64_t cost_bits = 0;
    std::memcpy(&cost_bits, &l.unit_cost, sizeof cost_bits);
    layout.add(std::uint64_t(l.unit_rows)).add(cost_bits).add(std::uint64_t(l.replicated));
  }
  std::uint64_t rank0_layout = layout.value();
  group.broadcast(&rank0_layout, 1, 0);
  group.run_agreed("ParameterShards", [&] {
    LATHER_REQUIRE(rank0_layout == layout.value(),
                   "the parameters, layers or layouts differ from group rank 0's (names, shapes, layer ranges and "
                   "shard layouts must match)");
    LATHER_REQUIRE(m_layouts.size() == specs.size(), m_layouts.size(), " shard layouts for ", specs.size(),
                   " parameters");
    for (std::size_t i = 0; i < specs.size(); ++i) {
      specs[i].validate();
      LATHER_REQUIRE(
          m_layouts[i].unit_rows >= 1 && std::isfinite(m_layouts[i].unit_cost) && m_layouts[i].unit_cost >= 0,
          "parameter '", specs[i].name, "': shard layout of ", m_layouts[i].unit_rows, " rows per unit and unit cost ",
          m_layouts[i].unit_cost, " (need >= 1 row and a cost >= 0)");
    }
    std::size_t expected = 0;
    for (std::size_t l = 0; l < m_layers.size(); ++l) {
      LATHER_REQUIRE(m_layers[l].first == expected && m_layers[l].last > m_layers[l].first, "layer ", l,
                     " covers parameters [", m_layers[l].first, ", ", m_layers[l].last,
                     "); layers must be non-empty and follow each other from parameter 0");
      expected = m_layers[l].last;
    }
    LATHER_REQUIRE(expected == specs.size(), "the layers cover ", expected, " of the ", specs.size(), " parameters");

    const std::size_t n = specs.size();
    m_row_elements.resize(n);
    m_bands.resize(n);
    m_counts.resize(n);
    m_offset_in_layer.resize(n);
    m_layer_of.resize(n);
    m_owned_slot.assign(n, -1);
    m_value_offset_in_layer.resize(n);
    const auto bands = assign_bands(specs, m_layouts, parts);
    std::int64_t owned_total = 0, layer_size[2] = {0, 0}, value_layer_size[2] = {0, 0};
    for (std::size_t l = 0; l < m_layers.size(); ++l) {
      std::int64_t offset = 0, value_offset = 0;
      for (std::size_t i = m_layers[l].first; i < m_layers[l].last; ++i) {
        const std::int64_t rows = leading(specs[i].shape);
        m_row_elements[i] = rows > 0 ? element_count(specs[i].shape) / rows : 0;
        m_bands[i] = bands[i][std::size_t(part)];
        m_counts[i].resize(std::size_t(parts));
        for (int r = 0; r < parts; ++r) {
          const auto b = bands[i][std::size_t(r)];
          m_counts[i][std::size_t(r)] = std::size_t((b.second - b.first) * m_row_elements[i]);
        }
        const std::int64_t mine = (m_bands[i].second - m_bands[i].first) * m_row_elements[i];
        owned_total += mine;
        m_offset_in_layer[i] = offset;
        m_value_offset_in_layer[i] = value_offset;
        m_layer_of[i] = l;
        offset += element_count(specs[i].shape);
        // A replicated parameter's values are read where they are owned.
        if (!m_layouts[i].replicated) value_offset += element_count(specs[i].shape);
      }
      layer_size[l % 2] = std::max(layer_size[l % 2], offset);
      value_layer_size[l % 2] = std::max(value_layer_size[l % 2], value_offset);
    }
    ::lather::Impl::fault_point("parameter_shards.construct");
    const auto alloc = [&](const char* label, std::int64_t count) {
      return tensor(Kokkos::view_alloc(space, std::string("Lather::ParameterShards::") + label), std::size_t(count));
    };
    m_owned_values = alloc("owned_values", owned_total);
    m_owned_gradients = alloc("owned_gradients", owned_total);
    for (int b = 0; b < 2; ++b) {
      m_values[b] = alloc(b == 0 ? "gather_values_0" : "gather_values_1", value_layer_size[b]);
      m_gradients[b] = alloc(b == 0 ? "gather_gradients_0" : "gather_gradients_1", layer_size[b]);
    }

    std::size_t owned_offset = 0;
    m_band_values.resize(n);
    m_band_gradients.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto range = std::make_pair(owned_offset, owned_offset + m_counts[i][std::size_t(part)]);
      m_band_values[i] = Kokkos::subview(m_owned_values, range);
      m_band_gradients[i] = Kokkos::subview(m_owned_gradients, range);
      owned_offset = range.second;
      // This rank's rows as a slice: in slices(), every sharded parameter is one (every rank then
      // lists the same split parameters); in owned(), the model's own spec where it holds all rows.
      const ParameterSpec& model = specs[i];
      const ParameterSpec slice = m_layouts[i].replicated ? model : band_of(model, m_bands[i].first, m_bands[i].second);
      m_slices.add(slice, m_band_values[i], m_band_gradients[i]);
      if (range.second > range.first) {
        m_owned_slot[i] = int(m_owned_index.size());
        m_owned_index.push_back(i);
        m_owned.add(slice.shape == model.shape ? model : slice, m_band_values[i], m_band_gradients[i]);
      }
      const int b = int(m_layer_of[i] % 2);
      const std::size_t elements = std::size_t(element_count(specs[i].shape));
      const auto at = std::make_pair(std::size_t(m_offset_in_layer[i]), std::size_t(m_offset_in_layer[i]) + elements);
      const auto value_at =
          std::make_pair(std::size_t(m_value_offset_in_layer[i]), std::size_t(m_value_offset_in_layer[i]) + elements);
      m_gathered.add(specs[i],
                     m_layouts[i].replicated ? m_band_values[i] : tensor(Kokkos::subview(m_values[b], value_at)),
                     Kokkos::subview(m_gradients[b], at));
    }
  });
}

template <class ExecutionSpace, class Scalar>
ParameterShards<ExecutionSpace, Scalar>::~ParameterShards() {
  // A gather still in flight (a step abandoned by an exception) reads the owned values and writes
  // a gather buffer: it completes before they are freed.
  for (auto& request : m_requests) {
    try {
      request.wait();
    } catch (...) {
    }
  }
}

template <class ExecutionSpace, class Scalar>
ShardMemory ParameterShards<ExecutionSpace, Scalar>::memory() const {
  const auto bytes = [](const tensor& t) { return std::int64_t(t.extent(0) * sizeof(Scalar)); };
  ShardMemory m;
  m.owned_values = bytes(m_owned_values);
  m.owned_gradients = bytes(m_owned_gradients);
  m.gather_values = bytes(m_values[0]) + bytes(m_values[1]);
  m.gather_gradients = bytes(m_gradients[0]) + bytes(m_gradients[1]);
  return m;
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::scatter_values(const ExecutionSpace& space, const tensor_list& full) {
  LATHER_REQUIRE(full.size() == m_specs.size(), "ParameterShards::scatter_values: ", full.size(), " tensors for ",
                 m_specs.size(), " parameters");
  for (std::size_t i = 0; i < m_specs.size(); ++i) {
    LATHER_REQUIRE(std::int64_t(full[i].extent(0)) == element_count(m_specs[i].shape),
                   "ParameterShards::scatter_values: parameter '", m_specs[i].name, "' has ", full[i].extent(0),
                   " elements; its shape ", to_string(m_specs[i].shape), " needs ", element_count(m_specs[i].shape));
    const auto begin = std::size_t(m_bands[i].first * m_row_elements[i]);
    Kokkos::deep_copy(space, m_band_values[i],
                      Kokkos::subview(full[i], std::make_pair(begin, begin + m_band_values[i].extent(0))));
  }
  ::lather::Impl::fence(space, "Lather::ParameterShards::scatter_values: copied");
  values_changed();
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::gather_values(const ExecutionSpace& space, const tensor_list& full) {
  LATHER_REQUIRE(full.size() == m_specs.size(), "ParameterShards::gather_values: ", full.size(), " tensors for ",
                 m_specs.size(), " parameters");
  for (std::size_t i = 0; i < m_specs.size(); ++i) {
    if (m_layouts[i].replicated)
      Kokkos::deep_copy(space, full[i], m_band_values[i]);
    else
      m_group.allgatherv(space, Kokkos::View<const Scalar*, memory_space>(m_band_values[i]), full[i], m_counts[i]);
  }
  ::lather::Impl::fence(space, "Lather::ParameterShards::gather_values: copied");
}

// ---- a step --------------------------------------------------------------------------------------

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::start_step(const ExecutionSpace& space, int passes) {
  LATHER_REQUIRE(!m_in_step, "ParameterShards::start_step: the previous step was not finished");
  LATHER_REQUIRE(m_forward_position == 0, "ParameterShards::start_step: a forward pass was not finished");
  LATHER_REQUIRE(passes >= 1, "ParameterShards::start_step: ", passes, " passes; a step has at least one");
  // The owned gradients are sums from zero: every pass adds (0 + x is x exactly).
  Kokkos::deep_copy(space, m_owned_gradients, Scalar(0));
  m_step_ops = long(passes) * 3 * long(m_layers.size());
  m_done_ops = 0;
  m_in_step = true;
}

template <class ExecutionSpace, class Scalar>
std::size_t ParameterShards<ExecutionSpace, Scalar>::layer_of(std::size_t first, std::size_t last,
                                                              const char* call) const {
  LATHER_REQUIRE(first < last && last <= m_specs.size() && m_layer_of[first] == m_layer_of[last - 1] &&
                     m_layers[m_layer_of[first]].first == first && m_layers[m_layer_of[first]].last == last,
                 "ParameterShards::", call, ": parameters [", first, ", ", last, ") are not one of the layers");
  return m_layer_of[first];
}

/// Checks that the op is the one the step's schedule expects next, and counts it.
template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::advance(bool is_need, std::size_t layer) {
  if (!m_in_step) {
    LATHER_REQUIRE(is_need, "ParameterShards::ready: outside a step (start_step)");
    LATHER_REQUIRE(layer == m_forward_position, "ParameterShards: a forward pass outside a step asked for layer ",
                   layer, " where the schedule has layer ", m_forward_position);
    m_forward_position = (m_forward_position + 1) % m_layers.size();
    if (m_forward_position == 0) ++m_forwards_completed;
    return;
  }
  const long layers = long(m_layers.size());
  LATHER_REQUIRE(m_done_ops < m_step_ops, "ParameterShards: the step's ", m_step_ops / (3 * layers),
                 " passes are done; a layer was asked for again");
  const long k = m_done_ops % (3 * layers);
  const bool expect_need = k < layers || (k - layers) % 2 == 0;
  const long expect_layer = k < layers ? k : layers - 1 - (k - layers) / 2;
  LATHER_REQUIRE(expect_need == is_need && expect_layer == long(layer), "ParameterShards: the passes asked for ",
                 is_need ? "the values" : "the reduction", " of layer ", layer, " where the schedule has ",
                 expect_need ? "the values" : "the reduction", " of layer ", expect_layer);
  ++m_done_ops;
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::start_gather(const ExecutionSpace& space, std::size_t layer) {
  const int b = int(layer % 2);
  m_holds[b] = -1;
  // Kernels that read this buffer (the layer that held it) are done before MPI writes it.
  ::lather::Impl::fence(space, "Lather::ParameterShards: buffer free before a gather");
  for (std::size_t i = m_layers[layer].first; i < m_layers[layer].last; ++i) {
    if (m_layouts[i].replicated) continue;  // its gathered values are its owned ones
    const auto whole = m_gathered.value(i);
    if (mpi_reads_in_place<memory_space>()) {
      m_requests.push_back(m_group.start_allgatherv(m_band_values[i].data(), whole.data(), m_counts[i]));
    } else {
      // MPI cannot read this memory: staged through the host, one parameter at a time, blocking.
      m_group.allgatherv(space, Kokkos::View<const Scalar*, memory_space>(m_band_values[i]), whole, m_counts[i]);
    }
  }
  m_in_flight = int(layer);
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::wait_gather(std::size_t layer) {
  for (auto& request : m_requests) request.wait();
  m_requests.clear();
  m_holds[layer % 2] = int(layer);
  m_in_flight = -1;
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::need(const ExecutionSpace& space, std::size_t first, std::size_t last) {
  ::lather::Impl::fault_point("parameter_shards.need");
  const std::size_t layer = layer_of(first, last, "need");
  // Forward, or backward: from the step's schedule (outside a step, evaluation: forward).
  const long layers = long(m_layers.size());
  const bool backward = m_in_step && m_done_ops % (3 * layers) >= layers;
  advance(true, layer);
  if (m_in_flight >= 0 && m_in_flight != int(layer)) wait_gather(std::size_t(m_in_flight));
  if (m_holds[layer % 2] != int(layer)) {
    if (m_in_flight != int(layer)) start_gather(space, layer);
    wait_gather(layer);
  }
  // The next layer of the pass moves into the other buffer while this one computes. At the end of
  // a forward pass the backward starts with the layers still whole; at the end of a backward, the
  // next forward does.
  const long next = backward ? long(layer) - 1 : long(layer) + 1;
  if (next >= 0 && next < layers && m_holds[next % 2] != int(next)) start_gather(space, std::size_t(next));
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::ready(const ExecutionSpace& space, std::size_t first, std::size_t last) {
  if (first == last) return;  // between layers: nothing in flight to progress
  const std::size_t layer = layer_of(first, last, "ready");
  advance(false, layer);
  // The backward's kernels wrote the gradients before MPI reads them. The reduction is in place:
  // this rank's band of the sum lands at the start of the layer's gradient buffer, which the next
  // pass overwrites, so no scratch holds it.
  ::lather::Impl::fence(space, "Lather::ParameterShards: gradients ready before the reduce-scatter");
  const int part = m_group.rank();
  for (std::size_t i = m_layers[layer].first; i < m_layers[layer].last; ++i) {
    const auto whole = m_gathered.gradient(i);
    const std::size_t mine = m_counts[i][std::size_t(part)];
    if (m_layouts[i].replicated) {
      m_group.allreduce(space, whole, Combine::sum);
    } else if (mpi_reads_in_place<memory_space>()) {
      m_group.reduce_scatter(whole.data(), whole.data(), m_counts[i], Combine::sum);
    } else {
      auto whole_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole);
      m_group.reduce_scatter(whole_host.data(), whole_host.data(), m_counts[i], Combine::sum);
      Kokkos::deep_copy(space, Kokkos::subview(whole, std::make_pair(std::size_t(0), mine)),
                        Kokkos::subview(whole_host, std::make_pair(std::size_t(0), mine)));
    }
    const auto owned = m_band_gradients[i];
    Kokkos::parallel_for(
        "Lather::ParameterShards::add_gradient", Kokkos::RangePolicy<ExecutionSpace>(space, 0, mine),
        KOKKOS_LAMBDA(std::int64_t k) { owned(k) += whole(k); });
  }
  ::lather::Impl::fence(space, "Lather::ParameterShards: gradients added");
}

template <class ExecutionSpace, class Scalar>
ParametersNeeded ParameterShards<ExecutionSpace, Scalar>::needed_hook(const ExecutionSpace& space) {
  return [this, space](std::size_t first, std::size_t last) { need(space, first, last); };
}

template <class ExecutionSpace, class Scalar>
GradientsReady ParameterShards<ExecutionSpace, Scalar>::ready_hook(const ExecutionSpace& space) {
  return [this, space](std::size_t first, std::size_t last) { ready(space, first, last); };
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::pass_without_data(const ExecutionSpace& space) {
  for (std::size_t l = 0; l < m_layers.size(); ++l) need(space, m_layers[l].first, m_layers[l].last);
  for (std::size_t l = m_layers.size(); l-- > 0;) {
    need(space, m_layers[l].first, m_layers[l].last);
    Kokkos::deep_copy(space, m_gradients[l % 2], Scalar(0));
    ready(space, m_layers[l].first, m_layers[l].last);
  }
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::forward_without_data(const ExecutionSpace& space) {
  LATHER_REQUIRE(!m_in_step, "ParameterShards::forward_without_data: inside a step (use pass_without_data)");
  for (const auto& layer : m_layers) need(space, layer.first, layer.last);
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::finish_forward(const ExecutionSpace& space,
                                                             const std::string& local_error) {
  LATHER_REQUIRE(!m_in_step, "ParameterShards::finish_forward: inside a step (finish_step ends it)");
  // The round's pass: the rest of it, or all of it where it failed before its first layer.
  if (m_forward_position != 0 || m_forwards_completed == 0) do
      need(space, m_layers[m_forward_position].first, m_layers[m_forward_position].last);
    while (m_forward_position != 0);
  m_forwards_completed = 0;
  m_group.agree_on_failure("ParameterShards: forward pass", local_error);
}

/// The rest of the step's schedule, with zero gradients: what a rank whose passes failed still
/// owes the others.
template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::run_rest_of_step(const ExecutionSpace& space) {
  const long layers = long(m_layers.size());
  while (m_done_ops < m_step_ops) {
    const long k = m_done_ops % (3 * layers);
    const bool is_need = k < layers || (k - layers) % 2 == 0;
    const auto& layer = m_layers[std::size_t(k < layers ? k : layers - 1 - (k - layers) / 2)];
    if (is_need) {
      need(space, layer.first, layer.last);
    } else {
      Kokkos::deep_copy(space, m_gradients[m_layer_of[layer.first] % 2], Scalar(0));
      ready(space, layer.first, layer.last);
    }
  }
}

template <class ExecutionSpace, class Scalar>
double ParameterShards<ExecutionSpace, Scalar>::finish_step(const ExecutionSpace& space, double local_weight,
                                                            const std::string& local_error) {
  LATHER_REQUIRE(m_in_step, "ParameterShards::finish_step: no step started (start_step)");
  std::string failure = local_error;
  if (failure.empty() && m_done_ops != m_step_ops)
    failure = ::lather::Impl::concat("the passes made ", m_done_ops, " of the step's ", m_step_ops,
                                     " gathers and reductions");
  // Whatever this rank's passes did, it makes the rest of the step's collectives: the others are
  // in them. An MPI error here propagates (MPI errors are fatal to the job).
  run_rest_of_step(space);
  m_in_step = false;
  if (m_in_flight >= 0) wait_gather(std::size_t(m_in_flight));
  if (failure.empty())
    failure = ::lather::Impl::local_failure("parameter_shards.finish", [&] {
      LATHER_REQUIRE(std::isfinite(local_weight) && local_weight >= 0, "the local weight must be finite and >= 0, got ",
                     local_weight);
      if (::lather::Impl::count_non_finite(space, m_owned_gradients.data(),
                                           std::int64_t(m_owned_gradients.extent(0))) == 0)
        return;
      for (std::size_t k = 0; k < m_owned.size(); ++k) {
        const auto g = m_owned.gradient(k);
        const auto bad = ::lather::Impl::count_non_finite(space, g.data(), std::int64_t(g.extent(0)));
        const std::size_t i = m_owned_index[k];
        LATHER_REQUIRE(bad == 0, "the summed gradient of '", m_specs[i].name, "' holds ", bad,
                       " NaN or Inf values in its rows [", m_bands[i].first, ", ", m_bands[i].second, ")");
      }
    });
  m_group.agree_on_failure("ParameterShards: step", failure);  // throws on every rank on a failure
  const double weight = m_group.allreduce(local_weight, Combine::sum);
  if (weight > 0) {
    const auto all = m_owned_gradients;
    const Scalar factor = Scalar(1.0 / weight);
    Kokkos::parallel_for(
        "Lather::ParameterShards::mean", Kokkos::RangePolicy<ExecutionSpace>(space, 0, all.extent(0)),
        KOKKOS_LAMBDA(std::int64_t k) { all(k) *= factor; });
  }
  return weight;
}

template <class ExecutionSpace, class Scalar>
void ParameterShards<ExecutionSpace, Scalar>::values_changed() {
  LATHER_REQUIRE(m_in_flight < 0, "ParameterShards::values_changed: a gather is in flight");
  m_holds[0] = m_holds[1] = -1;
}

template class ParameterShards<DefaultExecutionSpace, float>;
template class ParameterShards<DefaultExecutionSpace, double>;

}  // namespace lather::comm
