// lather-train: trains an MLP on Fashion-MNIST, or a character-level transformer on a text
// (--model transformer), with Shampoo (or Adam, AdamW, AdaGrad, SGD), data parallel over MPI ranks,
// optionally with weight shards; see `lather-train --help` and docs/reference/driver.md.
#include "command_line.hpp"
#include "trainer.hpp"

#include <lather/comm/blas_threads.hpp>
#include <lather/comm/group.hpp>
#include <lather/comm/mpi_session.hpp>
#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/host_blas_kernels.hpp>
#include <lather/core/kokkos_compat.hpp>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <mpi.h>  // MPI_COMM_WORLD

#include <cstdio>
#include <string>

int main(int argc, char** argv) try {
  // Before MPI, Kokkos or the BLAS's threads start: may start the program again with the BLAS
  // kernels this CPU runs fastest (core/host_blas_kernels.hpp).
  const std::string blas_note = lather::choose_host_blas_kernels(argv);
  // The help shows the defaults of the model named on the command line (read before Kokkos
  // takes its arguments out of argv).
  const auto help_model = lather::train::model_in_arguments(argc, argv);
  const lather::comm::MpiSession mpi(argc, argv);
  int code = 0;
  {
    const lather::comm::Group world(MPI_COMM_WORLD);
    const int rank = world.rank();
    if (rank == 0 && !blas_note.empty()) std::fprintf(stderr, "lather-train: %s\n", blas_note.c_str());
    // Each rank's share of the node's CPUs for the BLAS, unless the environment says otherwise.
    lather::comm::fit_host_blas_threads(world);
    // Kokkos takes its --kokkos-* arguments out of argv before CLI11 reads the rest.
    lather::KokkosSession kokkos(argc, argv);
    CLI::App app{"lather-train " LATHER_VERSION_STRING
                 ": train a multilayer perceptron on Fashion-MNIST, or a character-level transformer on a text "
                 "(--model transformer), with Lather's optimizers, data parallel over MPI ranks and tensor parallel "
                 "over --weight-shards. Run under mpiexec or srun; Kokkos options (--kokkos-num-threads, ...) are "
                 "accepted too."};
    lather::train::TrainOptions options;
    lather::train::add_options(app, options, help_model);
    try {
      lather::train::check_config_files(argc, argv);
      app.parse(argc, argv);
      lather::train::apply_model_defaults(app, options);
      lather::train::install_termination_handler();
      const auto result = lather::train::train(options, world);
      if (rank == 0 && !options.quiet)
        std::printf("done: %ld steps in %.1f s, test accuracy %.2f%%%s\n", result.steps, result.seconds,
                    100 * result.test_accuracy, result.interrupted ? " (interrupted)" : "");
      // Stopped by SIGTERM with its checkpoint written: a job script can tell it from the end.
      if (result.interrupted) code = lather::train::interrupted_exit_code;
    } catch (const CLI::CallForHelp& e) {
      if (rank == 0) app.exit(e);
    } catch (const CLI::CallForVersion& e) {
      if (rank == 0) app.exit(e);
    } catch (const CLI::ConfigError& e) {
      // CLI11 says "INI was not able to parse KEY" for a key that names no option.
      const std::string what = e.what(), prefix = "INI was not able to parse ";
      if (rank == 0) {
        if (what.rfind(prefix, 0) == 0)
          std::fprintf(stderr,
                       "lather-train: --config: unknown key '%s' (keys are the long option names, see --help)\n",
                       what.substr(prefix.size()).c_str());
        else
          std::fprintf(stderr, "lather-train: --config: %s (see --help)\n", what.c_str());
      }
      code = 2;
    } catch (const CLI::ParseError& e) {
      // One line, exit code 2, as users of command-line tools expect.
      if (rank == 0) std::fprintf(stderr, "lather-train: %s (see --help)\n", lather::train::explain(e, app).c_str());
      code = 2;
    } catch (const lather::Error& e) {
      if (rank == 0) std::fprintf(stderr, "lather-train: %s\n", e.message().c_str());
      code = 2;
    }
  }
  return code;
} catch (const lather::Error& e) {
  // MPI itself failed to start or to end (every rank reports it).
  std::fprintf(stderr, "lather-train: %s\n", e.message().c_str());
  return 2;
}
