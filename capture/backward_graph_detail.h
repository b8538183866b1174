#pragma once
// Internal to capture/ (not part of the public API): BackwardGraph's executable, which
// backward_graph.cpp and input_slots.cpp share.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/capture/backward_graph.h"
#include "graphward/capture/stream_capture.h"
#include "graphward/engine/runtime/graph_pool.h"

namespace graphward {

struct BackwardGraph::Executable {
  GraphStats stats;
  // Where the nodes and leaves the backward reaches are in the signature's `nodes` and `leaves`
  // (the same for every step with this structure).
  std::vector<std::uint32_t> nodes, leaves;
  // A signature from the tape log: its nodes' part, what the next step's forward is compared with
  // as it records (Note [Tape log]). Null for a signature made by a walk.
  std::shared_ptr<const capture::Words> nodes_part;
  // The graph's intermediates (Note [Graph memory pool]): declared before the graph, destroyed
  // after it.
  std::unique_ptr<GraphMemoryPool> pool;
#if GRAPHWARD_HAS_CUDA
  // Note [A replay's fence] (capture/stream_capture.h): recorded by the graph's last node at every
  // launch; what the step's saved tensors' frees wait for. Declared before the graph: destroyed
  // after it. The same event for every graph of this structure (an update keeps it).
  std::shared_ptr<Event> fence;
  capture::Graph graph;
#endif
  // What a kernel fault after its launch names (Note [Kernel faults], base/error.h).
  std::shared_ptr<const std::string> description;
  std::vector<InputSlot> slots;  // Note [Input slots]
  Executable() = default;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
};

}  // namespace graphward
