#include "sharded_checkpoint.hpp"

#include "optimizer_factory.hpp"

#include <lather/core/error.hpp>

#include <algorithm>
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

/// For each array of the replicated optimizer's `whole`, the array of the same name among the
/// sharded optimizer's `bands` (null where this rank holds none of it).
std::vector<const StateArray<Memory>*> band_arrays_of(const Arrays& whole, const Arrays& bands) {
  std::map<std::string, const StateArray<Memory>*> by_name;
  for (const auto& a : bands) by_name[a.name] = &a;
  std::vector<const StateArray<Memory>*> out;
  for (const auto& a : whole) {
    const auto found = by_name.find(a.name);
    out.push_back(found != by_name.end() ? found->second : nullptr);
  }
  return out;
}

/// Element counts of parameter i's bands on every rank, in bytes of `a`.
std::vector<std::size_t> band_bytes(const ParameterShards& shards, const StateArray<Memory>& a) {
  std::vector<std::size_t> bytes = shards.counts(std::size_t(a.parameter));
  for (auto& b : bytes) b *= size_of(a.dtype);
  return bytes;
}

std::size_t row_bytes(const StateArray<Memory>& a) { return std::size_t(a.row_elements()) * size_of(a.dtype); }

/// The rows an array holds, by index of its leading dimension (all of them when it lists none).
std::vector<std::int64_t> rows_of(const StateArray<Memory>& a) {
  if (!a.rows.empty()) return a.rows;
  std::vector<std::int64_t> all(std::size_t(a.shape.empty() ? 1 : a.shape.front()));
  for (std::size_t k = 0; k < all.size(); ++k) all[k] = std::int64_t(k);
  return all;
}

/// Every rank's rows of a stacked array (their indices, and their bytes in the same order).
struct GatheredRows {
  std::vector<std::int64_t> rows;
  std::vector<char> bytes;
};
GatheredRows gather_rows(const comm::Group& group, const std::vector<std::int64_t>& rows,
                         const std::vector<char>& bytes, std::size_t bytes_per_row) {
  std::vector<std::size_t> counts(std::size_t(group.size()));
  const std::size_t my_rows = rows.size();
  group.allgather(&my_rows, 1, counts.data());
  std::size_t total = 0;
  for (auto c : counts) total += c;
  GatheredRows out{std::vector<std::int64_t>(total), std::vector<char>(total * bytes_per_row)};
  group.allgatherv(rows.data(), out.rows.data(), counts);
  for (auto& c : counts) c *= bytes_per_row;
  group.allgatherv(bytes.data(), out.bytes.data(), counts);
  return out;
}

/// The rows `wanted` of a stacked array, in that order, out of `bytes` holding the rows `held`
/// (`bytes_per_row` each). Throws, naming the array (`name`) and `where` it looked, when one is
/// missing.
std::vector<char> pick_rows(const std::vector<std::int64_t>& held, const char* bytes,
                            const std::vector<std::int64_t>& wanted, std::size_t bytes_per_row, const std::string& name,
                            const char* where) {
  std::map<std::int64_t, std::size_t> at;  // row index -> its place in `bytes`
  for (std::size_t k = 0; k < held.size(); ++k) at.emplace(held[k], k);
  std::vector<char> out(wanted.size() * bytes_per_row);
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const auto found = at.find(wanted[k]);
    LATHER_REQUIRE(found != at.end(), "--shard-parameters: ", where, " holds no row ", wanted[k], " of state array '",
                   name, "'");
    std::copy_n(bytes + found->second * bytes_per_row, bytes_per_row, out.begin() + std::ptrdiff_t(k * bytes_per_row));
  }
  return out;
}

/// How one array of the replicated optimizer is assembled from the sharded ones' (their sizes
/// agreed on beforehand, check_arrays; what may still fail here fails alike on every rank):
///  * shaped like a parameter: the ranks' bands, in rank order (a replicated parameter: its own);
///  * anything else by row index, every rank's rows placed where the whole lists them: Shampoo's
///    statistics (stacked, numbered alike by both: the sharded one sees every parameter as a slice
///    of the whole), SOAP's rows of the whole tensor's blocks (each band lists those it holds), an
///    array that every rank holds whole (all its rows).
void gather_array(const Space& space, const ParameterShards& shards, const StateArray<Memory>& whole,
                  const StateArray<Memory>* mine) {
  const comm::Group& group = shards.group();
  const std::vector<char> send = mine ? host_bytes_of(space, *mine) : std::vector<char>();
  std::vector<char> all(std::size_t(whole.local_elements()) * size_of(whole.dtype));
  if (whole.parameter >= 0) {
    if (shards.replicated(std::size_t(whole.parameter)))
      all = send;
    else
      group.allgatherv(send.data(), all.data(), band_bytes(shards, whole));
  } else {
    const std::size_t bytes_per_row = row_bytes(whole);
    const std::vector<std::int64_t> rows = mine ? rows_of(*mine) : std::vector<std::int64_t>();
    const GatheredRows every = gather_rows(group, rows, send, bytes_per_row);
    all = pick_rows(every.rows, every.bytes.data(), rows_of(whole), bytes_per_row, whole.name, "no rank");
  }
  set_bytes(space, whole, all.data());
}

/// This rank's part of one array of the sharded optimizer, from the replicated one's (local).
void scatter_array(const Space& space, const ParameterShards& shards, const StateArray<Memory>& whole,
                   const StateArray<Memory>& mine) {
  const std::vector<char> all = host_bytes_of(space, whole);
  if (whole.parameter >= 0 && !shards.replicated(std::size_t(whole.parameter))) {
    const auto counts = band_bytes(shards, whole);
    std::size_t offset = 0;
    for (int r = 0; r < shards.group().rank(); ++r) offset += counts[std::size_t(r)];
    set_bytes(space, mine, all.data() + offset);
  } else if (whole.parameter >= 0) {
    set_bytes(space, mine, all.data());
  } else {
    const auto out =
        pick_rows(rows_of(whole), all.data(), rows_of(mine), row_bytes(whole), whole.name, "the replicated state");
    set_bytes(space, mine, out.data());
  }
}

/// "" when this rank's arrays have the sizes the assembly expects of them, else what differs:
/// checked, and agreed on, before any of the collectives that rely on those sizes.
std::string check_arrays(const ParameterShards& shards, const Arrays& whole,
                         const std::vector<const StateArray<Memory>*>& mine) {
  for (std::size_t k = 0; k < whole.size(); ++k) {
    if (!mine[k] || whole[k].name == "step") continue;
    const auto bytes = std::size_t(mine[k]->local_elements()) * size_of(mine[k]->dtype);
    std::size_t expected = bytes;
    if (whole[k].parameter >= 0)
      expected = shards.replicated(std::size_t(whole[k].parameter))
                     ? std::size_t(whole[k].local_elements()) * size_of(whole[k].dtype)
                     : band_bytes(shards, whole[k])[std::size_t(shards.group().rank())];
    else
      expected = rows_of(*mine[k]).size() * row_bytes(whole[k]);
    if (bytes != expected || mine[k]->dtype != whole[k].dtype)
      return ::lather::Impl::concat("state array '", whole[k].name, "' holds ", bytes, " bytes of ",
                                    to_string(mine[k]->dtype), "; its part of the whole needs ", expected, " of ",
                                    to_string(whole[k].dtype));
  }
  return "";
}

/// The replicated optimizer's state := every rank's units of the sharded one's (collective).
void gather_state(const Space& space, const ParameterShards& shards, optim::Optimizer<Space, float>& sharded,
                  optim::Optimizer<Space, float>& replicated) {
  const Arrays bands = sharded.state_arrays(space), whole = replicated.state_arrays(space);
  const auto mine = band_arrays_of(whole, bands);
  shards.group().agree_on_failure("--shard-parameters: checkpoint", check_arrays(shards, whole, mine));
  for (std::size_t k = 0; k < whole.size(); ++k)
    if (whole[k].name != "step") gather_array(space, shards, whole[k], mine[k]);
  replicated.state_restored(space, sharded.step_count());
}

/// The sharded optimizer's state := this rank's units of the replicated one's. A stacked array of
/// the replicated optimizer that this rank does not store whole (its distributed step keeps a
/// share of the statistics on each rank) is first completed from the others (collective); then
/// every rank takes its part, and one agreement makes a failure there an error on every rank.
void scatter_state(const Space& space, const ParameterShards& shards, optim::Optimizer<Space, float>& replicated,
                   optim::Optimizer<Space, float>& sharded) {
  const Arrays bands = sharded.state_arrays(space), whole = replicated.state_arrays(space);
  const auto mine = band_arrays_of(whole, bands);
  shards.group().agree_on_failure("--shard-parameters: checkpoint", check_arrays(shards, whole, mine));
  std::vector<GatheredRows> stacks(whole.size());
  for (std::size_t k = 0; k < whole.size(); ++k)
    if (whole[k].stacked)
      stacks[k] = gather_rows(shards.group(), rows_of(whole[k]), host_bytes_of(space, whole[k]), row_bytes(whole[k]));
  shards.group().run_agreed("--shard-parameters: checkpoint", [&] {
    for (std::size_t k = 0; k < whole.size(); ++k) {
      if (!mine[k] || whole[k].name == "step") continue;
      if (!whole[k].stacked) {
        scatter_array(space, shards, whole[k], *mine[k]);
        continue;
      }
      // The whole stack, every rank's stored rows.
      StateArray<Memory> every = whole[k];
      every.rows = stacks[k].rows;
      every.device_bytes = StateBytes<Memory>();
      every.host_bytes = StateBytes<Kokkos::HostSpace>(stacks[k].bytes.data(), stacks[k].bytes.size());
      scatter_array(space, shards, every, *mine[k]);
    }
  });
  sharded.state_restored(space, replicated.step_count());
}

}  // namespace

std::string save_sharded_checkpoint(const Space& space, const TrainOptions& o, const comm::Mesh& mesh,
                                    checkpoint::Checkpointer& checkpointer, optim::Optimizer<Space, float>& optimizer,
                                    ParameterShards& shards, const checkpoint::TrainingState& state) {
  ParameterList<float, Memory> whole(space, shards.specs());
  shards.gather_values(space, whole.values());
  const auto replicated = make_optimizer(space, o, whole.specs(), mesh);
  gather_state(space, shards, optimizer, *replicated);
  return checkpointer.save(space, *replicated, whole, state);
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
