#include <lather/comm/mpi_session.hpp>

#if LATHER_ENABLE_MPI
#include "mpi_check.hpp"

#include <lather/core/error.hpp>

#include <cstdio>
#endif

namespace lather::comm {

#if LATHER_ENABLE_MPI
MpiSession::MpiSession(int& argc, char**& argv) {
  int initialized = 0;
  Impl::check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) return;
  Impl::check_mpi(MPI_Init(&argc, &argv), "MPI_Init");
  m_initialized_here = true;
}

MpiSession::~MpiSession() {
  if (!m_initialized_here) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  try {
    Impl::check_mpi(MPI_Finalize(), "MPI_Finalize");
  } catch (const Error& e) {
    std::fprintf(stderr, "lather: %s\n", e.message().c_str());
  }
}
#else
MpiSession::MpiSession(int&, char**&) {}
MpiSession::~MpiSession() = default;
#endif

}  // namespace lather::comm
