// lather-bench reduce: gradient reductions over MPI_COMM_WORLD (or a Mesh's data-parallel group)
// beside a raw MPI_Allreduce of the same bytes, measured in the same run. One JSON object per
// operation and size, printed by rank 0:
//   seconds       median time of one call (the slowest rank's median)
//   busbw         2 (n - 1) / n * bytes / seconds, in GB/s (n: ranks of the group that reduces)
//   raw_seconds   the same-run MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM) of the same bytes on
//                 the same group
//   ratio_to_raw  seconds / raw_seconds (time: 1.1 is 10% slower than raw)
//   bandwidth_ratio  raw_seconds / seconds (the fraction of raw bandwidth reached)
#include "bench_common.hpp"

#include <lather/comm/mesh.hpp>
#include <lather/comm/reduce.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lather::bench {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Tensors = TensorList<float, Space::memory_space>;

const std::vector<std::string> all_ops = {"raw",           "mean",     "grouped_mean",       "adasum",
                                          "adasum_approx", "model200", "model200_scattered", "allgather"};

struct ReduceBenchOptions {
  std::vector<std::string> ops = all_ops;
  /// Powers of 4 from 1 KiB to 256 MiB; "K", "M", "G" suffixes are binary.
  std::vector<std::string> bytes = {"1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M", "256M"};
  double min_seconds = 0.2;
  int max_repeats = 200;
  std::string wire = "native";
  std::size_t fusion_bytes = std::size_t(64) << 20;
  bool verify_layout = true;
};

std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    LATHER_FAIL("--bytes: '", text, "' is not a size (e.g. 4096, 64K, 16M, 1G)");
  }
  const std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix == "K" || suffix == "KiB")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "MiB")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else
    LATHER_REQUIRE(suffix.empty() || suffix == "B", "--bytes: unknown suffix in '", text, "'");
  const double bytes = value * scale;
  LATHER_REQUIRE(bytes >= 4, "--bytes: '", text, "' is less than one float");
  return std::size_t(bytes);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Timing {
  double seconds = 0, raw_seconds = 0;          ///< medians
  double min_seconds = 0, raw_min_seconds = 0;  ///< fastest calls
};

/// Times `call` and the raw baseline `raw` alternately (raw, call, raw, call, ...) for at least
/// `min_seconds` and 3 pairs, so that load from other processes hits both alike. Returns the
/// medians and minima of the slowest rank. Every rank takes the same number of repetitions.
Timing time_against_raw(const comm::Group& group, const ReduceBenchOptions& o, const std::function<void()>& raw,
                        const std::function<void()>& call) {
  raw();  // warm-up: first-touch allocations, communicator set-up
  call();
  group.barrier();
  double estimate = now();
  raw();
  call();
  estimate = group.allreduce(now() - estimate, comm::Combine::max);
  const int repeats = std::clamp(int(std::ceil(o.min_seconds / std::max(estimate, 1e-7))), 3, o.max_repeats);
  std::vector<double> raw_times, times;
  for (int k = 0; k < repeats; ++k) {
    for (int which = 0; which < 2; ++which) {
      group.barrier();
      const double start = now();
      (which == 0 ? raw : call)();
      (which == 0 ? raw_times : times).push_back(now() - start);
    }
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  double out[4] = {median(times), median(raw_times), *std::min_element(times.begin(), times.end()),
                   *std::min_element(raw_times.begin(), raw_times.end())};
  group.allreduce(out, 4, comm::Combine::max);
  return Timing{out[0], out[1], out[2], out[3]};
}

Tensors make_tensors(const std::vector<std::size_t>& sizes, float value) {
  Tensors tensors;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    tensors.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::gradient"), sizes[t]);
    // Values that keep Adasum's coefficients away from the zero-norm rule.
    Kokkos::deep_copy(tensors.back(), value + 0.001f * float(t % 7));
  }
  return tensors;
}

/// Tensors of the given sizes one after the other in one buffer, as a ParameterList holds them.
Tensors make_contiguous_tensors(const std::vector<std::size_t>& sizes, float value) {
  std::size_t total = 0;
  for (auto n : sizes) total += n;
  Kokkos::View<float*, Space::memory_space> buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::gradients"),
                                                   total);
  Tensors tensors;
  std::size_t offset = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    tensors.push_back(Kokkos::subview(buffer, std::make_pair(offset, offset + sizes[t])));
    Kokkos::deep_copy(tensors.back(), value + 0.001f * float(t % 7));
    offset += sizes[t];
  }
  return tensors;
}

/// 200 tensor sizes summing to about `elements`: a repeating pattern of large matrices, medium
/// and small vectors (weights 64, 16, 4, 1), each at least one element.
std::vector<std::size_t> model_sizes(std::size_t elements) {
  const int pattern[4] = {64, 1, 16, 4};
  double total_weight = 0;
  for (int t = 0; t < 200; ++t) total_weight += pattern[t % 4];
  std::vector<std::size_t> sizes(200);
  std::size_t used = 0;
  for (int t = 0; t < 200; ++t) {
    sizes[t] = std::max<std::size_t>(1, std::size_t(double(elements) * pattern[t % 4] / total_weight));
    used += sizes[t];
  }
  if (used < elements) sizes[0] += elements - used;
  return sizes;
}

void emit_result(const std::string& op, int world, int group, std::size_t bytes, std::size_t tensors, const Timing& t,
                 const ReduceBenchOptions& o, nlohmann::json extra = nlohmann::json::object()) {
  const double bus = group > 1 ? 2.0 * (group - 1) / group * double(bytes) / t.seconds / 1e9 : 0.0;
  nlohmann::json record = {{"bench", "reduce"},
                           {"op", op},
                           {"ranks", world},
                           {"group_ranks", group},
                           {"bytes", bytes},
                           {"tensors", tensors},
                           {"seconds", t.seconds},
                           {"busbw", bus},
                           {"raw_seconds", t.raw_seconds},
                           {"ratio_to_raw", t.seconds / t.raw_seconds},
                           {"bandwidth_ratio", t.raw_seconds / t.seconds},
                           {"min_seconds", t.min_seconds},
                           {"raw_min_seconds", t.raw_min_seconds},
                           {"min_ratio_to_raw", t.min_seconds / t.raw_min_seconds},
                           {"wire", o.wire},
                           {"fusion_bytes", o.fusion_bytes},
                           {"verify_layout", o.verify_layout}};
  for (auto it = extra.begin(); it != extra.end(); ++it) record[it.key()] = it.value();
  emit(record);
}

/// MPI calls carrying tensor data in one call of `call` on `reducer`.
long messages_of_one_call(comm::GradientReducer<Space, float>& reducer, const std::function<void()>& call) {
  const long before = reducer.statistics().data_messages;
  call();
  return reducer.statistics().data_messages - before;
}

void run_reduce(const ReduceBenchOptions& o) {
  for (const auto& op : o.ops)
    LATHER_REQUIRE(
        std::find(all_ops.begin(), all_ops.end(), op) != all_ops.end(), "--op: unknown operation '", op,
        "' (expected raw, mean, grouped_mean, adasum, adasum_approx, model200, model200_scattered or allgather)");
  std::vector<std::size_t> sizes;
  for (const auto& text : o.bytes) sizes.push_back(parse_bytes(text));
  // The raw baseline's buffer, the reduced tensor and its copy, the all-gather's output, the
  // 200-tensor model and its raw buffer, and the reducer's fusion buffers.
  const std::size_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  check_memory(std::int64_t(8 * largest + 2 * o.fusion_bytes), "the largest --bytes case",
               "8 buffers of its size and 2 fusion buffers");
  auto wants = [&](const std::string& op) { return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end(); };

  const comm::Group world(MPI_COMM_WORLD);
  const int n = world.size();
  const bool print = world.rank() == 0;
  comm::ReduceOptions options;
  options.fusion_bytes = o.fusion_bytes;
  options.wire_precision = comm::parse_wire_precision(o.wire);
  options.verify_layout = o.verify_layout;
  comm::ReduceOptions native = options;
  native.wire_precision = comm::WirePrecision::native;

  // Built once (each construction is collective): buffers grow with the sizes.
  comm::GradientReducer<Space, float> reducer(world, options);
  comm::GradientReducer<Space, float> adasum_reducer(world, native);
  std::unique_ptr<comm::Mesh> mesh;
  std::unique_ptr<comm::GradientReducer<Space, float>> grouped;
  if (wants("grouped_mean") && n % 2 == 0 && n >= 4) {
    mesh = std::make_unique<comm::Mesh>(world, 2);
    grouped = std::make_unique<comm::GradientReducer<Space, float>>(mesh->data_parallel(), options);
  } else if (wants("grouped_mean") && print) {
    emit({{"bench", "reduce"},
          {"op", "grouped_mean"},
          {"ranks", n},
          {"skipped",
           "grouped_mean needs an even rank count of at least 4 (a Mesh with 2 weight "
           "shards and at least 2 replicas)"}});
  }

  for (const std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    Kokkos::View<float*, Kokkos::HostSpace> raw_buffer("bench::raw", count);
    Kokkos::deep_copy(raw_buffer, 1.0f);
    // The baseline is MPI itself: the one raw MPI call of Lather's tree outside src/comm.
    auto raw_on = [&](const comm::Group& group, std::size_t elements) {
      const MPI_Comm comm = group.native();
      return [&raw_buffer, comm, elements] {
        MPI_Allreduce(MPI_IN_PLACE, raw_buffer.data(), int(elements), MPI_FLOAT, MPI_SUM, comm);
      };
    };
    const auto raw = raw_on(world, count);

    if (wants("raw")) {
      const auto t = time_against_raw(world, o, raw, raw);
      if (print) emit_result("raw", n, n, bytes, 1, t, o);
    }
    if (wants("mean")) {
      const auto tensors = make_tensors({count}, 1.0f);
      const auto t = time_against_raw(world, o, raw, [&] { reducer.mean(Space(), tensors); });
      if (print) emit_result("mean", n, n, bytes, 1, t, o);
    }
    if (grouped) {
      const int group = mesh->data_parallel().size();
      const auto tensors = make_tensors({count}, 1.0f);
      // The baseline runs on the same group: raw MPI_Allreduce over the data-parallel communicator.
      const auto t =
          time_against_raw(world, o, raw_on(mesh->data_parallel(), count), [&] { grouped->mean(Space(), tensors); });
      if (print) emit_result("grouped_mean", n, group, bytes, 1, t, o, {{"weight_shards", 2}});
    }
    if (wants("adasum")) {
      const auto tensors = make_tensors({count}, 1.0f);
      // Adasum of equal inputs returns them: the values stay put across repetitions.
      const auto t = time_against_raw(world, o, raw, [&] { adasum_reducer.adasum(Space(), tensors); });
      if (print) emit_result("adasum", n, n, bytes, 1, t, o, {{"wire", "native"}});
    }
    if (wants("adasum_approx")) {
      const auto tensors = make_tensors({count}, 1.0f);
      const auto t = time_against_raw(world, o, raw, [&] { reducer.adasum_approx(Space(), tensors); });
      if (print) emit_result("adasum_approx", n, n, bytes, 1, t, o);
    }
    if (wants("allgather")) {
      // The distributed Shampoo step's exchange: every rank contributes its share of `bytes` of
      // new parameter values (in place in the gathered buffer) and receives the others'.
      std::vector<std::size_t> counts(std::size_t(n), count / std::size_t(n));
      counts.back() += count % std::size_t(n);
      std::size_t offset = 0;
      for (int r = 0; r < world.rank(); ++r) offset += counts[std::size_t(r)];
      Kokkos::View<float*, Space::memory_space> gathered("bench::gathered", count);
      const Kokkos::View<const float*, Space::memory_space> mine =
          Kokkos::subview(gathered, std::make_pair(offset, offset + counts[std::size_t(world.rank())]));
      const auto t = time_against_raw(world, o, raw, [&] { world.allgatherv(Space(), mine, gathered, counts); });
      if (print) emit_result("allgather", n, n, bytes, 1, t, o);
    }
    for (const bool contiguous : {true, false}) {
      const std::string op = contiguous ? "model200" : "model200_scattered";
      if (!wants(op)) continue;
      const auto model = model_sizes(count);
      std::size_t total = 0;
      for (auto s : model) total += s;
      Kokkos::View<float*, Kokkos::HostSpace> model_raw("bench::model_raw", total);
      const auto raw_model = [&] {
        MPI_Allreduce(MPI_IN_PLACE, model_raw.data(), int(total), MPI_FLOAT, MPI_SUM, world.native());
      };
      // model200: the gradients of one buffer (a ParameterList), reduced in place; scattered: 200
      // separate allocations, packed into the fusion buffer and unpacked.
      const auto tensors = contiguous ? make_contiguous_tensors(model, 1.0f) : make_tensors(model, 1.0f);
      const auto fused = [&] { reducer.mean(Space(), tensors); };
      const long messages = messages_of_one_call(reducer, fused);
      const auto t = time_against_raw(world, o, raw_model, fused);
      // Without fusion: one MPI_Allreduce per tensor, in place. MPI may only be handed the tensors
      // themselves when it can read their memory (host memory, or a GPU-aware MPI); otherwise each
      // tensor goes through a host mirror, as an unfused application would have to.
      const bool mpi_reads_tensors = comm::mpi_reads_in_place<Space::memory_space>();
      std::vector<Tensors::value_type::HostMirror> staged;
      if (!mpi_reads_tensors)
        for (const auto& tensor : tensors) staged.push_back(Kokkos::create_mirror_view(tensor));
      const auto unfused = time_against_raw(world, o, raw_model, [&] {
        Kokkos::fence();
        for (std::size_t t = 0; t < tensors.size(); ++t) {
          const auto& tensor = tensors[t];
          if (mpi_reads_tensors) {
            MPI_Allreduce(MPI_IN_PLACE, tensor.data(), int(tensor.extent(0)), MPI_FLOAT, MPI_SUM, world.native());
          } else {
            Kokkos::deep_copy(staged[t], tensor);
            MPI_Allreduce(MPI_IN_PLACE, staged[t].data(), int(tensor.extent(0)), MPI_FLOAT, MPI_SUM, world.native());
            Kokkos::deep_copy(tensor, staged[t]);
          }
        }
      });
      if (print)
        emit_result(op, n, n, total * sizeof(float), model.size(), t, o,
                    {{"data_messages_per_call", messages},
                     {"unfused_seconds", unfused.seconds},
                     {"unfused_ratio_to_raw", unfused.seconds / unfused.raw_seconds}});
    }
  }
}

}  // namespace

void register_reduce(CLI::App& app) {
  auto options = std::make_shared<ReduceBenchOptions>();
  auto* sub =
      app.add_subcommand("reduce",
                         "Gradient reductions (mean, grouped mean over a 2-shard Mesh, Adasum, approximate Adasum, a "
                         "200-tensor model) beside a same-run raw MPI_Allreduce of the same bytes. Run under mpiexec.");
  add_list_option(*sub, "--op", options->ops,
                  "Operations: raw, mean, grouped_mean, adasum, adasum_approx, model200 (200 tensors in one buffer), "
                  "model200_scattered (200 separate allocations), allgather (the distributed Shampoo step's parameter "
                  "all-gather)");
  add_list_option(*sub, "--bytes", options->bytes, "Message sizes in bytes (suffixes K, M, G)");
  sub->add_option("--min-seconds", options->min_seconds, "Time spent per measurement (at least 3 calls)")
      ->capture_default_str();
  sub->add_option("--max-repeats", options->max_repeats, "Most calls per measurement")->capture_default_str();
  sub->add_option("--wire", options->wire, "Wire precision of mean/adasum_approx: native, bfloat16, float16")
      ->check(CLI::IsMember({"native", "bfloat16", "float16", "bf16", "fp16"}))
      ->capture_default_str();
  sub->add_option("--fusion-bytes", options->fusion_bytes, "ReduceOptions::fusion_bytes")->capture_default_str();
  sub->add_option("--verify-layout", options->verify_layout,
                  "ReduceOptions::verify_layout (one small agreement allreduce per call)")
      ->capture_default_str();
  sub->callback([options] { run_reduce(*options); });
}

}  // namespace lather::bench
