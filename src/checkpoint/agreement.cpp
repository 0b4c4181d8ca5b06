#include "agreement.hpp"

#include <lather/core/error.hpp>

#include <vector>

namespace lather::checkpoint::Impl {

void agree(MPI_Comm comm, const std::string& error) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int mine = error.empty() ? size : rank;
  int first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  int length = rank == first ? int(error.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  std::vector<char> text(length);
  if (rank == first) text.assign(error.begin(), error.end());
  MPI_Bcast(text.data(), length, MPI_CHAR, first, comm);
  std::string message(text.begin(), text.end());
  if (size > 1) message += " (reported by rank " + std::to_string(first) + ")";
  // The text already names the file, the dataset and the source location where it failed.
  throw ::lather::Error(message, nullptr, 0);
}

}  // namespace lather::checkpoint::Impl
