#pragma once
// The check every MPI call of Lather goes through (MPI builds only): a result other than
// MPI_SUCCESS becomes a lather::Error naming the call and carrying MPI_Error_string. The
// communicators Lather creates return errors (MPI_ERRORS_RETURN) instead of aborting, so this is
// where they surface.

#include <lather/core/error.hpp>

#include <mpi.h>

#include <string>

namespace lather::comm::Impl {

inline void check_mpi(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(status, text, &length);
  LATHER_FAIL(call, " failed: ", std::string(text, std::size_t(length)));
}

}  // namespace lather::comm::Impl
