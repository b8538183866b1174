#pragma once
// Note [Graph memory pool]
// A captured backward's intermediates (gradient buffers, GEMM outputs) must live in memory the
// graph owns: the graph's kernels point at it at every replay. Allocated inside the capture with
// cudaMallocAsync they would become memory-allocation and -free nodes in the graph (a third of the
// nodes of a small backward), each on the critical path of its branch. Instead, while a
// GraphPoolScope is open on the thread, every allocation on a stream that is being captured is
// served from a GraphMemoryPool: its blocks are cudaMalloc'd as the capture needs them (the
// thread's capture mode is relaxed for that one call), so the graph holds kernel nodes only.
// Inside the capture, a freed block is reused by a later allocation of the same size on the same
// capture stream when it was used on that stream only — stream order in the capture makes that an
// edge of the graph, as with the block cache (Note [Block cache]); a block another stream used is
// not reused by this graph. A later capture with the same pool (the same structure captured again
// to update its executable) takes the pool's blocks first, so an update keeps the graph's memory.
// The caller must order the launches of graphs that share a pool (BackwardGraph launches them on
// one stream, or waits for the last launch's). The pool belongs to the executable that was
// captured with it and frees its blocks when it dies (cudaFree waits for the device) — all but
// those a tensor made in the capture still holds (a StepGraph's loss, kept by the caller), each
// freed when its last tensor goes, as PyTorch's private pools keep only the blocks of live
// outputs. Its size is the graph's memory (GraphStats::memory_bytes).
#include <cstddef>
#include <memory>

#include "graphward/engine/runtime/device.h"

namespace graphward {

namespace detail {
struct GraphPoolState;
}

class GraphMemoryPool {
 public:
  explicit GraphMemoryPool(Device device);
  ~GraphMemoryPool();
  GraphMemoryPool(const GraphMemoryPool&) = delete;
  GraphMemoryPool& operator=(const GraphMemoryPool&) = delete;

  std::size_t bytes() const;   // memory the pool holds
  std::size_t blocks() const;  // blocks it holds

 private:
  friend class GraphPoolScope;
  std::shared_ptr<detail::GraphPoolState> state_;
};

namespace debug {
// The bytes every graph memory pool of the process holds now (blocks made and not yet freed).
std::size_t graph_pool_bytes();
}  // namespace debug

// For the scope, allocations of the calling thread on streams being captured are served by the
// pool (and nothing else of the thread's allocations). Scopes do not nest.
class GraphPoolScope {
 public:
  explicit GraphPoolScope(GraphMemoryPool& pool);
  ~GraphPoolScope();
  GraphPoolScope(const GraphPoolScope&) = delete;
  GraphPoolScope& operator=(const GraphPoolScope&) = delete;

 private:
  std::shared_ptr<detail::GraphPoolState> state_;
};

}  // namespace graphward
