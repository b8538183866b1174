#include "graphward/capture/graph_topology.h"

#include <algorithm>

#include "graphward/base/error.h"

namespace graphward::capture {

Topology analyze_topology(std::size_t num_nodes,
                          const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges) {
  std::vector<std::size_t> in(num_nodes, 0), out(num_nodes, 0);
  for (const auto& [a, b] : edges) {
    GW_CHECK(a < num_nodes && b < num_nodes, "analyze_topology: edge ", a, " -> ", b,
             " names a node beyond the ", num_nodes, " nodes");
    ++out[a];
    ++in[b];
  }
  Topology t;
  for (std::size_t n = 0; n < num_nodes; ++n) {
    t.roots += in[n] == 0;
    t.sinks += out[n] == 0;
    t.fork_nodes += out[n] > 1;
    t.join_nodes += in[n] > 1;
    t.max_fan_out = std::max(t.max_fan_out, out[n]);
  }
  // Longest path by Kahn's order: depth[b] = max(depth[a] + 1).
  std::vector<std::size_t> first(num_nodes + 1, 0);  // CSR of successors
  for (const auto& [a, b] : edges) ++first[a + 1];
  for (std::size_t n = 0; n < num_nodes; ++n) first[n + 1] += first[n];
  std::vector<std::uint32_t> succ(edges.size());
  std::vector<std::size_t> fill(first.begin(), first.end() - 1);
  for (const auto& [a, b] : edges) succ[fill[a]++] = b;
  std::vector<std::size_t> depth(num_nodes, 1), remaining = in, ready;
  for (std::size_t n = 0; n < num_nodes; ++n) {
    if (remaining[n] == 0) ready.push_back(n);
  }
  std::size_t visited = 0;
  while (!ready.empty()) {
    const std::size_t n = ready.back();
    ready.pop_back();
    ++visited;
    t.longest_path = std::max(t.longest_path, depth[n]);
    for (std::size_t e = first[n]; e < first[n + 1]; ++e) {
      const std::uint32_t m = succ[e];
      depth[m] = std::max(depth[m], depth[n] + 1);
      if (--remaining[m] == 0) ready.push_back(m);
    }
  }
  GW_CHECK(visited == num_nodes, "analyze_topology: the edges make a cycle; expected a DAG");
  return t;
}

}  // namespace graphward::capture
