#pragma once
// A group's NCCL communicator (NCCL builds only; comm/device_collectives.hpp), as a Group holds it.
// Group makes it (src/comm/group_nccl.cpp, collectively: rank 0's ncclGetUniqueId, MPI_Bcast,
// ncclCommInitRank on every rank) and hands it over here. Destroyed with the group's state, or at
// MPI_Finalize for those still alive then (an MPI_COMM_SELF attribute's delete callback, which
// MPI_Finalize runs first on every rank): ncclCommDestroy synchronises with the node's other ranks
// in recent NCCL, so it must run where every rank runs it, as MPI_Comm_free, and never after the
// CUDA runtime has been torn down at exit.
//
// Every NCCL call is checked: a failing one becomes a lather::Error naming the call, with
// ncclGetErrorString and NCCL's last message.

#include <nccl.h>

#include <string>

namespace lather::comm::Impl {

/// "<call> failed: <ncclGetErrorString> (<ncclGetLastError>)"; empty for ncclSuccess.
std::string nccl_failure(ncclResult_t status, const char* call);

class NcclCommunicator {
 public:
  /// Owns `comm`, made on CUDA device `device`.
  NcclCommunicator(ncclComm_t comm, int device);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ncclComm_t get() const { return m_comm; }
  int device() const { return m_device; }
  /// Empty while the communicator works; else why it does not (an asynchronous NCCL error, a call
  /// that failed), after which it is aborted and every transfer on it refused.
  const std::string& broken() const { return m_broken; }
  /// Records `why` (the first reason stays) and aborts the communicator (ncclCommAbort).
  void fail(const std::string& why);
  /// broken(), after asking NCCL for an asynchronous error (ncclCommGetAsyncError), which fails it.
  std::string async_error();
  /// ncclCommDestroy, once (nothing after fail()). MPI_Finalize calls it for every live one.
  void release() noexcept;

 private:
  ncclComm_t m_comm = nullptr;
  int m_device = -1;
  std::string m_broken;
};

}  // namespace lather::comm::Impl
