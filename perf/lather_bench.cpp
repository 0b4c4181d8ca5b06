// lather-bench <subcommand>: the benchmarks of every capability behind one executable.
#include "bench_common.hpp"

#include <lather/comm/blas_threads.hpp>
#include <lather/comm/mpi_session.hpp>
#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/host_blas_kernels.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) try {
  // Before MPI, Kokkos or the BLAS's threads start: may start the program again with the BLAS
  // kernels this CPU runs fastest (core/host_blas_kernels.hpp); the records name the kernels.
  const std::string blas_note = lather::choose_host_blas_kernels(argv);
  const lather::comm::MpiSession mpi(argc, argv);  // nothing without MPI
  int code = 0;
  {
    // Kokkos takes its own --kokkos-* arguments out of argv before CLI11 sees the rest.
    lather::KokkosSession kokkos(argc, argv);
    // Each rank's share of the node for the BLAS, as lather-train gives it (blas_threads.hpp).
    lather::comm::fit_host_blas_threads(lather::bench::world_group());
    CLI::App app{
        "lather-bench: Lather's benchmarks. Each subcommand prints one JSON object per "
        "line with a baseline measured in the same run and the ratio to it."};
    app.require_subcommand(1);
    lather::bench::register_root(app);
    lather::bench::register_step(app);
    lather::bench::register_balance(app);
#if LATHER_ENABLE_HDF5
    lather::bench::register_checkpoint(app);
#endif
#if defined(LATHER_BENCH_TTA)
    lather::bench::register_tta(app);
    lather::bench::register_pipeline(app);
    lather::bench::register_plan(app);
#endif
#if LATHER_ENABLE_MPI
    lather::bench::register_reduce(app);
    lather::bench::register_overlap(app);
#endif
    const bool root = lather::bench::world_group().rank() == 0;
    if (root && !blas_note.empty()) std::fprintf(stderr, "lather-bench: %s\n", blas_note.c_str());
    // Every error is one line on stderr and exit status 2, as lather-train's.
    try {
      app.parse(argc, argv);  // the chosen subcommand runs in its callback
    } catch (const CLI::CallForHelp& e) {
      if (root) app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      if (root) app.exit(e);
    } catch (const CLI::ParseError& e) {
      if (root) std::fprintf(stderr, "lather-bench: %s (see --help)\n", e.what());
      code = 2;
    } catch (const lather::Error& e) {
      if (root) std::fprintf(stderr, "lather-bench: %s\n", e.message().c_str());
      code = 2;
    } catch (const std::exception& e) {
      // What the libraries throw (Kokkos's allocation failures are std::runtime_error with a
      // paragraph): its first line.
      const std::string what = e.what();
      std::fprintf(stderr, "lather-bench: %s\n", what.substr(0, what.find('\n')).c_str());
      code = 2;
    }
  }
  return code;
} catch (const lather::Error& e) {
  // MPI itself failed to start or to end.
  std::fprintf(stderr, "lather-bench: %s\n", e.message().c_str());
  return 2;
}
