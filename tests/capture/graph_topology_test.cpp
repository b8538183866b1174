// analyze_topology (capture/graph_topology.h) on hand-made DAGs: the shapes GraphStats reports of a
// captured graph.
#include "graphward/capture/graph_topology.h"
#include "test_util.h"

namespace graphward::capture {
namespace {

using Edges = std::vector<std::pair<std::uint32_t, std::uint32_t>>;

TEST(GraphTopology, OneRootForkingIntoChainsThatEndTheGraph) {
  // 0 -> {1, 4, 7}; chains 1-2-3, 4-5-6, 7-8-9 (what a 3-branch captured backward looks like)
  Edges e{{0, 1}, {1, 2}, {2, 3}, {0, 4}, {4, 5}, {5, 6}, {0, 7}, {7, 8}, {8, 9}};
  const Topology t = analyze_topology(10, e);
  EXPECT_EQ(t.roots, 1u);
  EXPECT_EQ(t.sinks, 3u);
  EXPECT_EQ(t.fork_nodes, 1u);
  EXPECT_EQ(t.join_nodes, 0u);
  EXPECT_EQ(t.max_fan_out, 3u);
  EXPECT_EQ(t.longest_path, 4u);
}

TEST(GraphTopology, JoinsIsolatedNodesAndTheLongestPath) {
  // a diamond 0 -> {1, 2} -> 3 with a tail 3 -> 4, an edge 0 -> 3, and an isolated node 5
  const Topology t = analyze_topology(6, {{0, 1}, {0, 2}, {1, 3}, {2, 3}, {0, 3}, {3, 4}});
  EXPECT_EQ(t.roots, 2u);  // 0 and 5
  EXPECT_EQ(t.sinks, 2u);  // 4 and 5
  EXPECT_EQ(t.fork_nodes, 1u);
  EXPECT_EQ(t.join_nodes, 1u);
  EXPECT_EQ(t.max_fan_out, 3u);
  EXPECT_EQ(t.longest_path, 4u);  // 0-1-3-4, not 0-3-4
  const Topology empty = analyze_topology(0, {});
  EXPECT_EQ(empty.longest_path, 0u);
  EXPECT_EQ(empty.roots, 0u);
}

TEST(GraphTopology, ACycleOrAnEdgeOutOfRangeIsAClearError) {
  GW_EXPECT_ERROR(analyze_topology(3, {{0, 1}, {1, 2}, {2, 1}}), "cycle", "DAG");
  GW_EXPECT_ERROR(analyze_topology(2, {{0, 2}}), "0 -> 2", "2 nodes");
}

}  // namespace
}  // namespace graphward::capture
