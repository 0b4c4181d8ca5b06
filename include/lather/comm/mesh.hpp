#pragma once
// The device mesh of data-, pipeline- and tensor-parallel training:
// world = replicas x pipeline stages x weight shards.
//
// With P pipeline stages and S weight shards, world rank r holds shard d = r mod S of stage
// s = (r div S) mod P of replica i = r div (S P); r = (i P + s) S + d:
//
//                         shard 0   shard 1  ...  shard S-1
//   replica 0, stage 0       0         1            S-1
//   replica 0, stage 1       S        S+1          2S-1
//   ...
//   replica 1, stage 0      SP       SP+1         SP+S-1
//
// Shards are innermost because they talk most (every layer's all-reduces of [tokens, D]), so
// they land on neighbouring ranks, which mpiexec places on one node; the stage neighbours come
// next (one activation per micro-batch each way); replicas are outermost (one gradient
// reduction per step).
//
// data_parallel() groups the ranks holding the same (stage, shard), one per replica, which are the
// `axis_index_groups` of the JAX reference (rank within = replica index); shards() groups the S
// ranks of one (replica, stage) (rank within = shard index); pipeline() groups the P ranks of one
// (replica, shard) (rank within = stage index); stage() groups the replicas x shards ranks of one
// stage. Gradients of a shard are reduced over data_parallel(); tensor-parallel layers
// communicate over shards(); activations and their gradients travel over pipeline(). Lather's
// objects take the Mesh and pick the group they work over themselves. With one stage,
// stage_ranks() is the world and pipeline() each rank on its own.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_COMM)
#error "lather/comm/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <lather/comm/group.hpp>

namespace lather::comm {

class Mesh {
 public:
  /// One process: every group is the process on its own (no MPI needed).
  Mesh() = default;
  /// Collective over `world` (four communicator splits). Throws lather::Error on every rank,
  /// before any communication, when weight_shards or pipeline_stages is < 1 or their product does
  /// not divide the size of `world`. An MPI_Comm converts to a Group implicitly (a duplicate):
  /// Mesh mesh(MPI_COMM_WORLD, 2).
  explicit Mesh(const Group& world, int weight_shards = 1, int pipeline_stages = 1);

  /// The whole mesh (its own duplicate of the communicator it was built from).
  const Group& world() const noexcept { return m_world; }
  /// The ranks holding this rank's (stage, shard), one per replica; rank within = replica().
  const Group& data_parallel() const noexcept { return m_data_parallel; }
  /// The S ranks of this rank's (replica, stage); rank within = shard().
  const Group& shards() const noexcept { return m_shards; }
  /// The P ranks of this rank's (replica, shard), one per stage; rank within = stage().
  const Group& pipeline() const noexcept { return m_pipeline; }
  /// The replicas x S ranks of this rank's stage; rank within = replica() S + shard().
  const Group& stage_ranks() const noexcept { return m_stage_ranks; }

  int world_size() const noexcept { return m_world_size; }
  int world_rank() const noexcept { return m_world_rank; }
  int weight_shards() const noexcept { return m_weight_shards; }
  int pipeline_stages() const noexcept { return m_pipeline_stages; }
  int shard() const noexcept { return m_world_rank % m_weight_shards; }
  int stage() const noexcept { return (m_world_rank / m_weight_shards) % m_pipeline_stages; }
  int replica() const noexcept { return m_world_rank / (m_weight_shards * m_pipeline_stages); }
  int replicas() const noexcept { return m_world_size / (m_weight_shards * m_pipeline_stages); }
  bool first_stage() const noexcept { return stage() == 0; }
  bool last_stage() const noexcept { return stage() == m_pipeline_stages - 1; }

 private:
  Group m_world, m_data_parallel, m_shards, m_pipeline, m_stage_ranks;
  int m_world_size = 1;
  int m_world_rank = 0;
  int m_weight_shards = 1;
  int m_pipeline_stages = 1;
};

}  // namespace lather::comm
