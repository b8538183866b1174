#include "graphward/engine/runtime/memory.h"

#include "graphward/engine/runtime/capture_mode.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graphward/base/env.h"
#include "graphward/base/error.h"
#include "graphward/engine/runtime/graph_pool.h"
#include "graphward/engine/runtime/memory_detail.h"
#include "graphward/engine/runtime/step_arena.h"

namespace graphward {

namespace debug {
namespace {
std::atomic<bool>& poison_flag() {
  static std::atomic<bool> flag{detail::env_switch("GRAPHWARD_POISON", false)};
  return flag;
}
}  // namespace
void set_poison_new_memory(bool on) {
  poison_flag().store(on);
}
bool poison_new_memory() {
  return poison_flag().load();
}
}  // namespace debug

namespace {
// The thread's step arena, graph memory pool and open JoinedFrees: read by every allocation and
// free here, set once a step by the scopes in step_arena.cpp, graph_pool.cpp and allocation.cpp
// through the accessors below.
thread_local std::shared_ptr<detail::ArenaState> t_step_arena;
thread_local std::shared_ptr<detail::GraphPoolState> t_graph_pool;
#if GRAPHWARD_HAS_CUDA
thread_local detail::JoinedFrees* t_joined_frees = nullptr;  // Note [Frees at the join]
#endif
std::atomic<std::uint64_t> g_tape_mutations{0};
}  // namespace

std::atomic<std::uint64_t>& detail::tape_mutations() {
  return g_tape_mutations;
}

std::shared_ptr<detail::ArenaState>& detail::thread_step_arena() {
  return t_step_arena;
}
std::shared_ptr<detail::GraphPoolState>& detail::thread_graph_pool() {
  return t_graph_pool;
}
#if GRAPHWARD_HAS_CUDA
detail::JoinedFrees*& detail::current_joined_frees() {
  return t_joined_frees;
}
#endif

// ---- DeviceBuffer -------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(Device device, std::size_t bytes) : bytes_(bytes), device_(device) {
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(device);
  if (bytes > 0) GW_CUDA_CHECK(cudaMalloc(&data_, bytes));
#else
  GW_CHECK(false, "DeviceBuffer: graphward was built without CUDA");
#endif
}

DeviceBuffer::~DeviceBuffer() {
  reset();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
#if GRAPHWARD_HAS_CUDA
  if (data_) GW_CUDA_CHECK_NOTHROW(cudaFree(data_));  // cudaFree waits for the device
#endif
  data_ = nullptr;
  bytes_ = 0;
}

// ---- Storage ------------------------------------------------------------------------------------

bool Storage::release_to_arena() noexcept {
  try {
    std::lock_guard<std::mutex> lock(arena_->mutex);
    if (!arena_->alive || slot_->orphan) return false;
#if GRAPHWARD_HAS_CUDA
    // Rule [reuse after use] across steps: the next user waits for them.
    for (cudaStream_t s : other_streams_) {
      auto ev = std::make_shared<Event>(Event::pooled(device_));  // Note [Event pool]
      ev->record(s);
      slot_->released_on.push_back(std::move(ev));
    }
    for (auto& [s, ev] : fences_) slot_->released_on.push_back(std::move(ev));
#endif
    slot_->in_use = false;
    return true;
  } catch (const std::exception& e) {
    // Could not record the release: keep the slot marked in use (never reused) rather than risk it.
    detail::log_error(__FILE__, __LINE__, e.what());
    return true;
  }
}

Storage::Storage(Device device, void* data, std::size_t bytes, cudaStream_t stream)
    : device_(device), data_(data), bytes_(bytes), alloc_stream_(stream), producer_(stream) {}

std::shared_ptr<Storage> Storage::allocate_cpu(std::size_t bytes) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + detail::kHostAlignment - 1) /
                              detail::kHostAlignment * detail::kHostAlignment;
  const std::shared_ptr<detail::ArenaState>& arena = t_step_arena;
  if (arena && arena->device.is_cpu()) {  // Note [Step arena]
    std::shared_ptr<detail::ArenaSlot> slot = detail::arena_serve(*arena, rounded, nullptr);
    if (slot) {
      if (debug::poison_new_memory()) std::memset(slot->ptr, 0xFF, rounded);
      std::shared_ptr<Storage> storage(new Storage(Device::cpu(), slot->ptr, bytes, nullptr));
      storage->slot_ = std::move(slot);
      storage->arena_ = arena;
      storage->block_bytes_ = rounded;
      return storage;
    }
  }
  void* p = detail::host_alloc(rounded, "a tensor");
  std::shared_ptr<Storage> storage;
  try {
    storage.reset(new Storage(Device::cpu(), p, bytes, nullptr));
  } catch (...) {
    detail::host_free(p, rounded);
    throw;
  }
  storage->block_bytes_ = rounded;
  if (debug::poison_new_memory()) std::memset(p, 0xFF, rounded);
  return storage;
}

std::shared_ptr<Storage> Storage::borrow(Device device, void* data, std::size_t bytes,
                                         cudaStream_t stream, std::shared_ptr<const void> owner) {
  GW_CHECK(device.is_cuda() && data && stream && owner,
           "Storage::borrow: expected CUDA memory, its stream and its owner; got ", device.str(),
           data ? "" : ", no memory", stream ? "" : ", no stream", owner ? "" : ", no owner");
  std::shared_ptr<Storage> storage(new Storage(device, data, bytes, stream));
  storage->owner_ = std::move(owner);
  storage->block_bytes_ = bytes;
  return storage;
}

std::shared_ptr<Storage> Storage::borrow(Device device, void* data, std::size_t bytes,
                                         cudaStream_t stream, std::shared_ptr<Storage> owner) {
  Storage* const raw = owner.get();
  std::shared_ptr<Storage> storage =
      borrow(device, data, bytes, stream, std::shared_ptr<const void>(std::move(owner)));
  storage->owner_storage_ = raw;
  return storage;
}

std::shared_ptr<Storage> Storage::adopt(Device device, void* data, std::size_t bytes,
                                        cudaStream_t stream, std::shared_ptr<const void> owner) {
  GW_CHECK(data && owner && (device.is_cpu() || stream),
           "Storage::adopt: expected memory, its owner and (for CUDA) its stream; got ",
           device.str(), data ? "" : ", no memory", owner ? "" : ", no owner",
           device.is_cuda() && !stream ? ", no stream" : "");
  std::shared_ptr<Storage> storage(
      new Storage(device, data, bytes, device.is_cpu() ? nullptr : stream));
  storage->owner_ = std::move(owner);
  storage->block_bytes_ = bytes;
  storage->release_in_order_ = true;
  return storage;
}

std::shared_ptr<Storage> Storage::allocate(Device device, std::size_t bytes, cudaStream_t stream) {
  if (device.is_cpu()) return allocate_cpu(bytes);
#if GRAPHWARD_HAS_CUDA
  check_cuda_device(device, "Storage::allocate");
  GW_CHECK(stream != nullptr, "Storage::allocate: expected a stream for ", device.str());
  GW_CHECK(device.index < detail::kCacheDevices, "Storage::allocate: device index ", device.index,
           " exceeds graphward's limit of ", detail::kCacheDevices, " devices");
  DeviceGuard guard(device);
  void* p = nullptr;
  const std::size_t block = detail::block_size(bytes);
  const bool capturing_here = detail::stream_capturing(stream);
  if (!capturing_here) detail::release_deferred_storage();  // Note [Frees during a capture]
  // Note [Graph memory pool]: a stream being captured, with a pool in scope.
  const std::shared_ptr<detail::GraphPoolState>& pool = t_graph_pool;
  if (pool && pool->device == device && bytes > 0 && capturing_here) {
    p = detail::graph_pool_take(*pool, stream, block);
    std::shared_ptr<Storage> storage(new Storage(device, p, bytes, stream));  // owns nothing yet
    storage->graph_pool_ = pool;
    storage->block_bytes_ = block;
    if (debug::poison_new_memory()) GW_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, block, stream));
    return storage;
  }
  // Note [Step arena]: inside a step, outside a capture.
  const std::shared_ptr<detail::ArenaState>& arena = t_step_arena;
  if (arena && arena->device == device && bytes > 0 && !capturing_here) {
    std::shared_ptr<detail::ArenaSlot> slot = detail::arena_serve(*arena, block, stream);
    if (slot) {
      if (debug::poison_new_memory())
        GW_CUDA_CHECK(cudaMemsetAsync(slot->ptr, 0xFF, block, stream));
      std::shared_ptr<Storage> storage(new Storage(device, slot->ptr, bytes, stream));
      storage->slot_ = std::move(slot);
      storage->arena_ = arena;
      storage->block_bytes_ = block;
      return storage;
    }
  }
  // Note [Block cache]: graphward's own streams, outside a capture, with the cache on.
  const bool cacheable =
      bytes > 0 && block_cache_limit() > 0 && is_graphward_stream(stream) && !capturing_here;
  if (bytes > 0) {
    if (cacheable) p = detail::cache_take(device.index, stream, block);
    if (!p) {
      // Not inside a capture, where setting a pool attribute is refused: the first eager
      // allocation does it.
      if (!capturing_here) detail::configure_pool_once(device.index);
      p = detail::malloc_async(device, block, stream, capturing_here,
                               capturing_here ? "an allocation inside the capture" : "a tensor");
    }
    if (debug::poison_new_memory()) {
      const cudaError_t err = cudaMemsetAsync(p, 0xFF, block, stream);
      if (err != cudaSuccess) {
        GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(p, stream));
        GW_CUDA_CHECK(err);
      }
    }
  }
  std::shared_ptr<Storage> storage;
  try {
    storage.reset(new Storage(device, p, bytes, stream));
  } catch (...) {
    if (p) GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(p, stream));
    throw;
  }
  storage->block_bytes_ = block;
  storage->cacheable_ = cacheable;
  storage->graph_allocation_ = capturing_here && bytes > 0;
  return storage;
#else
  (void)bytes, (void)stream;
  GW_CHECK(false, "Storage::allocate: cannot allocate on ", device.str(),
           ": graphward was built without CUDA");
  return nullptr;
#endif
}

// Note [Frees during a capture]
// A stream being captured can take neither a free of memory allocated outside the graph
// (cudaFreeAsync there makes a free node, which only takes graph allocations: the block leaks)
// nor the event waits of rule [reuse after use] (they would become graph nodes, not orderings of
// real work). Yet a tensor made eagerly can die inside a capture: the previous step's tape, dropped
// while a StepGraph captures the next. Its block, and what orders its release (the streams that
// used it, its fences, its arena slot), then move to a new Storage on a deferred list; that one is
// released by the usual rules (cache, arena, or pool) once none of its streams is capturing: at
// the end of each graphward capture (capture_stream), at the next allocation made outside a
// capture, or by empty_cache. Graph-pool storage is not deferred: it is the capture's own; nor is
// memory allocated inside the capture (an allocation node's), which a free node must release.
namespace {
struct DeferredList {
  std::mutex mutex;
  std::vector<std::unique_ptr<Storage>> storage;
  std::atomic<std::size_t> count{0};
};
DeferredList& deferred_list() {
  static DeferredList* list = new DeferredList();  // never destroyed: frees may come at exit
  return *list;
}
}  // namespace

bool Storage::capturing_a_user() const noexcept {
#if GRAPHWARD_HAS_CUDA
  // An error (a user's raw stream destroyed before the tensor) counts as not capturing: the
  // release below then reports it, rather than deferring a block forever.
  const auto capturing = [](cudaStream_t s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return status != cudaStreamCaptureStatusNone;
  };
  if (capturing(alloc_stream_)) return true;
  for (cudaStream_t s : other_streams_) {
    if (capturing(s)) return true;
  }
#endif
  return false;
}

bool Storage::defer_release() noexcept {
  try {
    DeferredList& list = deferred_list();
    std::unique_ptr<Storage> heir(new Storage(device_, data_, bytes_, alloc_stream_));
    std::lock_guard<std::mutex> lock(list.mutex);
    list.storage.reserve(list.storage.size() + 1);  // the push below cannot throw
    heir->block_bytes_ = block_bytes_;
    heir->cacheable_ = cacheable_;
    heir->slot_ = std::move(slot_);
    heir->arena_ = std::move(arena_);
    heir->other_streams_ = std::move(other_streams_);
    heir->fences_ = std::move(fences_);
    heir->owner_ = std::move(owner_);  // Note [Adopted storage]: let go once ordered
    heir->release_in_order_ = release_in_order_;
    list.storage.push_back(std::move(heir));
    list.count.fetch_add(1, std::memory_order_release);
    data_ = nullptr;
    return true;
  } catch (...) {
    return false;
  }
}

std::size_t detail::release_deferred_storage() noexcept {
  DeferredList& list = deferred_list();
  if (list.count.load(std::memory_order_acquire) == 0) return 0;
  std::vector<std::unique_ptr<Storage>> ready;
  std::size_t left = 0;
  try {
    std::lock_guard<std::mutex> lock(list.mutex);
    auto keep = list.storage.begin();
    for (auto& s : list.storage) {
      if (s->capturing_a_user()) {
        *keep++ = std::move(s);
      } else {
        ready.push_back(std::move(s));
      }
    }
    list.storage.erase(keep, list.storage.end());
    left = list.storage.size();
    list.count.store(left, std::memory_order_release);
  } catch (...) {
    detail::log_error(__FILE__, __LINE__, "Storage: could not release deferred blocks");
  }
  ready.clear();  // outside the lock: each destructor may defer again
  return left;
}

Storage::~Storage() {
  try {
    settle();  // Note [Reads of a replayed step]: the free waits for the graph's read too
  } catch (const std::exception& e) {
    // Out of host memory: the free cannot be ordered after the read; keep the memory.
    detail::log_error(
        __FILE__, __LINE__,
        std::string("Storage: ") + e.what() + " (a block read by a replayed graph is kept)");
    return;
  }
  // Note [Frees during a capture]
  if ((!owner_ || release_in_order_) && !graph_pool_ && !graph_allocation_ && data_ &&
      !device_.is_cpu() && capturing_a_user() && defer_release()) {
    return;
  }
  if (owner_) {  // Note [Borrowed storage]: the owner frees the memory
#if GRAPHWARD_HAS_CUDA
    // Note [Adopted storage]: once its stream is ordered after every user; if it cannot be, the
    // owner is kept (never let go) rather than risk reuse under work still running.
    // Note [Borrowed storage]: a view into a Storage orders its owner's free after its own uses
    // (it went back to the cache under a read on another stream that had not run yet).
    if ((release_in_order_ || owner_storage_) && !device_.is_cpu() && data_) {
      const int saved_device = [] {
        int d = 0;
        return cudaGetDevice(&d) == cudaSuccess ? d : -1;
      }();
      if (saved_device != device_.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(device_.index));
      if (!order_after_users()) {
        new std::shared_ptr<const void>(std::move(owner_));
      } else if (owner_storage_) {
        try {
          owner_storage_->record_use(alloc_stream_, false);
        } catch (const std::exception& e) {
          detail::log_error(__FILE__, __LINE__, e.what());
          new std::shared_ptr<const void>(std::move(owner_));  // kept rather than reused early
        }
      }
      if (saved_device >= 0 && saved_device != device_.index) {
        GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved_device));
      }
    }
#endif
    return;
  }
  if (slot_ && release_to_arena()) return;  // the arena keeps the memory (Note [Step arena])
  if (graph_pool_) {                        // the pool keeps the memory (Note [Graph memory pool])
    try {
      std::lock_guard<std::mutex> lock(graph_pool_->mutex);
      graph_pool_->held.erase(data_);
      if (graph_pool_->owner_gone && !capturing_a_user()) {
        graph_pool_->free_unheld();  // its executable is gone: the block goes now
      } else if (graph_pool_->scoped && other_streams_.empty() && fences_.empty()) {
        graph_pool_->free[{alloc_stream_, block_bytes_}].push_back(data_);
      }
    } catch (...) {
      // not reused: the block stays the pool's
    }
    return;
  }
  if (device_.is_cpu()) {
    detail::host_free(data_, block_bytes_);
    return;
  }
#if GRAPHWARD_HAS_CUDA
  if (!data_) return;
  // Note [Frees at the join]: a block that several of an eager backward's streams used waits for
  // the join instead.
  detail::JoinedFrees* joined = t_joined_frees;
  if (cacheable_ && joined && (!other_streams_.empty() || !fences_.empty()) &&
      joined->take(*this)) {
    return;
  }
  const int saved_device = [] {
    int d = 0;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
  }();
  if (saved_device != device_.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(device_.index));
  if (!order_after_users()) {
    if (saved_device >= 0 && saved_device != device_.index) {
      GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved_device));
    }
    return;  // the block is kept
  }
  // Note [Block cache]: with those waits on alloc_stream_, every later use of the block on it is
  // ordered after all of its uses, as for a block used on its own stream only: into the cache.
  if (cacheable_ && detail::cache_put(device_.index, alloc_stream_, block_bytes_, data_)) {
    if (saved_device >= 0 && saved_device != device_.index) {
      GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved_device));
    }
    return;
  }
  GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(data_, alloc_stream_));
  if (saved_device >= 0 && saved_device != device_.index) {
    GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved_device));
  }
#endif
}

bool Storage::order_after_users() noexcept {
#if GRAPHWARD_HAS_CUDA
  // Rule [reuse after use]: the block may be handed out on alloc_stream_ only after every other
  // stream that used it has finished with it: alloc_stream_ waits for each (Note [Event pool]: one
  // pooled event, handed back once the wait is enqueued).
  bool ordered = true;
  if (!other_streams_.empty()) {
    cudaEvent_t ev = nullptr;
    try {
      ev = detail::take_pooled_event(device_);
    } catch (const std::exception& e) {
      detail::log_error(__FILE__, __LINE__, e.what());
    }
    if (!ev) {
      // Cannot order the free after those streams' work: keep the memory rather than risk reuse
      // (after a kernel fault the context is lost anyway: reported once, Note [Kernel faults]).
      detail::log_error(__FILE__, __LINE__,
                        "Storage: no event to order a free by (a block is kept)");
      return false;
    }
    for (cudaStream_t s : other_streams_) {
      ordered = ordered && cudaEventRecord(ev, s) == cudaSuccess &&
                cudaStreamWaitEvent(alloc_stream_, ev, 0) == cudaSuccess;
    }
    detail::give_pooled_event(device_, ev);
  }
  for (const auto& [s, ev] : fences_) {
    ordered = ordered && cudaStreamWaitEvent(alloc_stream_, ev->get(), 0) == cudaSuccess;
  }
  if (!ordered) {
    (void)cudaGetLastError();
    detail::log_error(__FILE__, __LINE__,
                      "Storage: a free could not be ordered after the streams "
                      "that used the memory (a block is kept)");
  }
  return ordered;
#else
  return true;
#endif
}

void Storage::note_step_save(const std::shared_ptr<detail::StepReads>& step) const {
  if (step_reads_ == step) {
    ++step_saves_;
    return;
  }
  settle();
  // A step not replayed yet loses track of this storage: its replay goes node by node.
  if (step_reads_) step_reads_->lost = true;
  step_reads_ = step;
  step_saves_ = 1;
  if (!step->any_saved) {
    step->any_saved = true;
    step->alloc_stream = alloc_stream_;
  } else if (step->alloc_stream != alloc_stream_) {
    step->mixed_streams = true;
  }
}

void Storage::forget_step_save(const detail::StepReads* step) const {
  if (step_reads_.get() == step && step_saves_ > 0) --step_saves_;
}

void Storage::settle_step_reads() const {
  // Storage objects are only ever made by allocate() and borrow(), never const: the pending read
  // is bookkeeping the const queries apply before they answer.
  Storage& self = const_cast<Storage&>(*this);
  const detail::StepReads& step = *step_reads_;
  if (step.fence) self.add_read(step.stream, step.fence);    // may throw: nothing changed then
  saves_.fetch_sub(step_saves_, std::memory_order_relaxed);  // the step's nodes are released
  step_saves_ = 0;
  step_reads_.reset();
}

void Storage::settle_graph_writes() const {
  // As settle_step_reads: bookkeeping the const queries apply before they answer.
  Storage& self = const_cast<Storage&>(*this);
  graph_writes_seen_ = graph_writes_->epoch.load(std::memory_order_acquire);
  self.record_use(graph_writes_->stream.load(std::memory_order_relaxed), /*wrote=*/true);
}

void Storage::follow_graph_writes(std::shared_ptr<detail::GraphWrites> writes) {
  settle();  // what the one it followed wrote, first
  if (graph_writes_ && graph_writes_ != writes) {
    graph_writes_->abandoned.store(true, std::memory_order_release);
  }
  graph_writes_seen_ = writes->epoch.load(std::memory_order_acquire);
  graph_writes_ = std::move(writes);
}

void Storage::bump_version() {
  settle();
  ++version_;
  if (saves_.load(std::memory_order_relaxed) > 0) {
    detail::tape_mutations().fetch_add(1, std::memory_order_acq_rel);
  }
}

}  // namespace graphward
