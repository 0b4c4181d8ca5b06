// A process that writes one checkpoint and is meant to be killed while doing it:
//   checkpoint_crash_writer <directory> <step> <megabytes>
// The array "data" holds `step` in every element; attribute "elements" says how many.
#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/mpi_session.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const lather::comm::MpiSession mpi(argc, argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    if (argc != 4) {
      std::fprintf(stderr, "usage: %s <directory> <step> <megabytes>\n", argv[0]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const long step = std::atol(argv[2]);
    const std::size_t elements = std::size_t(std::atol(argv[3])) * (1u << 20) / sizeof(double);
    std::vector<double> data(elements, double(step));
    lather::checkpoint::CheckpointOptions options;
    options.directory = argv[1];
    options.keep_last = 100;
    lather::checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
    lather::checkpoint::ArraySlice slice;
    slice.path = "data";
    slice.dtype = lather::optim::DType::float64;
    slice.shape = {std::int64_t(elements)};
    slice.data = data.data();
    lather::checkpoint::Attributes attributes;
    attributes.integers["elements"] = std::int64_t(elements);
    std::printf("writing\n");
    std::fflush(stdout);
    checkpointer.save(step, {slice}, attributes);
    std::printf("done\n");
  }
  return 0;
}
