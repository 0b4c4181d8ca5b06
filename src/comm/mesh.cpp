#include <lather/comm/mesh.hpp>

#include <string>

namespace lather::comm {

Mesh::Mesh(const Group& world, int weight_shards, int pipeline_stages) {
  // Everything checked here is known locally from the group's size, so a bad layout throws the
  // same error on every rank without a collective that could hang.
  const int size = world.size();
  LATHER_REQUIRE(weight_shards >= 1, "Mesh: weight_shards must be >= 1, got ", weight_shards, " (world of ", size,
                 " ranks)");
  LATHER_REQUIRE(pipeline_stages >= 1, "Mesh: pipeline_stages must be >= 1, got ", pipeline_stages, " (world of ", size,
                 " ranks)");
  LATHER_REQUIRE(size % (weight_shards * pipeline_stages) == 0, "Mesh: weight_shards ", weight_shards,
                 pipeline_stages > 1 ? " x pipeline_stages " + std::to_string(pipeline_stages) : std::string(),
                 " does not divide the world size ", size,
                 " (rank r holds shard r mod S of replica r div S, so S must divide the size; with P stages, S P)");
  m_world = world;
  m_world_size = size;
  m_world_rank = world.rank();
  m_weight_shards = weight_shards;
  m_pipeline_stages = pipeline_stages;
  const int S = weight_shards, P = pipeline_stages;
  m_data_parallel = m_world.split(stage() * S + shard(), replica());
  m_shards = m_world.split(replica() * P + stage(), shard());
  if (P > 1) {
    m_pipeline = m_world.split(replica() * S + shard(), stage());
    m_stage_ranks = m_world.split(stage(), replica() * S + shard());
  } else {
    // One stage: no further splits (a Mesh of one stage costs what it did before stages).
    m_stage_ranks = m_world;
  }
}

}  // namespace lather::comm
