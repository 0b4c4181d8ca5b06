#pragma once
// Every rank learns whether any rank failed, and why: the message of the lowest failing rank is
// thrown everywhere, so a failure on one rank is an error on all of them, never a hang.

#include <mpi.h>

#include <string>

namespace lather::checkpoint::Impl {

/// `error` is empty on ranks that succeeded. Throws lather::Error on every rank if any failed.
void agree(MPI_Comm comm, const std::string& error);

/// `text` := root's `text` on every rank (collective).
void broadcast(MPI_Comm comm, int root, std::string& text);

/// Runs `work` and agrees on its outcome: an exception on any rank becomes one on every rank.
template <class Work>
void agreed(MPI_Comm comm, Work&& work) {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  agree(comm, error);
}

}  // namespace lather::checkpoint::Impl
