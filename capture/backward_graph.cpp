#include "capture/backward_graph.h"

#include "engine/capture_mode.h"
#include "engine/memory.h"

#if GRAPHWARD_HAS_CUDA
#include "engine/blas.h"
#endif

namespace graphward {

struct BackwardGraph::Executable {
#if GRAPHWARD_HAS_CUDA
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
#endif
  GraphStats stats;
  Executable() = default;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  ~Executable() {
#if GRAPHWARD_HAS_CUDA
    if (exec) GW_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(exec));
    if (graph) GW_CUDA_CHECK_NOTHROW(cudaGraphDestroy(graph));
#endif
  }
};

BackwardGraph::BackwardGraph(Device device, BackwardGraphOptions options)
    : device_(device), options_(options), cache_(options.cache_capacity) {
  if (device.is_cuda()) check_cuda_device(device, "BackwardGraph");
  GW_CHECK(options.warmup >= 1 || device.is_cpu() || options.force_eager,
           "BackwardGraph: warmup is ", options.warmup,
           "; expected at least 1 eager backward before the first capture (cuBLAS and the GEMM "
           "plans must be initialized outside a capture)");
}

BackwardGraph::~BackwardGraph() = default;

void BackwardGraph::eager(const Tensor& loss, GradWrite grad_write) {
  graphward::backward(
      loss, {.grad_write = grad_write, .split_weight_grads = options_.split_weight_grads});
  ++eager_;
}

#if GRAPHWARD_HAS_CUDA
namespace {

GraphStats stats_of(cudaGraph_t graph, const BackwardPlan& plan) {
  GraphStats st;
  std::size_t n = 0;
  GW_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) GW_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    GW_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeKernel) {
      ++st.kernel_nodes;
    } else {
      ++st.other_nodes;
    }
  }
  GW_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &st.edges));
  st.streams = plan.streams.size();
  st.forks = plan.forks.size();
  st.joins = plan.joins.size();
  return st;
}

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
#endif

void BackwardGraph::backward(const Tensor& loss, GradWrite grad_write) {
  GW_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
           "BackwardGraph::backward: expected a one-element loss that requires grad, got ",
           loss.str());
  GW_CHECK(loss.device() == device_, "BackwardGraph::backward: the loss is on ",
           loss.device().str(), "; this BackwardGraph is for ", device_.str());
  ++calls_;
  if (device_.is_cpu() || options_.force_eager ||
      calls_ <= static_cast<std::uint64_t>(options_.warmup)) {
    eager(loss, grad_write);
    return;
  }
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(device_);
  const cudaStream_t caller = current_stream(device_);
  // The seed: static, made on the caller's stream (so nothing waits on another stream in the
  // capture), remade only when the loss's shape or the caller's stream changes.
  if (!seed_.defined() || seed_.shape() != loss.shape() || seed_.dtype() != loss.dtype() ||
      seed_.storage()->producer_stream() != caller) {
    seed_ = ones(loss.shape(), {loss.dtype(), device_});
  }
  capture::TapeSignature& sig = signature_;
  const std::vector<Tensor> roots{loss}, seeds{seed_};
  capture::tape_signature(sig, roots, seeds, caller, grad_write);
  // A graph writes gradients into persistent buffers: give every leaf one before it is captured.
  bool made = false;
  for (const Tensor& leaf : sig.leaves) {
    if (!leaf.grad().defined()) {
      leaf.grad() = zeros(leaf.shape(), {leaf.dtype(), device_});
      made = true;
    }
  }
  if (made) capture::tape_signature(sig, roots, seeds, caller, grad_write);

  auto decision = cache_.decide(sig);
  std::shared_ptr<Executable> exec;
  if (decision.action == decltype(cache_)::Action::kReplay) {
    exec = decision.entry->exec;
  } else {
    // Capture: the eager executor runs the plan under stream capture from the caller's stream,
    // each other forward stream mapped onto a private capture stream.
    BackwardPlan plan =
        plan_for({loss}, grad_write, {.split_weight_grads = options_.split_weight_grads});
    while (capture_streams_.size() + 1 < plan.streams.size()) {
      capture_streams_.push_back(std::make_unique<Stream>(device_));
    }
    for (std::size_t i = 1; i < plan.streams.size(); ++i) {
      plan.streams[i] = capture_streams_[i - 1]->get();
      (void)blas_context(device_, plan.streams[i]);  // handle and workspace: outside the capture
    }
    auto fresh = std::make_shared<Executable>();
    GW_CUDA_CHECK(cudaStreamBeginCapture(caller, cudaStreamCaptureModeThreadLocal));
    try {
      CaptureModeScope scope("the backward graph");
      executor_.run(plan, {seed_}, device_, nullptr, /*release_saved=*/false);
    } catch (...) {
      cudaGraph_t abandoned = nullptr;
      (void)cudaStreamEndCapture(caller, &abandoned);
      if (abandoned) (void)cudaGraphDestroy(abandoned);
      (void)cudaGetLastError();
      throw;
    }
    const cudaError_t ended = cudaStreamEndCapture(caller, &fresh->graph);
    if (ended != cudaSuccess || !fresh->graph) {
      (void)cudaGetLastError();
      GW_CHECK(false, "BackwardGraph: capturing the backward failed (", cudaGetErrorName(ended),
               ": ", cudaGetErrorString(ended),
               "); some work in it was not capturable or used a stream outside the capture");
    }
    fresh->stats = stats_of(fresh->graph, plan);
    bool updated = false;
    if (decision.action == decltype(cache_)::Action::kUpdate) {
      Executable& old = *decision.entry->exec;
      cudaGraphExecUpdateResultInfo info{};
      const cudaError_t err = cudaGraphExecUpdate(old.exec, fresh->graph, &info);
      if (err == cudaSuccess) {
        std::swap(old.graph, fresh->graph);  // keep the graph that matches the executable
        old.stats = fresh->stats;
        exec = decision.entry->exec;
        updated = true;
        last_reason_ = "update: " + decision.reason;
      } else {
        (void)cudaGetLastError();
        last_reason_ = "update refused (" + std::string(update_result_name(info.result)) +
                       "), re-instantiated: " + decision.reason;
      }
    }
    if (!updated) {
      GW_CUDA_CHECK(cudaGraphInstantiate(&fresh->exec, fresh->graph, 0));
      exec = fresh;
      if (decision.action == decltype(cache_)::Action::kUpdate) {
        decision.entry->exec = fresh;
      } else {
        cache_.insert(sig, fresh);
        last_reason_ = "capture: " + decision.reason;
      }
    }
    if (decision.action == decltype(cache_)::Action::kUpdate)
      cache_.count_update(*decision.entry, sig);
    last_captured_ = exec;
  }

  // Replay on the caller's stream, after every stream the forward used (the graph reads its
  // results; its private streams are forked from the caller's stream inside the graph).
  for (std::size_t i = 1; i < sig.streams.size(); ++i) {
    if (sig.streams[i] && sig.streams[i] != caller)
      stream_wait_stream(device_, caller, sig.streams[i]);
  }
  GW_CUDA_CHECK(cudaGraphLaunch(exec->exec, caller));
  cache_.count_replay();
  last_stats_ = exec->stats;
  // The graph wrote the gradients and read the saved tensors on the caller's stream: record it, so
  // that later readers wait for it (rule 6) and frees are ordered after it (rule 7); then release
  // the step's saved tensors, as a backward without retain_graph does.
  for (const Tensor& leaf : sig.leaves) leaf.grad().storage()->record_use(caller, true);
  seed_.storage()->record_use(caller, false);
  for (Node* n : sig.nodes) {
    for (const SavedTensor& s : n->saved()) {
      if (s.tensor.defined()) s.tensor.storage()->record_use(caller, false);
    }
    n->release_saved();
  }
  sig.nodes.clear();  // the step's handles: let the tape go
  sig.leaves.clear();
#else
  eager(loss, grad_write);
#endif
}

void BackwardGraph::write_dot(const std::string& path) const {
#if GRAPHWARD_HAS_CUDA
  GW_CHECK(last_captured_ && last_captured_->graph,
           "BackwardGraph::write_dot: no graph has been captured yet");
  GW_CUDA_CHECK(cudaGraphDebugDotPrint(last_captured_->graph, path.c_str(), 0));
#else
  (void)path;
  GW_CHECK(false, "BackwardGraph::write_dot: graphward was built without CUDA");
#endif
}

}  // namespace graphward
