#include <lather/comm/mesh.hpp>

namespace lather::comm {

Mesh::Mesh(const Group& world, int weight_shards) {
  // Everything checked here is known locally from the group's size, so a bad weight_shards throws
  // the same error on every rank without a collective that could hang.
  const int size = world.size();
  LATHER_REQUIRE(weight_shards >= 1, "Mesh: weight_shards must be >= 1, got ", weight_shards, " (world of ", size,
                 " ranks)");
  LATHER_REQUIRE(size % weight_shards == 0, "Mesh: weight_shards ", weight_shards, " does not divide the world size ",
                 size, " (rank r holds shard r mod S of replica r div S, so S must divide the size)");
  m_world = world;
  m_world_size = size;
  m_world_rank = world.rank();
  m_weight_shards = weight_shards;
  m_data_parallel = m_world.split(shard(), replica());
  m_shards = m_world.split(replica(), shard());
}

}  // namespace lather::comm
