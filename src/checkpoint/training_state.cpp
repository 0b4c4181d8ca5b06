#include <lather/checkpoint/checkpoint.hpp>
#include <lather/checkpoint/page_aligned.hpp>

#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <cstring>
#include <functional>
#include <memory>

namespace lather::checkpoint {

namespace {

using HostBytes = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Host staging for one array: the bytes a rank reads into (`slice`), and the part it writes
/// (`write`, a subset of the rows with its own compacted buffer, or the same as `slice`). Both
/// page-aligned: a save writes their whole pages to the disk with no further copy.
struct Staged {
  ArraySlice slice;
  PageAlignedVector<char> host;
  std::function<void()> to_device;  // after a load: copies on the caller's execution space
  bool partial_write = false;
  ArraySlice write;
  PageAlignedVector<char> write_host;
};

/// The selection of a parameter-shaped array: whole, or this rank's block of the global tensor.
void place_like_parameter(ArraySlice& slice, const optim::ParameterSpec& spec, const WriterRoles& roles) {
  slice.shape = spec.global();
  if (!spec.split()) {
    // Every rank of every shard holds it (parameters, and state shaped like them that its
    // optimizer marks as the same on every rank): the ranks of shard 0 write a share each.
    slice.selection = ArraySlice::Selection::whole;
    slice.writer = roles.shard == 0;
    return;
  }
  slice.selection = ArraySlice::Selection::block;
  slice.offset.assign(spec.shape.size(), 0);
  slice.count.assign(spec.shape.begin(), spec.shape.end());
  slice.offset[spec.split_axis] = spec.split_offset;
  // Every replica holds the same block: each writes a share of its rows (a save splits a block
  // among all the ranks that select it, whatever their writer flag).
  slice.writer = roles.replica_root;
}

template <class ExecutionSpace, class MemorySpace>
std::unique_ptr<Staged> stage_state(const ExecutionSpace& space, const optim::StateArray<MemorySpace>& a,
                                    const std::vector<optim::ParameterSpec>& specs, const WriterRoles& roles,
                                    bool copy_out) {
  auto s = std::make_unique<Staged>();
  s->slice.path = "optimizer/" + a.name;
  s->slice.dtype = a.dtype;
  s->slice.shape = a.shape;
  s->slice.stacked = a.stacked;
  const std::size_t bytes = a.device_bytes.size() + a.host_bytes.size();
  if (a.parameter >= 0) {
    place_like_parameter(s->slice, specs[a.parameter], roles);
    s->slice.writer = s->slice.writer && a.writer;
  } else if (!a.rows.empty() || (a.stacked && bytes == 0 && element_count(a.shape) > 0)) {
    // Listed rows; none where this rank stores none of a stacked array's items (distributed
    // Shampoo on a rank that updates no preconditioned block).
    s->slice.selection = ArraySlice::Selection::rows;
    s->slice.rows = a.rows;
    s->slice.writer = a.writer;
  } else {
    s->slice.selection = ArraySlice::Selection::whole;
    s->slice.writer = a.writer && roles.world_root;
  }
  LATHER_REQUIRE(bytes == s->slice.bytes(), "optimizer state '", a.name, "' holds ", bytes,
                 " bytes, its checkpoint selection ", s->slice.bytes());
  s->host.resize(bytes);
  HostBytes host(s->host.data(), bytes);
  if (a.host_bytes.size() > 0) {
    const HostBytes target = a.host_bytes;
    if (copy_out) std::memcpy(host.data(), target.data(), bytes);
    s->to_device = [target, host] { std::memcpy(target.data(), host.data(), host.size()); };
  } else {
    const auto device = a.device_bytes;
    if (copy_out) {
      Kokkos::deep_copy(space, host, device);
      ::lather::Impl::fence(space, "Lather::Checkpointer: optimizer state on the host");
    }
    s->to_device = [space, device, host] { Kokkos::deep_copy(space, device, host); };
  }
  // Rows of parameters that every weight shard holds are written by shard 0 only.
  if (s->slice.selection == ArraySlice::Selection::rows && !a.row_parameter.empty()) {
    std::vector<std::size_t> keep;
    for (std::size_t k = 0; k < a.rows.size(); ++k)
      if (specs[a.row_parameter[k]].split() || roles.shard == 0) keep.push_back(k);
    if (keep.size() != a.rows.size()) {
      s->partial_write = true;
      s->write = s->slice;
      s->write.rows.clear();
      const std::size_t row_bytes = a.rows.empty() ? 0 : bytes / a.rows.size();
      s->write_host.resize(keep.size() * row_bytes);
      for (std::size_t j = 0; j < keep.size(); ++j) {
        s->write.rows.push_back(a.rows[keep[j]]);
        if (copy_out)
          std::memcpy(s->write_host.data() + j * row_bytes, s->host.data() + keep[j] * row_bytes, row_bytes);
      }
    }
  }
  return s;
}

/// Host staging of parameters and optimizer state; with `copy_out` the device data is copied in,
/// and the caller fences `space` before reading it.
template <class ExecutionSpace, class Scalar>
std::vector<std::unique_ptr<Staged>> stage_all(const ExecutionSpace& space,
                                               optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                               const TensorList<Scalar, typename ExecutionSpace::memory_space>& params,
                                               const WriterRoles& roles, bool copy_out) {
  const auto& specs = optimizer.parameters();
  LATHER_REQUIRE(params.size() == specs.size(), "checkpoint: ", params.size(),
                 " parameter tensors for an optimizer of ", specs.size(), " parameters");
  std::vector<std::unique_ptr<Staged>> staged;
  for (std::size_t p = 0; p < specs.size(); ++p) {
    auto s = std::make_unique<Staged>();
    s->slice.path = "parameters/" + specs[p].name;
    s->slice.dtype = optim::dtype_of<Scalar>();
    place_like_parameter(s->slice, specs[p], roles);
    LATHER_REQUIRE(std::int64_t(params[p].size()) == element_count(specs[p].shape), "checkpoint: parameter '",
                   specs[p].name, "' has ", params[p].size(), " elements, expected ", element_count(specs[p].shape));
    s->host.resize(params[p].size() * sizeof(Scalar));
    Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(
        reinterpret_cast<Scalar*>(s->host.data()), params[p].size());
    if (copy_out) Kokkos::deep_copy(space, host, params[p]);
    const auto device = params[p];
    s->to_device = [space, device, host] { Kokkos::deep_copy(space, device, host); };
    staged.push_back(std::move(s));
  }
  for (const auto& a : optimizer.state_arrays(space)) staged.push_back(stage_state(space, a, specs, roles, copy_out));
  for (auto& s : staged) {
    s->slice.data = s->host.data();
    s->write.data = s->write_host.data();
  }
  return staged;
}

}  // namespace

template <class ExecutionSpace, class Scalar>
std::string Checkpointer::save(const ExecutionSpace& space, optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                               const TensorList<Scalar, typename ExecutionSpace::memory_space>& params,
                               const TrainingState& state, const WriterRoles& roles) {
  ::lather::Impl::ScopedRegion region("Lather::Checkpointer::save");
  optimizer.values_needed(space);  // an exchange left for the forward: the file holds the step's values
  // Staging can fail on one rank (a parameter list that does not match the optimizer, memory):
  // agreed before the collective save.
  std::vector<std::unique_ptr<Staged>> staged;
  m_group.run_agreed("", [&] {
    staged = stage_all(space, optimizer, params, roles, true);
    ::lather::Impl::fence(space, "Lather::Checkpointer::save: state copied to the host");
  });
  std::vector<ArraySlice> arrays;
  for (const auto& s : staged) arrays.push_back(s->partial_write ? s->write : s->slice);
  std::vector<std::uint64_t> rng = state.rng;
  ArraySlice rng_slice;
  rng_slice.path = "training/rng";
  rng_slice.dtype = ::lather::DType::int64;
  rng_slice.shape = {std::int64_t(rng.size())};
  rng_slice.writer = roles.world_root;
  rng_slice.data = rng.data();
  if (!rng.empty()) arrays.push_back(rng_slice);

  Attributes attributes = state.extra;
  attributes.integers["epoch"] = state.epoch;
  attributes.integers["sample_offset"] = state.sample_offset;
  attributes.integers["optimizer_step"] = optimizer.step_count();
  attributes.integers["rng_words"] = std::int64_t(rng.size());
  attributes.integers["world_size"] = m_group.size();
  // On a sharded Mesh the checkpointer knows the shard count; otherwise the caller says it.
  attributes.integers["weight_shards"] = m_weight_shards > 1 ? m_weight_shards : state.weight_shards;
  attributes.integers["pipeline_stages"] = m_pipeline_stages > 1 ? m_pipeline_stages : state.pipeline_stages;
  attributes.strings["optimizer"] = optimizer.name();
  // All options in one attribute, one "name = value" per line: every attribute costs a collective
  // operation in parallel HDF5, and an optimizer has dozens of options.
  std::string options;
  for (const auto& [key, value] : optimizer.describe()) options += key + " = " + value + "\n";
  attributes.strings["optimizer_options"] = options;
  const std::string file = save(optimizer.step_count(), arrays, attributes);
  optimizer.state_released();
  return file;
}

template <class ExecutionSpace, class Scalar>
TrainingState Checkpointer::restore(const ExecutionSpace& space, const std::string& file,
                                    optim::Optimizer<ExecutionSpace, Scalar>& optimizer,
                                    const TensorList<Scalar, typename ExecutionSpace::memory_space>& params) const {
  ::lather::Impl::ScopedRegion region("Lather::Checkpointer::restore");
  optimizer.values_needed(space);  // no gather left in flight to overwrite the loaded values
  const Attributes root = read_attributes(file);
  const auto integer = [&](const char* name) -> std::int64_t {
    const auto it = root.integers.find(name);
    LATHER_REQUIRE(it != root.integers.end(), "checkpoint '", file, "' has no root attribute '", name, "'");
    return it->second;
  };
  const auto optimizer_name = root.strings.find("optimizer");
  LATHER_REQUIRE(optimizer_name != root.strings.end() && optimizer_name->second == optimizer.name(), "checkpoint '",
                 file, "' holds the state of optimizer '",
                 optimizer_name == root.strings.end() ? std::string("?") : optimizer_name->second, "', not of '",
                 optimizer.name(), "'");
  const std::int64_t words = integer("rng_words");
  LATHER_REQUIRE(words >= 0 && words <= 4096, "checkpoint '", file, "': implausible rng_words ", words);

  std::vector<std::unique_ptr<Staged>> staged;
  m_group.run_agreed("", [&] { staged = stage_all(space, optimizer, params, WriterRoles{false, false, 0}, false); });
  std::vector<ArraySlice> arrays;
  for (const auto& s : staged) {
    ArraySlice read = s->slice;
    // Every rank reads the whole of what it holds, whatever it would write.
    arrays.push_back(read);
  }
  TrainingState state;
  state.rng.resize(std::size_t(words));
  if (words > 0) {
    ArraySlice rng;
    rng.path = "training/rng";
    rng.dtype = ::lather::DType::int64;
    rng.shape = {words};
    rng.data = state.rng.data();
    arrays.push_back(rng);
  }
  load(file, arrays, nullptr);
  for (const auto& s : staged) s->to_device();
  // The host staging is freed when this returns.
  ::lather::Impl::fence(space, "Lather::Checkpointer::restore: state copied to the device");
  optimizer.state_restored(space, long(integer("optimizer_step")));
  state.epoch = long(integer("epoch"));
  state.sample_offset = long(integer("sample_offset"));
  state.world_size = int(integer("world_size"));
  state.weight_shards = int(integer("weight_shards"));
  const auto stages = root.integers.find("pipeline_stages");  // files written before stages lack it
  state.pipeline_stages = stages == root.integers.end() ? 1 : int(stages->second);
  state.extra = root;
  state.file = file;
  return state;
}

#define LATHER_INSTANTIATE_TRAINING_STATE(SPACE, SCALAR)                                                 \
  template std::string Checkpointer::save<SPACE, SCALAR>(const SPACE&, optim::Optimizer<SPACE, SCALAR>&, \
                                                         const TensorList<SCALAR, SPACE::memory_space>&, \
                                                         const TrainingState&, const WriterRoles&);      \
  template TrainingState Checkpointer::restore<SPACE, SCALAR>(const SPACE&, const std::string&,          \
                                                              optim::Optimizer<SPACE, SCALAR>&,          \
                                                              const TensorList<SCALAR, SPACE::memory_space>&) const;
LATHER_INSTANTIATE_TRAINING_STATE(DefaultExecutionSpace, float)
LATHER_INSTANTIATE_TRAINING_STATE(DefaultExecutionSpace, double)
#if LATHER_HOST_SPACE_DIFFERS
LATHER_INSTANTIATE_TRAINING_STATE(DefaultHostExecutionSpace, float)
LATHER_INSTANTIATE_TRAINING_STATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::checkpoint
