#pragma once
// The shape of a DAG given as edges between numbered nodes — what GraphStats reports of a captured
// CUDA graph (its nodes numbered in cudaGraphGetNodes order), and what tests assert: a backward
// whose forward ran K branches on K streams is one root (the loss's backward) forking into K
// chains that end the graph.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace graphward::capture {

struct Topology {
  std::size_t roots = 0;         // nodes with no incoming edge
  std::size_t sinks = 0;         // nodes with no outgoing edge
  std::size_t fork_nodes = 0;    // nodes with more than one outgoing edge
  std::size_t join_nodes = 0;    // nodes with more than one incoming edge
  std::size_t max_fan_out = 0;   // the most outgoing edges of one node
  std::size_t longest_path = 0;  // in nodes (0 for an empty graph)
};

// Throws graphward::Error if an edge names a node >= num_nodes or the edges make a cycle.
Topology analyze_topology(std::size_t num_nodes,
                          const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges);

}  // namespace graphward::capture
