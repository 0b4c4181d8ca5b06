#include "agreement.hpp"

#include <lather/core/error.hpp>

namespace lather::checkpoint::Impl {

void agree(MPI_Comm comm, const std::string& error) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int mine = error.empty() ? size : rank;
  int first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  std::string message = error;
  broadcast(comm, first, message);
  if (size > 1) message += " (reported by rank " + std::to_string(first) + ")";
  // The text already names the file, the dataset and the source location where it failed.
  throw ::lather::Error(message, nullptr, 0);
}

void broadcast(MPI_Comm comm, int root, std::string& text) {
  int length = int(text.size());
  MPI_Bcast(&length, 1, MPI_INT, root, comm);
  text.resize(length);
  MPI_Bcast(text.data(), length, MPI_CHAR, root, comm);
}

}  // namespace lather::checkpoint::Impl
