#pragma once
// MPI for the lifetime of a program whose main() owns it (lather-train, lather-bench, the test
// mains): MPI_Init at construction unless MPI is already initialised, MPI_Finalize at destruction
// unless this session did not initialise it or MPI is already finalised. Both calls are checked.
// Without MPI (LATHER_ENABLE_MPI=OFF) it does nothing.
//
//   int main(int argc, char** argv) {
//     lather::comm::MpiSession mpi(argc, argv);   // before any Group of MPI_COMM_WORLD
//     ...
//   }

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/core/config.hpp>  // LATHER_ENABLE_MPI

namespace lather::comm {

class MpiSession {
 public:
  /// Throws lather::Error carrying MPI_Error_string when MPI_Init fails.
  MpiSession(int& argc, char**& argv);
  /// A failing MPI_Finalize is reported on stderr (a destructor does not throw).
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool m_initialized_here = false;
};

}  // namespace lather::comm
