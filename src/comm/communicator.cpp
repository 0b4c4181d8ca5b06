#include <lather/comm/communicator.hpp>
#include <lather/comm/mesh.hpp>

#include "mpi_support.hpp"

namespace lather::comm {

Communicator Communicator::duplicate(MPI_Comm comm) {
  LATHER_REQUIRE(comm != MPI_COMM_NULL, "Communicator::duplicate: the communicator is MPI_COMM_NULL");
  MPI_Comm out = MPI_COMM_NULL;
  Impl::check_mpi(MPI_Comm_dup(comm, &out), "MPI_Comm_dup");
  return Communicator(out);
}

Communicator Communicator::split(MPI_Comm comm, int color, int key) {
  LATHER_REQUIRE(comm != MPI_COMM_NULL, "Communicator::split: the communicator is MPI_COMM_NULL");
  MPI_Comm out = MPI_COMM_NULL;
  Impl::check_mpi(MPI_Comm_split(comm, color, key, &out), "MPI_Comm_split");
  return Communicator(out);
}

void Communicator::reset() noexcept {
  if (m_comm == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&m_comm);
  m_comm = MPI_COMM_NULL;
}

int comm_size(MPI_Comm comm) {
  LATHER_REQUIRE(comm != MPI_COMM_NULL, "comm_size: the communicator is MPI_COMM_NULL");
  int size = 0;
  Impl::check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

int comm_rank(MPI_Comm comm) {
  LATHER_REQUIRE(comm != MPI_COMM_NULL, "comm_rank: the communicator is MPI_COMM_NULL");
  int rank = 0;
  Impl::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}

std::vector<int> world_ranks(MPI_Comm group, MPI_Comm world) {
  const int size = comm_size(group);
  MPI_Group group_of_group = MPI_GROUP_NULL, group_of_world = MPI_GROUP_NULL;
  Impl::check_mpi(MPI_Comm_group(group, &group_of_group), "MPI_Comm_group");
  Impl::check_mpi(MPI_Comm_group(world, &group_of_world), "MPI_Comm_group");
  std::vector<int> ranks(size), out(size, MPI_UNDEFINED);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  const int status = MPI_Group_translate_ranks(group_of_group, size, ranks.data(), group_of_world,
                                               out.data());
  MPI_Group_free(&group_of_group);
  MPI_Group_free(&group_of_world);
  Impl::check_mpi(status, "MPI_Group_translate_ranks");
  return out;
}

Mesh::Mesh(MPI_Comm comm, int weight_shards) {
  LATHER_REQUIRE(comm != MPI_COMM_NULL, "Mesh: the communicator is MPI_COMM_NULL");
  // Everything checked here is computed locally from MPI_Comm_size, so a bad weight_shards throws
  // the same error on every rank without a collective that could hang.
  const int size = comm_size(comm);
  LATHER_REQUIRE(weight_shards >= 1, "Mesh: weight_shards must be >= 1, got ", weight_shards,
                 " (world of ", size, " ranks)");
  LATHER_REQUIRE(size % weight_shards == 0, "Mesh: weight_shards ", weight_shards,
                 " does not divide the world size ", size,
                 " (rank r holds shard r mod S of replica r div S, so S must divide the size)");
  m_world = Communicator::duplicate(comm);
  m_world_size = size;
  m_world_rank = comm_rank(m_world.get());
  m_weight_shards = weight_shards;
  m_data_parallel = Communicator::split(m_world.get(), shard(), replica());
  m_shards = Communicator::split(m_world.get(), replica(), shard());
}

}  // namespace lather::comm
