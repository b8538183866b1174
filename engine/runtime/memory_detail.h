#pragma once
// Internal to runtime/ (not part of the public API): what the files that serve and free memory
// share — memory.cpp (Storage), allocation.cpp (host memory, the block cache, the CUDA pool),
// step_arena.cpp (Note [Step arena]) and graph_pool.cpp (Note [Graph memory pool]).
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/engine/runtime/step_arena.h"
#include "graphward/engine/runtime/stream.h"

namespace graphward {

namespace detail {

// ---- host memory (Note [Host memory], allocation.cpp)
inline constexpr std::size_t kHostAlignment = 64;
// Host memory for a CPU tensor or arena slot, counted and limited; throws OutOfMemoryError
// naming `what`.
void* host_alloc(std::size_t bytes, const char* what);
void host_free(void* p, std::size_t bytes) noexcept;

#if GRAPHWARD_HAS_CUDA
// ---- the block cache (Note [Block cache], engine/runtime/memory.h) and the CUDA pool
inline constexpr int kCacheDevices = 64;
inline constexpr std::size_t kBlockRound = 512;
// The size of the block that holds `bytes` (a multiple of kBlockRound).
inline std::size_t block_size(std::size_t bytes) {
  return (bytes + kBlockRound - 1) / kBlockRound * kBlockRound;
}
// Whether `stream` is being captured (true when that cannot be told: do not cache).
bool stream_capturing(cudaStream_t stream) noexcept;
// A cached block of exactly `bytes` for `stream`, or nullptr.
void* cache_take(int device, cudaStream_t stream, std::size_t bytes);
// Keeps a freed block; false if the cache declines it (full, shut down, or capturing).
// `not_capturing`: the caller has just asked CUDA that `stream` is not capturing, and the query is
// not made again.
bool cache_put(int device, cudaStream_t stream, std::size_t bytes, void* p,
               bool not_capturing = false) noexcept;
// Sets the device's CUDA pool to keep freed memory (once per device).
void configure_pool_once(int device);
// Note [Out of memory] (allocation.cpp): throws OutOfMemoryError for `bytes` needed by `what`.
[[noreturn]] void out_of_memory(Device device, std::size_t bytes, const char* what);
// cudaMallocAsync on `stream`, with Note [Out of memory]'s one retry outside a capture.
void* malloc_async(Device device, std::size_t bytes, cudaStream_t stream, bool capturing_here,
                   const char* what);
// The calling thread's open JoinedFrees scope (Note [Frees at the join]), or nullptr.
JoinedFrees*& current_joined_frees();
#endif

// ---- step arena (Note [Step arena], engine/runtime/step_arena.h)

struct ArenaSlot {
  void* ptr = nullptr;
  std::size_t bytes = 0;  // the block's size
  cudaStream_t stream = nullptr;
  bool in_use = false;
  bool orphan = false;  // no longer the arena's: the storage holding it frees it
#if GRAPHWARD_HAS_CUDA
  // Streams other than `stream` that used the memory before it was released, each with an event
  // recorded at release: the next user waits for them.
  std::vector<std::shared_ptr<const Event>> released_on;
#endif
};

struct ArenaState {
  explicit ArenaState(Device d) : device(d) {}
  std::mutex mutex;
  Device device;
  std::vector<std::shared_ptr<ArenaSlot>> slots;
  std::size_t cursor = 0;
  bool alive = true;
  StepArena::Stats stats;
#if GRAPHWARD_HAS_CUDA
  Event step_end;
  bool step_end_recorded = false;
  std::vector<cudaStream_t> waited;  // streams that waited on step_end in this step
  // Release events a stream waited on in this step: a slot's release events are often one event
  // that many slots share (a replayed backward's fence), waited on once a stream. The handles keep
  // each event from being recorded again (or its address reused) until the next step.
  std::vector<std::pair<std::shared_ptr<const Event>, cudaStream_t>> waited_events;
#endif
};

// The calling thread's arena (set by a StepScope), or null.
std::shared_ptr<ArenaState>& thread_step_arena();
// The slot serving the thread's next allocation of a block of `block` bytes on `stream` in its
// arena, or null (served elsewhere).
std::shared_ptr<ArenaSlot> arena_serve(ArenaState& st, std::size_t block, cudaStream_t stream);

// ---- graph memory pool (Note [Graph memory pool], engine/runtime/graph_pool.h)

struct GraphPoolState {
  explicit GraphPoolState(Device d) : device(d) {}
  std::mutex mutex;
  Device device;
  bool scoped = false;  // a GraphPoolScope is open: freed blocks may be reused
  std::vector<std::pair<void*, std::size_t>> blocks;  // every block and its size
  std::size_t bytes = 0;
  std::map<std::pair<cudaStream_t, std::size_t>, std::vector<void*>> free;  // reusable now
  std::map<std::size_t, std::vector<void*>> unused;  // not yet used by the capture in scope
  // Blocks a live storage holds (a tensor the graph made that outlived the capture: its loss),
  // and whether the pool's owner (the executable) is gone: then each block is freed once no
  // storage holds it — at once for the others — not when the last of them goes.
  std::unordered_set<void*> held;
  bool owner_gone = false;
  // Frees the blocks no storage holds (the owner is gone); the caller holds `mutex`.
  void free_unheld();
  ~GraphPoolState() { free_blocks(blocks); }
  // cudaFree each (it waits for the device), on the pool's device.
  void free_blocks(const std::vector<std::pair<void*, std::size_t>>& which) noexcept;
};

// The calling thread's pool (set by a GraphPoolScope), or null.
std::shared_ptr<GraphPoolState>& thread_graph_pool();
#if GRAPHWARD_HAS_CUDA
// A block of `bytes` for an allocation on `stream` (being captured) from the pool.
void* graph_pool_take(GraphPoolState& st, cudaStream_t stream, std::size_t bytes);
#endif

}  // namespace detail

}  // namespace graphward
