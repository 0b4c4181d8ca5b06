#include <lather/comm/impl/support.hpp>
#include <lather/comm/replicas.hpp>
#include <lather/core/fault_injection.hpp>

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <map>

namespace lather::comm {

std::uint64_t agree_seed(const Group& group, std::uint64_t seed, int root) {
  // Every rank checks the root against the same size: the same error everywhere, or none.
  const int size = group.size();
  LATHER_REQUIRE(root >= 0 && root < size, "agree_seed: root ", root, " is not a rank of the group of ", size);
  group.broadcast(&seed, 1, root);
  return seed;
}

std::uint64_t agree_seed(const Mesh& mesh, std::uint64_t seed) { return agree_seed(mesh.data_parallel(), seed, 0); }

namespace {

std::uint32_t crc_bytes(std::uint32_t crc, const unsigned char* bytes, std::size_t length) {
  // zlib's crc32 takes a 32-bit length: feed large tensors in pieces.
  constexpr std::size_t piece = std::size_t(1) << 30;
  for (std::size_t done = 0; done < length; done += piece)
    crc = std::uint32_t(::crc32(crc, bytes + done, uInt(std::min(piece, length - done))));
  return crc;
}

template <class ExecutionSpace, class Scalar>
std::vector<std::uint32_t> tensor_checksums(const ExecutionSpace& space,
                                            const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors,
                                            std::uint32_t& whole) {
  std::vector<std::uint32_t> out;
  whole = std::uint32_t(::crc32(0L, Z_NULL, 0));
  for (const auto& tensor : tensors) {
    auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), tensor);
    Kokkos::deep_copy(space, host, tensor);
    Impl::fence(space, "Lather::comm::checksum: tensor on the host");
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
    const std::size_t length = host.extent(0) * sizeof(Scalar);
    out.push_back(crc_bytes(std::uint32_t(::crc32(0L, Z_NULL, 0)), bytes, length));
    whole = crc_bytes(whole, bytes, length);
  }
  return out;
}

std::string hex(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

std::string join(const std::vector<int>& values, std::size_t limit = 16) {
  std::string out;
  for (std::size_t i = 0; i < values.size() && i < limit; ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  if (values.size() > limit) out += ", ... (" + std::to_string(values.size()) + " in all)";
  return out;
}

}  // namespace

template <class ExecutionSpace, class Scalar>
std::uint32_t checksum(const ExecutionSpace& space,
                       const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors) {
  std::uint32_t whole = 0;
  tensor_checksums(space, tensors, whole);
  return whole;
}

std::string ReplicaReport::describe() const {
  if (consistent())
    return lather::Impl::concat("replicas consistent (", group_size, " ranks, crc32 ",
                                hex(checksums.empty() ? 0 : checksums[reference_rank]), ")");
  std::string out =
      lather::Impl::concat("replicas diverge: world ranks ", join(divergent_world_ranks),
                           " differ from the state held by the majority (crc32 ", hex(checksums[reference_rank]),
                           ", world rank ", world_ranks[reference_rank], ", ", tensor_counts[reference_rank],
                           " tensors, ", element_counts[reference_rank], " elements)");
  for (std::size_t i = 0; i < divergent_group_ranks.size() && i < 8; ++i) {
    const int r = divergent_group_ranks[i];
    out += lather::Impl::concat("; world rank ", world_ranks[r], ": crc32 ", hex(checksums[r]));
    if (tensor_counts[r] != tensor_counts[reference_rank] || element_counts[r] != element_counts[reference_rank])
      out += lather::Impl::concat(", ", tensor_counts[r], " tensors, ", element_counts[r], " elements");
  }
  if (!divergent_tensors.empty()) out += "; tensors that differ: " + join(divergent_tensors);
  return out;
}

template <class ExecutionSpace, class Scalar>
ReplicaReport check_replicas(const ExecutionSpace& space, const Group& group,
                             const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors,
                             const Group* world) {
  Impl::ScopedRegion region("Lather::comm::check_replicas");
  ReplicaReport report;
  const int size = group.size();
  report.group_size = size;
  report.world_ranks = group.ranks_in(world ? *world : group);

  // This rank's checksums; a failure here travels in the all-gather below (a fifth word), so that
  // every rank learns it and throws it instead of waiting for the rank that failed.
  std::uint32_t whole = 0;
  std::vector<std::uint32_t> per_tensor;
  const std::string local_error =
      ::lather::Impl::local_failure("replicas.check", [&] { per_tensor = tensor_checksums(space, tensors, whole); });
  Impl::Fnv1a size_hash;
  size_hash.add(tensors.size());
  std::int64_t elements = 0;
  for (const auto& tensor : tensors) {
    size_hash.add(tensor.extent(0));
    elements += std::int64_t(tensor.extent(0));
  }
  constexpr std::size_t words = 5;
  const std::uint64_t mine[words] = {std::uint64_t(tensors.size()), std::uint64_t(elements), size_hash.value(), whole,
                                     local_error.empty() ? 0u : 1u};
  std::vector<std::uint64_t> all(words * std::size_t(size));
  group.allgather(mine, words, all.data());
  bool any_failed = false;
  for (int r = 0; r < size; ++r) any_failed = any_failed || all[words * std::size_t(r) + 4] != 0;
  // Every rank knows that one failed: one more agreement carries its message to all (and throws).
  if (any_failed) group.agree_on_failure("check_replicas", local_error);

  // The reference is the (layout, checksum) most ranks hold; ties go to the lowest rank.
  std::map<std::vector<std::uint64_t>, int> votes;
  for (int r = 0; r < size; ++r)
    ++votes[std::vector<std::uint64_t>(all.begin() + words * r, all.begin() + words * r + 4)];
  int best = -1;
  for (int r = 0; r < size; ++r) {
    const int count = votes[std::vector<std::uint64_t>(all.begin() + words * r, all.begin() + words * r + 4)];
    if (best < 0 ||
        count > votes[std::vector<std::uint64_t>(all.begin() + words * best, all.begin() + words * best + 4)])
      best = r;
  }
  report.reference_rank = best;
  bool same_layouts = true;
  for (int r = 0; r < size; ++r) {
    report.tensor_counts.push_back(std::int64_t(all[words * r]));
    report.element_counts.push_back(std::int64_t(all[words * r + 1]));
    report.checksums.push_back(std::uint32_t(all[words * r + 3]));
    const bool same_layout = all[words * r] == all[words * best] && all[words * r + 2] == all[words * best + 2];
    same_layouts = same_layouts && same_layout;
    if (!same_layout || all[words * r + 3] != all[words * best + 3]) {
      report.divergent_group_ranks.push_back(r);
      report.divergent_world_ranks.push_back(report.world_ranks[r]);
    }
  }
  if (!report.consistent() && same_layouts && !tensors.empty()) {
    // Every rank knows the layouts agree and something differs: name the tensors.
    std::vector<std::uint32_t> every(per_tensor.size() * std::size_t(size));
    group.allgather(per_tensor.data(), per_tensor.size(), every.data());
    for (std::size_t t = 0; t < per_tensor.size(); ++t)
      for (int r = 0; r < size; ++r)
        if (every[r * per_tensor.size() + t] != every[best * per_tensor.size() + t]) {
          report.divergent_tensors.push_back(int(t));
          break;
        }
  }
  return report;
}

template <class ExecutionSpace, class Scalar>
void require_consistent_replicas(const ExecutionSpace& space, const Group& group,
                                 const TensorList<Scalar, typename ExecutionSpace::memory_space>& tensors,
                                 const Group* world) {
  const auto report = check_replicas(space, group, tensors, world);
  LATHER_REQUIRE(report.consistent(), report.describe());
}

#define LATHER_COMM_REPLICAS_INSTANTIATE(SPACE, SCALAR)                                                               \
  template std::uint32_t checksum<SPACE, SCALAR>(const SPACE&, const TensorList<SCALAR, SPACE::memory_space>&);       \
  template ReplicaReport check_replicas<SPACE, SCALAR>(const SPACE&, const Group&,                                    \
                                                       const TensorList<SCALAR, SPACE::memory_space>&, const Group*); \
  template void require_consistent_replicas<SPACE, SCALAR>(                                                           \
      const SPACE&, const Group&, const TensorList<SCALAR, SPACE::memory_space>&, const Group*);

LATHER_COMM_REPLICAS_INSTANTIATE(DefaultExecutionSpace, float)
LATHER_COMM_REPLICAS_INSTANTIATE(DefaultExecutionSpace, double)
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL) || \
    defined(KOKKOS_ENABLE_OPENMPTARGET)
LATHER_COMM_REPLICAS_INSTANTIATE(DefaultHostExecutionSpace, float)
LATHER_COMM_REPLICAS_INSTANTIATE(DefaultHostExecutionSpace, double)
#endif

}  // namespace lather::comm
