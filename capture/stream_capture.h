#pragma once
// Stream capture with the error handling every graph in graphward needs, written once.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include "graphward/base/config.h"
#include "graphward/capture/graph_topology.h"

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/engine/runtime/tensor.h"
#include "graphward/kernels/shape.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime.h>

namespace graphward::capture {

// Captures, in thread-local mode, what `body` enqueues on `stream` (and on the streams it forks
// from it) into a new graph the caller owns. If `body` throws, the capture is ended, its partial
// graph destroyed and the exception passed on: no capture is left open. If ending the capture
// fails, a graphward::Error says "<what>: capturing failed (<CUDA error>); <hint>". Either way,
// eager tensors dropped inside the capture are released once it has ended (Note [Frees during a
// capture], engine/runtime/memory.cpp). Note [Watched replays] (engine/runtime/capture_mode.h): the watchers
// registered while `body` ran go to `watchers`, when given, for the Graph made of it.
cudaGraph_t capture_stream(cudaStream_t stream, std::string_view what, std::string_view hint,
                           const std::function<void()>& body,
                           std::vector<std::shared_ptr<ReplayWatcher>>* watchers = nullptr);

// Note [Node priorities]
// Instantiates `graph` as every graph of graphward is: where some kernel node has a priority of
// its own, which capture takes from its stream, with each kernel node's priority (by default a
// replay runs every kernel at the priority of the stream it is launched into). The gradient
// reductions' stream is the device's highest priority (dist/process_group.h): in a replay too,
// its kernels are scheduled before the backward's when both wait for the GPU, so a reduction
// starts as soon as its bucket is ready. A graph whose kernels all have the default priority is
// instantiated without the per-node priorities: they would change nothing in it, and they make
// each launch of a graph with side streams dearer on the host (docs/DECISIONS.md, "per-node
// priorities only where a kernel has one").
cudaGraphExec_t instantiate(cudaGraph_t graph);

// Whether some kernel node of `graph` has a priority other than the default (0):
// count_nodes(graph).prioritized.
bool has_prioritized_kernel(cudaGraph_t graph);

// Note [A replay's fence]
// Appends to `graph` a node that records `event` once every other node of it has run: each launch
// records the event, with no host call of its own where a cudaEventRecord after each launch is one
// (docs/DECISIONS.md, "a replay's fence recorded by the graph"). An event recorded by every replay
// covers the latest launch when it is waited on: a wait enqueued after a later replay waits for
// that one, which is ordered after the earlier (the later launch waited for it), so it is a
// stronger order than the waiter needed, never a weaker one; and it cannot wait for work enqueued
// after it. The event must outlive the executables made from the graph.
void append_event_record(cudaGraph_t graph, cudaEvent_t event);

// A captured graph and its executable, owned together: move-only, both destroyed with it (the
// executable first). Every graph graphward launches — a BackwardGraph's, a StepGraph's, a traced
// backward's — lives in one.
class Graph {
 public:
  Graph() = default;
  explicit Graph(cudaGraph_t graph) noexcept : graph_(graph) {}
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  cudaGraph_t graph() const { return graph_; }
  cudaGraphExec_t exec() const { return exec_; }
  explicit operator bool() const { return graph_ != nullptr; }
  // Makes the executable (instantiate() below). The graph must not have one yet.
  void instantiate();
  // Updates this executable in place to `fresh`'s graph (cudaGraphExecUpdate). On success this
  // keeps the graph that matches the executable, `fresh` the one it had, and nullptr is returned;
  // if CUDA refuses, nothing changes and the refusal is named.
  const char* update_to(Graph& fresh);
  // Launches the executable; Note [Watched replays]: between its watchers' calls, which name the
  // graph by `name`.
  void launch(cudaStream_t stream) const;
  // Note [Watched replays]: the watchers of this graph's capture, and what they call it.
  void watch(std::vector<std::shared_ptr<ReplayWatcher>> watchers,
             std::shared_ptr<const std::string> name);
  bool watched() const { return !watchers_.empty(); }
  // The graph as Graphviz DOT (cudaGraphDebugDotPrint with `flags`).
  void write_dot(const std::string& path, unsigned flags = 0) const;

 private:
  void reset() noexcept;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::vector<std::shared_ptr<ReplayWatcher>> watchers_;
  std::shared_ptr<const std::string> name_;
};

struct NodeCounts {
  std::vector<cudaGraphNode_t> nodes;  // in cudaGraphGetNodes' order
  std::size_t kernels = 0;
  std::size_t others = 0;  // memsets, event nodes, ... (memory among them)
  std::size_t memory = 0;  // memory allocation and free nodes
  bool prioritized = false;  // a kernel node has a priority other than the default (0)
};
NodeCounts count_nodes(cudaGraph_t graph);

// The graph's nodes, in cudaGraphGetNodes' order.
std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph);
// The graph's edges, edge e from `from[e]` to `to[e]`. Queried with their edge data: a query
// without it fails (cudaErrorLossyQuery) once an edge carries some, as the captures of NCCL's
// symmetric kernels make (Note [Symmetric buckets], dist/process_group.h). Every edge counts alike.
struct GraphEdges {
  std::vector<cudaGraphNode_t> from, to;
};
GraphEdges graph_edges(cudaGraph_t graph);
// The shape of `graph` (analyze_topology, capture/graph_topology.h), its `nodes` those of
// graph_nodes(graph); `num_edges`, when given, gets the number of its edges.
Topology topology_of(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& nodes,
                     std::size_t* num_edges = nullptr);

// An input slot (Note [Input slots], backward_graph.h; Note [Step inputs], step_graph.h): a tensor
// of `like`'s shape and dtype in a device allocation of its own — outside the step arena (whose
// slots the next step reuses), the block cache and graph pools — alive as long as a handle to it;
// `stream` is its first producer.
Tensor input_slot_like(const Tensor& like, Device device, cudaStream_t stream);
// Input slots refreshed before a launch: add() each (`src` into `slot`, on `stream`, after `src`'s
// producer), then flush(). The copies go in one kernel (kernels::copy_segments): one launch of
// host time for all of a step's slots where a cudaMemcpyAsync each cost more than a launch each.
// A slot whose ends are not 4-byte aligned (a view at an odd offset) is copied by cudaMemcpyAsync
// at once; the order among the slots does not matter (each is its own memory). What was added and
// not flushed is not copied.
class SlotRefresh {
 public:
  explicit SlotRefresh(cudaStream_t stream) : stream_(stream), copier_(stream) {}
  SlotRefresh(const SlotRefresh&) = delete;
  SlotRefresh& operator=(const SlotRefresh&) = delete;
  void add(const Tensor& slot, const Tensor& src);
  void flush() { copier_.flush(); }

 private:
  cudaStream_t stream_;
  kernels::SegmentCopier<kernels::FewSegments::kCapacity> copier_;
};

}  // namespace graphward::capture
#endif
