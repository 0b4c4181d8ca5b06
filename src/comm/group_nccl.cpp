// Group's collectives of CUDA memory through NCCL (comm/device_collectives.hpp). In a build
// without NCCL the header's View overloads and Transport never call these; they throw.
#include "group_state.hpp"

#if LATHER_ENABLE_NCCL
#include "nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>
#endif

namespace lather::comm {

#if LATHER_ENABLE_NCCL

namespace {

ncclDataType_t nccl_datatype(Impl::NcclType type) {
  switch (type) {
    case Impl::NcclType::int8:
      return ncclInt8;
    case Impl::NcclType::uint8:
      return ncclUint8;
    case Impl::NcclType::int32:
      return ncclInt32;
    case Impl::NcclType::uint32:
      return ncclUint32;
    case Impl::NcclType::int64:
      return ncclInt64;
    case Impl::NcclType::uint64:
      return ncclUint64;
    case Impl::NcclType::float32:
      return ncclFloat32;
    case Impl::NcclType::float64:
      return ncclFloat64;
    case Impl::NcclType::none:
      break;
  }
  LATHER_FAIL("Group: an element type NCCL does not reduce went to NCCL");
}

ncclRedOp_t nccl_operation(Combine op) {
  switch (op) {
    case Combine::sum:
      return ncclSum;
    case Combine::min:
      return ncclMin;
    case Combine::max:
      return ncclMax;
  }
  LATHER_FAIL("Group: operation ", int(op), " has no NCCL counterpart");
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

/// Makes `device` current for its scope: NCCL builds a communicator on the current device, which
/// Kokkos set for its default instance, not necessarily for the caller's.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    cudaError_t status = cudaGetDevice(&m_previous);
    if (status == cudaSuccess && m_previous != device) status = cudaSetDevice(device);
    if (status != cudaSuccess)
      m_error = ::lather::Impl::concat("cudaSetDevice(", device, ") failed: ", cudaGetErrorString(status));
  }
  ~CurrentDevice() {
    int now = -1;
    if (m_previous >= 0 && cudaGetDevice(&now) == cudaSuccess && now != m_previous) cudaSetDevice(m_previous);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  const std::string& error() const { return m_error; }

 private:
  int m_previous = -1;
  std::string m_error;
};

/// Whether this rank shares its CUDA device with another rank of the group, which NCCL refuses
/// ("Duplicate GPU detected"): `shared` names the device and the other rank, `error` says why the
/// device could not be named. Collective over `comm` (rank `rank`); both empty where the device is
/// this rank's alone. A device is named by its PCI bus id, as device numbers depend on each
/// process's CUDA_VISIBLE_DEVICES; the ranks that can share one are those of one node.
struct DeviceSharing {
  std::string error, shared;
};

DeviceSharing shared_device(MPI_Comm comm, int rank, int device) {
  constexpr int id_bytes = 32;
  char mine[id_bytes] = {};
  DeviceSharing out;
  const cudaError_t status = cudaDeviceGetPCIBusId(mine, id_bytes, device);
  if (status != cudaSuccess)
    out.error = ::lather::Impl::concat("cudaDeviceGetPCIBusId(", device, ") failed: ", cudaGetErrorString(status));
  MPI_Comm node = MPI_COMM_NULL;
  Impl::check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int node_size = 1, node_rank = 0;
  int result = MPI_Comm_size(node, &node_size);
  if (result == MPI_SUCCESS) result = MPI_Comm_rank(node, &node_rank);
  std::vector<char> ids(std::size_t(std::max(node_size, 1)) * id_bytes);
  std::vector<int> ranks(std::size_t(std::max(node_size, 1)));
  if (result == MPI_SUCCESS) result = MPI_Allgather(mine, id_bytes, MPI_CHAR, ids.data(), id_bytes, MPI_CHAR, node);
  if (result == MPI_SUCCESS) result = MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  Impl::check_mpi(result, "MPI_Allgather (the CUDA devices of the node's ranks)");
  if (!out.error.empty()) return out;
  for (int other = 0; other < node_size; ++other) {
    if (other == node_rank || std::strncmp(mine, ids.data() + std::size_t(other) * id_bytes, id_bytes) != 0) continue;
    out.shared = ::lather::Impl::concat("group rank ", rank, " shares CUDA device ", mine, " with group rank ",
                                        ranks[std::size_t(other)], "; NCCL takes one device per rank");
    break;
  }
  return out;
}

/// Collective over `group`: its NCCL communicator, on CUDA device `device`. Every failure is agreed
/// over MPI first: the same lather::Error on every rank, and no rank left in NCCL's set-up waiting
/// for one that never comes.
std::shared_ptr<Impl::NcclCommunicator> make_communicator(const Group& group, int device, const std::string& context) {
  const CurrentDevice current(device);
  // Rank 0's unique id, or why there is none, reaches every rank before any rank enters NCCL.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::string error = current.error();
  if (group.rank() == 0 && error.empty()) error = Impl::nccl_failure(ncclGetUniqueId(&id), "ncclGetUniqueId");
  group.agree_on_failure(context, error);
  group.broadcast(reinterpret_cast<char*>(&id), sizeof(id), 0);
  // Some MPI libraries complete a broadcast only inside a later MPI call (HCOLL's, as cuDecomp
  // found), and ncclCommInitRank makes none: without the barrier a rank could wait in NCCL for one
  // still inside MPI_Bcast.
  group.barrier();
  ncclComm_t comm = nullptr;
  error = Impl::nccl_failure(ncclCommInitRank(&comm, group.size(), id, group.rank()), "ncclCommInitRank");
  std::shared_ptr<Impl::NcclCommunicator> made;
  if (error.empty()) {
    try {
      made = std::make_shared<Impl::NcclCommunicator>(comm, device);
    } catch (const std::exception& e) {
      error = e.what();
      ncclCommAbort(comm);
    }
  }
  try {
    group.agree_on_failure(context, error);
  } catch (...) {
    if (made) made->fail("the group failed to make its NCCL communicator");  // aborted: nothing to keep
    throw;
  }
  return made;
}

/// The group's communicator for a transfer: there, and not failed.
Impl::NcclCommunicator& communicator(const std::shared_ptr<Impl::NcclCommunicator>& nccl, const char* call) {
  LATHER_REQUIRE(nccl, "Group: ", call, " on a group whose ranks have not agreed on NCCL (no communicator)");
  LATHER_REQUIRE(nccl->broken().empty(), "Group: ", call,
                 ": the group's NCCL communicator failed earlier: ", nccl->broken());
  return *nccl;
}

/// After enqueueing: a failing call breaks the communicator (the other ranks' halves of the
/// transfer can no longer complete) and throws, here.
void enqueued(Impl::NcclCommunicator& nccl, ncclResult_t status, const char* call) {
  if (status == ncclSuccess) return;
  const std::string why = Impl::nccl_failure(status, call);
  nccl.fail(why);
  LATHER_FAIL(why);
}

/// Enqueues `calls` between ncclGroupStart and ncclGroupEnd; the group is closed whatever fails.
template <class Calls>
void in_nccl_group(Impl::NcclCommunicator& nccl, const char* call, Calls&& calls) {
  ncclResult_t status = ncclGroupStart();
  if (status == ncclSuccess) {
    status = calls();
    const ncclResult_t ended = ncclGroupEnd();
    if (status == ncclSuccess) status = ended;
  }
  enqueued(nccl, status, call);
}

}  // namespace

bool Group::agree_on_nccl(const Impl::NcclChoice& choice, const std::string& context,
                          const std::vector<std::pair<std::string, std::int64_t>>& fields,
                          const std::string& local_error) const {
  const auto& st = state();
  if (st.local) return false;  // one process without a communicator: nothing moves
  std::string error = local_error;
  if (error.empty() && choice.wanted && st.nccl) {
    const std::string failed = st.nccl->async_error();
    if (!failed.empty())
      error = "the group's NCCL communicator failed earlier: " + failed;
    else if (st.nccl->device() != choice.device)
      error = ::lather::Impl::concat("the group's NCCL communicator is on CUDA device ", st.nccl->device(),
                                     ", this call's execution space on device ", choice.device);
  }
  // The agreement (as comm/agreement.hpp's, which sits above Group): one MPI_Allreduce of the
  // minimum of [lowest failing rank, the fields, their complements], so every rank learns each
  // field's minimum and maximum (~ reverses the order and, unlike minus, never overflows).
  std::vector<std::pair<std::string, std::int64_t>> agreed = {
      {"the path of CUDA memory (0: MPI, 1: NCCL where it serves the group, 2: NCCL by name; "
       "LATHER_DEVICE_COLLECTIVES or set_device_collectives)",
       choice.wanted ? (choice.required ? 2 : 1) : 0}};
  agreed.insert(agreed.end(), fields.begin(), fields.end());
  const std::size_t n = agreed.size();
  std::vector<std::int64_t> record(1 + 2 * n);
  record[0] = error.empty() ? std::int64_t(st.size) : std::int64_t(st.rank);
  for (std::size_t f = 0; f < n; ++f) {
    record[1 + f] = agreed[f].second;
    record[1 + n + f] = ~agreed[f].second;
  }
  allreduce(record.data(), record.size(), Combine::min);
  if (record[0] < st.size) {
    const int failing = int(record[0]);
    std::string message = error;
    broadcast(message, failing);
    LATHER_FAIL(context, ": ", message, " (on group rank ", failing, " of ", st.size,
                failing == st.rank ? ", this rank" : "", ")");
  }
  for (std::size_t f = 0; f < n; ++f)
    LATHER_REQUIRE(record[1 + f] == ~record[1 + n + f], context, ": ", agreed[f].first, " differs across the ", st.size,
                   " ranks of the group: min ", record[1 + f], ", max ", ~record[1 + n + f],
                   " (this rank: ", agreed[f].second, ")");
  if (!choice.wanted) return false;
  if (st.nccl) return true;
  // The first collective through NCCL: every rank is here, having agreed.
  if (st.nccl_unusable.empty()) {
    const DeviceSharing sharing = shared_device(st.comm, st.rank, choice.device);
    agree_on_failure(context, sharing.error);
    try {
      agree_on_failure(context, sharing.shared);
    } catch (const Error& e) {
      st.nccl_unusable = e.message();
    }
  }
  if (!st.nccl_unusable.empty()) {
    LATHER_REQUIRE(!choice.required,
                   "NCCL cannot serve this group (LATHER_DEVICE_COLLECTIVES=nccl): ", st.nccl_unusable);
    return false;
  }
  st.nccl = make_communicator(*this, choice.device, context);
  return true;
}

void Group::nccl_allreduce(const void* send, void* receive, std::size_t count, Impl::NcclType type, Combine op,
                           void* stream) const {
  auto& nccl = communicator(state().nccl, "ncclAllReduce");
  enqueued(nccl,
           ncclAllReduce(send, receive, count, nccl_datatype(type), nccl_operation(op), nccl.get(), as_stream(stream)),
           "ncclAllReduce");
}

void Group::nccl_allgatherv(const void* send, void* receive, const std::vector<std::size_t>& counts,
                            std::size_t element_bytes, void* stream) const {
  const auto& st = state();
  LATHER_REQUIRE(int(counts.size()) == st.size, "Group::allgatherv: ", counts.size(), " counts for a group of ",
                 st.size);
  auto& nccl = communicator(st.nccl, "ncclAllGather");
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; });
  if (equal) {
    if (counts[0] == 0) return;
    enqueued(nccl, ncclAllGather(send, receive, counts[0] * element_bytes, ncclUint8, nccl.get(), as_stream(stream)),
             "ncclAllGather");
    return;
  }
  // Uneven counts (NCCL has no all-gather of them): each rank's part broadcast into its place.
  auto* bytes = static_cast<char*>(receive);
  in_nccl_group(nccl, "ncclBroadcast (allgatherv)", [&] {
    std::size_t at = 0;
    for (int root = 0; root < st.size; ++root) {
      const std::size_t part = counts[std::size_t(root)] * element_bytes;
      if (part > 0) {
        const void* from = root == st.rank ? send : bytes + at;  // read on the root only
        const ncclResult_t status =
            ncclBroadcast(from, bytes + at, part, ncclUint8, root, nccl.get(), as_stream(stream));
        if (status != ncclSuccess) return status;
      }
      at += part;
    }
    return ncclSuccess;
  });
}

void Group::nccl_exchange(const void* out, std::size_t out_bytes, void* in, std::size_t in_bytes, int partner,
                          void* stream) const {
  const auto& st = state();
  LATHER_REQUIRE(partner >= 0 && partner < st.size && partner != st.rank, "Group::exchange: rank ", partner,
                 " is not another rank of the group of ", st.size);
  auto& nccl = communicator(st.nccl, "ncclSend/ncclRecv");
  // The partner makes the mirror call, so a side left out here is left out there too.
  in_nccl_group(nccl, "ncclSend/ncclRecv (exchange)", [&] {
    ncclResult_t status = ncclSuccess;
    if (out_bytes > 0) status = ncclSend(out, out_bytes, ncclUint8, partner, nccl.get(), as_stream(stream));
    if (status == ncclSuccess && in_bytes > 0)
      status = ncclRecv(in, in_bytes, ncclUint8, partner, nccl.get(), as_stream(stream));
    return status;
  });
}

void Group::nccl_wait(void* stream, const std::string& context) const {
  auto& nccl = communicator(state().nccl, "the wait for NCCL");
  for (;;) {
    const cudaError_t status = cudaStreamQuery(as_stream(stream));
    if (status == cudaSuccess) return;
    LATHER_REQUIRE(status == cudaErrorNotReady, context, ": cudaStreamQuery failed: ", cudaGetErrorString(status));
    const std::string failed = nccl.async_error();
    LATHER_REQUIRE(failed.empty(), context, ": ", failed);
    std::this_thread::yield();
  }
}

#else

bool Group::agree_on_nccl(const Impl::NcclChoice&, const std::string& context,
                          const std::vector<std::pair<std::string, std::int64_t>>&, const std::string&) const {
  LATHER_FAIL(context, ": this build of Lather has no NCCL (LATHER_ENABLE_NCCL=OFF)");
}

void Group::nccl_allreduce(const void*, void*, std::size_t, Impl::NcclType, Combine, void*) const {
  LATHER_FAIL("Group::nccl_allreduce: this build of Lather has no NCCL (LATHER_ENABLE_NCCL=OFF)");
}

void Group::nccl_allgatherv(const void*, void*, const std::vector<std::size_t>&, std::size_t, void*) const {
  LATHER_FAIL("Group::nccl_allgatherv: this build of Lather has no NCCL (LATHER_ENABLE_NCCL=OFF)");
}

void Group::nccl_exchange(const void*, std::size_t, void*, std::size_t, int, void*) const {
  LATHER_FAIL("Group::nccl_exchange: this build of Lather has no NCCL (LATHER_ENABLE_NCCL=OFF)");
}

void Group::nccl_wait(void*, const std::string& context) const {
  LATHER_FAIL(context, ": this build of Lather has no NCCL (LATHER_ENABLE_NCCL=OFF)");
}

#endif

}  // namespace lather::comm
