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
// data_parallel(); tensor-parallel layers communicate over shards(). Lather's objects take the
// Mesh and pick the group they work over themselves.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>

namespace lather::comm {

class Mesh {
 public:
  /// One process: every group is the process on its own (no MPI needed).
  Mesh() = default;
  /// Collective over `world` (two communicator splits). Throws lather::Error on every rank, before
  /// any communication, when weight_shards < 1 or does not divide the size of `world`. An
  /// MPI_Comm converts to a Group implicitly (a duplicate): Mesh mesh(MPI_COMM_WORLD, 2).
  explicit Mesh(const Group& world, int weight_shards = 1);

  /// The whole mesh (its own duplicate of the communicator it was built from).
  const Group& world() const noexcept { return m_world; }
  /// The ranks holding this rank's shard, one per replica; rank within = replica().
  const Group& data_parallel() const noexcept { return m_data_parallel; }
  /// The S ranks of this rank's replica; rank within = shard().
  const Group& shards() const noexcept { return m_shards; }

  int world_size() const noexcept { return m_world_size; }
  int world_rank() const noexcept { return m_world_rank; }
  int weight_shards() const noexcept { return m_weight_shards; }
  int shard() const noexcept { return m_world_rank % m_weight_shards; }
  int replica() const noexcept { return m_world_rank / m_weight_shards; }
  int replicas() const noexcept { return m_world_size / m_weight_shards; }

 private:
  Group m_world, m_data_parallel, m_shards;
  int m_world_size = 1;
  int m_world_rank = 0;
  int m_weight_shards = 1;
};

}  // namespace lather::comm
