#include "nccl_communicator.hpp"

#include "mpi_check.hpp"

#include <lather/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace lather::comm::Impl {

std::string nccl_failure(ncclResult_t status, const char* call) {
  if (status == ncclSuccess) return {};
  std::string out = ::lather::Impl::concat(call, " failed: ", ncclGetErrorString(status));
  const char* last = ncclGetLastError(nullptr);  // its argument is unused
  if (last && *last) out += ::lather::Impl::concat(" (", last, ")");
  return out;
}

namespace {

// The communicators alive, destroyed at MPI_Finalize where their groups outlive MPI (a Group held
// past MpiSession's end): MPI_Finalize runs MPI_COMM_SELF's attribute delete callbacks first, on
// every rank, while MPI and the CUDA runtime still work.
std::mutex live_mutex;
std::vector<NcclCommunicator*> live;
int finalize_keyval = MPI_KEYVAL_INVALID;

int release_at_finalize(MPI_Comm, int, void*, void*) {
  std::vector<NcclCommunicator*> alive;
  {
    const std::lock_guard<std::mutex> lock(live_mutex);
    alive.swap(live);
  }
  for (auto* communicator : alive) communicator->release();
  return MPI_SUCCESS;
}

void track(NcclCommunicator* communicator) {
  const std::lock_guard<std::mutex> lock(live_mutex);
  if (finalize_keyval == MPI_KEYVAL_INVALID) {
    check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &release_at_finalize, &finalize_keyval, nullptr),
              "MPI_Comm_create_keyval");
    check_mpi(MPI_Comm_set_attr(MPI_COMM_SELF, finalize_keyval, nullptr), "MPI_Comm_set_attr");
  }
  live.push_back(communicator);
}

void untrack(NcclCommunicator* communicator) {
  const std::lock_guard<std::mutex> lock(live_mutex);
  live.erase(std::remove(live.begin(), live.end(), communicator), live.end());
}

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device) : m_comm(comm), m_device(device) { track(this); }

NcclCommunicator::~NcclCommunicator() {
  untrack(this);
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After MPI_Finalize, release_at_finalize has destroyed it already (or the process is exiting).
  if (!finalized) release();
}

void NcclCommunicator::release() noexcept {
  if (!m_comm) return;
  ncclCommDestroy(m_comm);  // nothing to report from a destructor or an MPI callback
  m_comm = nullptr;
}

void NcclCommunicator::fail(const std::string& why) {
  if (m_broken.empty()) m_broken = why;
  if (m_comm) {
    ncclCommAbort(m_comm);
    m_comm = nullptr;
  }
}

std::string NcclCommunicator::async_error() {
  if (!m_broken.empty() || !m_comm) return m_broken;
  ncclResult_t status = ncclSuccess;
  const ncclResult_t asked = ncclCommGetAsyncError(m_comm, &status);
  if (asked != ncclSuccess) status = asked;
  if (status == ncclSuccess || status == ncclInProgress) return {};
  fail(nccl_failure(status, "NCCL (asynchronous error)"));
  return m_broken;
}

}  // namespace lather::comm::Impl
