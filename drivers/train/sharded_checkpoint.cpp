#include "sharded_checkpoint.hpp"

#include "optimizer_factory.hpp"

#include <lather/core/error.hpp>

#include <map>

namespace lather::train {

namespace {

using Arrays = std::vector<StateArray<Memory>>;

/// A host copy of an array's bytes (wherever they live).
std::vector<char> host_bytes_of(const Space& space, const StateArray<Memory>& a) {
  if (a.host_bytes.data()) return std::vector<char>(a.host_bytes.data(), a.host_bytes.data() + a.host_bytes.extent(0));
  std::vector<char> out(a.device_bytes.extent(0));
  Kokkos::deep_copy(space, StateBytes<Kokkos::HostSpace>(out.data(), out.size()), a.device_bytes);
  ::lather::Impl::fence(space, "lather-train: state bytes on the host");
  return out;
}

void set_bytes(const Space& space, const StateArray<Memory>& a, const char* bytes) {
  if (a.host_bytes.data()) {
    std::copy(bytes, bytes + a.host_bytes.extent(0), a.host_bytes.data());
    return;
  }
  Kokkos::deep_copy(space, a.device_bytes,
                    StateBytes<Kokkos::HostSpace>(const_cast<char*>(bytes), a.device_bytes.extent(0)));
  ::lather::Impl::fence(space, "lather-train: state bytes in place");
}

/// For each array of the replicated optimizer's `whole` that mirrors a parameter, the array of the
/// same name among the bands' (null where this rank holds no row of the parameter).
std::vector<const StateArray<Memory>*> band_arrays_of(const Arrays& whole, const Arrays& bands) {
  std::map<std::string, const StateArray<Memory>*> by_name;
  for (const auto& a : bands) by_name[a.name] = &a;
  std::vector<const StateArray<Memory>*> out;
  for (const auto& a : whole) {
    LATHER_REQUIRE(a.parameter >= 0 || a.name == "step", "--shard-parameters: the optimizer's state array '", a.name,
                   "' is not shaped like a parameter; its checkpoint cannot be assembled from bands");
    const auto found = by_name.find(a.name);
    out.push_back(a.parameter >= 0 && found != by_name.end() ? found->second : nullptr);
  }
  return out;
}

/// Element counts of parameter i's bands on every rank, in bytes of `a`.
std::vector<std::size_t> band_bytes(const ParameterShards& shards, const StateArray<Memory>& a) {
  std::vector<std::size_t> bytes = shards.counts(std::size_t(a.parameter));
  for (auto& b : bytes) b *= size_of(a.dtype);
  return bytes;
}

/// The replicated optimizer's state := every rank's bands of the sharded one's (collective).
void gather_state(const Space& space, const ParameterShards& shards, optim::Optimizer<Space, float>& sharded,
                  optim::Optimizer<Space, float>& replicated) {
  const Arrays bands = sharded.state_arrays(space), whole = replicated.state_arrays(space);
  const auto mine = band_arrays_of(whole, bands);
  for (std::size_t k = 0; k < whole.size(); ++k) {
    if (whole[k].parameter < 0) continue;
    const auto counts = band_bytes(shards, whole[k]);
    std::vector<char> send = mine[k] ? host_bytes_of(space, *mine[k]) : std::vector<char>();
    std::vector<char> all(std::size_t(whole[k].local_elements()) * size_of(whole[k].dtype));
    LATHER_REQUIRE(send.size() == counts[std::size_t(shards.group().rank())], "--shard-parameters: state array '",
                   whole[k].name, "' holds ", send.size(), " bytes of its band; expected ",
                   counts[std::size_t(shards.group().rank())]);
    shards.group().allgatherv(send.data(), all.data(), counts);
    set_bytes(space, whole[k], all.data());
  }
  replicated.state_restored(space, sharded.step_count());
}

/// The sharded optimizer's state := this rank's bands of the replicated one's (local).
void scatter_state(const Space& space, const ParameterShards& shards, optim::Optimizer<Space, float>& replicated,
                   optim::Optimizer<Space, float>& sharded) {
  const Arrays bands = sharded.state_arrays(space), whole = replicated.state_arrays(space);
  const auto mine = band_arrays_of(whole, bands);
  for (std::size_t k = 0; k < whole.size(); ++k) {
    if (!mine[k]) continue;
    const auto counts = band_bytes(shards, whole[k]);
    std::size_t offset = 0;
    for (int r = 0; r < shards.group().rank(); ++r) offset += counts[std::size_t(r)];
    const std::vector<char> all = host_bytes_of(space, whole[k]);
    set_bytes(space, *mine[k], all.data() + offset);
  }
  sharded.state_restored(space, replicated.step_count());
}

}  // namespace

std::string save_sharded_checkpoint(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                    checkpoint::Checkpointer& checkpointer, optim::Optimizer<Space, float>& optimizer,
                                    ParameterShards& shards, const Position& next) {
  ParameterList<float, Memory> whole(space, shards.specs());
  shards.gather_values(space, whole.values());
  const auto replicated = make_optimizer(space, o, whole.specs(), mesh);
  gather_state(space, shards, optimizer, *replicated);
  return save_checkpoint(space, o, checkpointer, *replicated, whole, next);
}

checkpoint::TrainingState load_sharded_checkpoint(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                                  const ResumeSource& source,
                                                  const checkpoint::Checkpointer& checkpointer,
                                                  optim::Optimizer<Space, float>& optimizer, ParameterShards& shards,
                                                  const ProgressLog& log) {
  ParameterList<float, Memory> whole(space, shards.specs());
  const auto replicated = make_optimizer(space, o, whole.specs(), mesh);
  auto state = load_checkpoint(space, source, checkpointer, *replicated, whole, log);
  shards.scatter_values(space, whole.values());
  scatter_state(space, shards, *replicated, optimizer);
  return state;
}

}  // namespace lather::train
