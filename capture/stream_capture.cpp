#include "graphward/capture/stream_capture.h"

#if GRAPHWARD_HAS_CUDA
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/engine/runtime/ptr_index.h"
#include "graphward/engine/tape/deferred_release.h"

namespace graphward::capture {

cudaGraph_t capture_stream(cudaStream_t stream, std::string_view what, std::string_view hint,
                           const std::function<void()>& body,
                           std::vector<std::shared_ptr<ReplayWatcher>>* watchers) {
  CaptureWatchers collected;  // Note [Watched replays]
  // Note [Deferred release]: a release worker's frees and events enqueue on the streams the
  // tensors used; none may land on a stream while this thread captures it.
  detail::wait_for_releases();
  // Note [Device-wide waits and other threads' captures]: no other thread's device-wide wait runs
  // while this capture is underway.
  int device = 0;
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess) {
    (void)cudaGetLastError();
    GW_CUDA_CHECK(cudaGetDevice(&device));
  }
  detail::CaptureUnderway underway(device);
  GW_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    cudaGraph_t abandoned = nullptr;
    (void)cudaStreamEndCapture(stream, &abandoned);
    if (abandoned) (void)cudaGraphDestroy(abandoned);
    (void)cudaGetLastError();
    detail::release_deferred_storage();  // Note [Frees during a capture]
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  detail::release_deferred_storage();  // Note [Frees during a capture]: tensors dropped inside
  if (ended != cudaSuccess || !graph) {
    (void)cudaGetLastError();
    GW_CHECK(false, what, ": capturing failed (", cudaGetErrorName(ended), ": ",
             cudaGetErrorString(ended), "); ", hint);
  }
  if (watchers) *watchers = collected.take();
  return graph;
}

bool has_prioritized_kernel(cudaGraph_t graph) {
  return count_nodes(graph).prioritized;
}

cudaGraphExec_t instantiate(cudaGraph_t graph) {
  cudaGraphExec_t exec = nullptr;
  // Note [Node priorities]
  const unsigned long long flags =
      has_prioritized_kernel(graph) ? cudaGraphInstantiateFlagUseNodePriority : 0;
  GW_CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, flags));
  return exec;
}

Graph::Graph(Graph&& other) noexcept
    : graph_(other.graph_),
      exec_(other.exec_),
      watchers_(std::move(other.watchers_)),
      name_(std::move(other.name_)) {
  other.graph_ = nullptr;
  other.exec_ = nullptr;
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    reset();
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
    watchers_ = std::move(other.watchers_);
    name_ = std::move(other.name_);
  }
  return *this;
}

void Graph::watch(std::vector<std::shared_ptr<ReplayWatcher>> watchers,
                  std::shared_ptr<const std::string> name) {
  watchers_ = std::move(watchers);
  name_ = std::move(name);
}

Graph::~Graph() {
  reset();
}

void Graph::reset() noexcept {
  if (exec_) GW_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(exec_));
  if (graph_) GW_CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
}

void Graph::instantiate() {
  GW_CHECK(graph_ && !exec_, "capture::Graph::instantiate: internal error: ",
           graph_ ? "instantiated already" : "no graph");
  exec_ = capture::instantiate(graph_);
}

namespace {
const char* update_result_name(cudaGraphExecUpdateResult r) {
  switch (r) {
    case cudaGraphExecUpdateSuccess:
      return "success";
    case cudaGraphExecUpdateErrorTopologyChanged:
      return "the topology changed";
    case cudaGraphExecUpdateErrorNodeTypeChanged:
      return "a node type changed";
    case cudaGraphExecUpdateErrorFunctionChanged:
    case cudaGraphExecUpdateErrorUnsupportedFunctionChange:
      return "a kernel changed";
    case cudaGraphExecUpdateErrorParametersChanged:
      return "parameters changed unsupportedly";
    case cudaGraphExecUpdateErrorNotSupported:
      return "a node cannot be updated";
    case cudaGraphExecUpdateErrorAttributesChanged:
      return "node attributes changed";
    default:
      return "an error";
  }
}
}  // namespace

const char* Graph::update_to(Graph& fresh) {
  GW_CHECK(exec_ && fresh.graph_, "capture::Graph::update_to: internal error: ",
           exec_ ? "nothing to update to" : "no executable to update");
  cudaGraphExecUpdateResultInfo info{};
  if (cudaGraphExecUpdate(exec_, fresh.graph_, &info) != cudaSuccess) {
    (void)cudaGetLastError();
    return update_result_name(info.result);
  }
  std::swap(graph_, fresh.graph_);  // keep the graph that matches the executable
  return nullptr;
}

void Graph::launch(cudaStream_t stream) const {
  if (watchers_.empty()) {
    GW_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
    return;
  }
  static const std::string kUnnamed = "a captured graph";
  const std::string& name = name_ ? *name_ : kUnnamed;
  for (const auto& w : watchers_) w->before_launch(name);  // Note [Watched replays]
  GW_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
  for (const auto& w : watchers_) w->after_launch(stream, name);
}

void Graph::write_dot(const std::string& path, unsigned flags) const {
  detail::check_output_path("write_dot", path);
  GW_CUDA_CHECK(cudaGraphDebugDotPrint(graph_, path.c_str(), flags));
}

void append_event_record(cudaGraph_t graph, cudaEvent_t event) {
  // The sinks: nodes no edge leaves from.
  std::vector<cudaGraphNode_t> from = graph_edges(graph).from;
  std::sort(from.begin(), from.end());
  std::vector<cudaGraphNode_t> sinks;
  for (cudaGraphNode_t node : graph_nodes(graph)) {
    if (!std::binary_search(from.begin(), from.end(), node)) sinks.push_back(node);
  }
  cudaGraphNode_t record = nullptr;
  GW_CUDA_CHECK(cudaGraphAddEventRecordNode(&record, graph, sinks.data(), sinks.size(), event));
}

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph) {
  std::size_t n = 0;
  GW_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) GW_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  return nodes;
}

GraphEdges graph_edges(cudaGraph_t graph) {
  std::size_t n = 0;
  GW_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n));
  GraphEdges e{std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphNode_t>(n)};
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) GW_CUDA_CHECK(cudaGraphGetEdges(graph, e.from.data(), e.to.data(), data.data(), &n));
  return e;
}

Topology topology_of(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& nodes,
                     std::size_t* num_edges) {
  const GraphEdges links = graph_edges(graph);
  if (num_edges) *num_edges = links.from.size();
  detail::PtrIndex index(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) index.emplace(nodes[i], static_cast<int>(i));
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  edges.reserve(links.from.size());
  for (std::size_t e = 0; e < links.from.size(); ++e) {
    edges.emplace_back(static_cast<std::uint32_t>(index.at(links.from[e])),
                       static_cast<std::uint32_t>(index.at(links.to[e])));
  }
  return analyze_topology(nodes.size(), edges);
}

NodeCounts count_nodes(cudaGraph_t graph) {
  NodeCounts c;
  c.nodes = graph_nodes(graph);
  for (cudaGraphNode_t node : c.nodes) {
    cudaGraphNodeType type{};
    GW_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      ++c.kernels;
      cudaLaunchAttributeValue value{};
      GW_CUDA_CHECK(cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributePriority, &value));
      c.prioritized = c.prioritized || value.priority != 0;
    } else {
      ++c.others;
      if (type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree) ++c.memory;
    }
  }
  return c;
}

Tensor input_slot_like(const Tensor& like, Device device, cudaStream_t stream) {
  const std::size_t bytes = std::max<std::size_t>(like.nbytes(), 1);
  auto buffer = std::make_shared<DeviceBuffer>(device, bytes);
  void* data = buffer->data();
  return Tensor::from_storage(Storage::borrow(device, data, bytes, stream, std::move(buffer)),
                              like.shape(), like.dtype());
}

void SlotRefresh::add(const Tensor& slot, const Tensor& src) {
  src.storage()->sync_for_read(stream_);
  if (src.nbytes() == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 4 == 0; };
  if (!aligned(slot.raw_data()) || !aligned(src.raw_data())) {
    GW_CUDA_CHECK(cudaMemcpyAsync(slot.raw_data(), src.raw_data(), src.nbytes(),
                                  cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  copier_.add(src.raw_data(), slot.raw_data(), src.nbytes());
}

}  // namespace graphward::capture
#endif
