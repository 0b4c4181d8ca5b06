#pragma once
// The device mesh of data-parallel training with sharded weights: world = replicas x shards.
//
// With S weight shards, world rank r holds shard d = r mod S of replica i = r div S:
//
//            shard 0   shard 1  ...  shard S-1
//   replica 0   0         1            S-1
//   replica 1   S        S+1          2S-1
//   ...
//
// data_parallel() groups the ranks holding the same shard, {S*i + d : i}, which are the
// `axis_index_groups` of the JAX reference (rank within = replica index); shards() groups the S
// ranks of one replica (rank within = shard index). Gradients of a shard are reduced over
// data_parallel(); tensor-parallel layers communicate over shards().

#include <lather/comm/communicator.hpp>

#include <mpi.h>

namespace lather::comm {

class Mesh {
 public:
  /// Collective over `comm` (three communicator constructions). Throws lather::Error on every rank,
  /// before any communication, when weight_shards < 1 or does not divide the size of `comm`.
  explicit Mesh(MPI_Comm comm, int weight_shards = 1);

  Mesh(Mesh&&) noexcept = default;
  Mesh& operator=(Mesh&&) noexcept = default;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;
  ~Mesh() = default;

  /// A duplicate of the communicator the mesh was built from (its own message space).
  MPI_Comm world() const noexcept { return m_world.get(); }
  /// The ranks holding this rank's shard, one per replica; rank within = replica().
  MPI_Comm data_parallel() const noexcept { return m_data_parallel.get(); }
  /// The S ranks of this rank's replica; rank within = shard().
  MPI_Comm shards() const noexcept { return m_shards.get(); }

  int world_size() const noexcept { return m_world_size; }
  int world_rank() const noexcept { return m_world_rank; }
  int weight_shards() const noexcept { return m_weight_shards; }
  int shard() const noexcept { return m_world_rank % m_weight_shards; }
  int replica() const noexcept { return m_world_rank / m_weight_shards; }
  int replicas() const noexcept { return m_world_size / m_weight_shards; }

 private:
  Communicator m_world;
  Communicator m_data_parallel;
  Communicator m_shards;
  int m_world_size = 0;
  int m_world_rank = 0;
  int m_weight_shards = 1;
};

}  // namespace lather::comm
