#include "graphward/engine/runtime/graph_pool.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/memory_detail.h"

namespace graphward {

namespace {
std::atomic<std::size_t> g_pool_bytes{0};  // debug::graph_pool_bytes()
}  // namespace

std::size_t debug::graph_pool_bytes() {
  return g_pool_bytes.load(std::memory_order_relaxed);
}

#if GRAPHWARD_HAS_CUDA
// A block of `bytes` for an allocation on `stream` (being captured) from the pool: a reusable one,
// or a new one made with cudaMalloc under a relaxed capture mode.
void* detail::graph_pool_take(detail::GraphPoolState& st, cudaStream_t stream, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(st.mutex);
  auto it = st.free.find({stream, bytes});
  if (it != st.free.end() && !it->second.empty()) {
    void* p = it->second.back();
    st.held.insert(p);
    it->second.pop_back();
    return p;
  }
  auto un = st.unused.find(bytes);  // a block an earlier capture with this pool used
  if (un != st.unused.end() && !un->second.empty()) {
    void* p = un->second.back();
    st.held.insert(p);
    un->second.pop_back();
    return p;
  }
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  GW_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  GW_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  // Note [Out of memory]: nothing to return inside a capture.
  if (err == cudaErrorMemoryAllocation) {
    detail::out_of_memory(st.device, bytes,
                          "a block of the graph's memory pool (its intermediates)");
  }
  GW_CUDA_CHECK(err);
  try {
    st.held.insert(p);
    st.blocks.emplace_back(p, bytes);
  } catch (...) {
    GW_CUDA_CHECK_NOTHROW(cudaFree(p));
    throw;
  }
  st.bytes += bytes;
  g_pool_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

#endif

void detail::GraphPoolState::free_blocks(
    const std::vector<std::pair<void*, std::size_t>>& which) noexcept {
#if GRAPHWARD_HAS_CUDA
  if (which.empty()) return;
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
  if (saved != device.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(device.index));
  for (const auto& [p, n] : which) {
    GW_CUDA_CHECK_NOTHROW(cudaFree(p));  // waits for the device
    g_pool_bytes.fetch_sub(n, std::memory_order_relaxed);
  }
  if (saved >= 0 && saved != device.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved));
#else
  (void)which;
#endif
}

void detail::GraphPoolState::free_unheld() {
  std::vector<std::pair<void*, std::size_t>> now, kept;
  for (const auto& b : blocks) (held.count(b.first) ? kept : now).push_back(b);
  for (const auto& [p, n] : now) bytes -= n;
  blocks = std::move(kept);
  free.clear();
  unused.clear();
  free_blocks(now);
}

GraphMemoryPool::GraphMemoryPool(Device device)
    : state_(std::make_shared<detail::GraphPoolState>(device)) {
  GW_CHECK(device.is_cuda(), "GraphMemoryPool: expected a CUDA device, got ", device.str());
  check_cuda_device(device, "GraphMemoryPool");
}

// Note [Graph memory pool]: the executable is gone; what its tensors still hold stays until they
// go, the rest is given back now.
GraphMemoryPool::~GraphMemoryPool() {
  try {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->owner_gone = true;
    state_->free_unheld();
  } catch (const std::exception& e) {
    detail::log_error(__FILE__, __LINE__, e.what());  // the blocks go with the last storage
  }
}

std::size_t GraphMemoryPool::bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->bytes;
}

std::size_t GraphMemoryPool::blocks() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->blocks.size();
}

GraphPoolScope::GraphPoolScope(GraphMemoryPool& pool) : state_(pool.state_) {
  GW_CHECK(!detail::thread_graph_pool(),
           "GraphPoolScope: a graph memory pool is already in use on this thread");
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->scoped = true;
  state_->unused.clear();  // a new capture: every block is free for it
  for (const auto& [p, n] : state_->blocks) {
    if (!state_->held.count(p)) state_->unused[n].push_back(p);  // a live tensor's stays its own
  }
  detail::thread_graph_pool() = state_;
}

GraphPoolScope::~GraphPoolScope() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->scoped = false;
  state_->free.clear();  // the graph is made: nothing is reused any more
  state_->unused.clear();
  detail::thread_graph_pool().reset();
}

}  // namespace graphward
