#include "engine/memory.h"

#include "engine/capture_mode.h"

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

#include "base/error.h"
#include "engine/graph_pool.h"
#include "engine/deferred_release.h"
#include "engine/step_arena.h"
#include "engine/tape_log.h"

namespace graphward {

namespace debug {
namespace {
std::atomic<bool>& poison_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("GRAPHWARD_POISON");
    return env && std::strcmp(env, "0") != 0 && *env != '\0';
  }()};
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
thread_local bool t_planned_sync = false;
#if GRAPHWARD_HAS_CUDA
thread_local detail::JoinedFrees* t_joined_frees = nullptr;  // Note [Frees at the join]
#endif
}
PlannedSyncScope::PlannedSyncScope() : previous_(t_planned_sync) {
  t_planned_sync = true;
}
PlannedSyncScope::~PlannedSyncScope() {
  t_planned_sync = previous_;
}

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

namespace {
constexpr std::size_t kHostAlignment = 64;

// Note [Host memory]
// CPU tensors' memory comes from host_alloc and goes back through host_free, which count what
// graphward holds (host_bytes_in_use) and keep it within set_host_memory_limit. An allocation the
// limit or the system refuses throws OutOfMemoryError, as a device's does, saying what needed how
// much: never std::bad_alloc, and nothing is half-made.
std::atomic<std::size_t> g_host_bytes{0};
std::atomic<std::size_t> g_host_peak{0};
std::atomic<std::size_t> g_host_limit{SIZE_MAX};

void* host_alloc(std::size_t bytes, const char* what) {
  const std::size_t limit = g_host_limit.load(std::memory_order_relaxed);
  const std::size_t held = g_host_bytes.fetch_add(bytes, std::memory_order_relaxed);
  void* p = nullptr;
  if (held <= limit && bytes <= limit - held) p = std::aligned_alloc(kHostAlignment, bytes);
  if (p) {
    const std::size_t now = held + bytes;
    std::size_t peak = g_host_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_host_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  } else {
    g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    throw OutOfMemoryError(detail::concat(
        "graphward: out of host memory: ", what, " needed ", bytes, " bytes; graphward holds ",
        held, " bytes of host memory",
        limit == SIZE_MAX ? std::string(" and the system refused more")
                          : detail::concat(" (limit ", limit, " bytes: set_host_memory_limit)"),
        ". Expected: less memory in use — free the tensors you keep, or use a smaller batch"));
  }
  return p;
}

void host_free(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  std::free(p);
  g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

#if GRAPHWARD_HAS_CUDA
// ---- the block cache (Note [Block cache]) ----
constexpr int kCacheDevices = 64;
constexpr std::size_t kBlockRound = 512;
std::atomic<std::size_t> g_cache_limit{std::size_t{4} << 30};

std::size_t block_size(std::size_t bytes) {
  return (bytes + kBlockRound - 1) / kBlockRound * kBlockRound;
}

struct CacheKey {
  cudaStream_t stream;
  std::size_t bytes;
  bool operator==(const CacheKey&) const = default;
};
struct CacheKeyHash {
  std::size_t operator()(const CacheKey& k) const noexcept {
    return std::hash<const void*>()(k.stream) * 1000003u ^ std::hash<std::size_t>()(k.bytes);
  }
};
struct DeviceCache {
  std::mutex mutex;
  std::unordered_map<CacheKey, std::vector<void*>, CacheKeyHash> blocks;
  std::size_t bytes = 0;
};

// Never destroyed (tensors that outlive main may still free into it); its blocks go back to the
// pool at exit from an atexit handler registered on first use, which runs before the CUDA runtime's
// own teardown (registered earlier, at the runtime's initialization). After that, frees bypass it.
struct BlockCache {
  std::array<DeviceCache, kCacheDevices> devices;
  std::atomic<bool> shut_down{false};
};
void release_cached_blocks(int device, DeviceCache& dc, bool shutting_down = false) noexcept;
BlockCache& block_cache() {
  static BlockCache* cache = [] {
    auto* c = new BlockCache();
    std::atexit([] {
      BlockCache& bc = block_cache();
      bc.shut_down.store(true);
      for (int d = 0; d < kCacheDevices; ++d) release_cached_blocks(d, bc.devices[d], true);
    });
    return c;
  }();
  return *cache;
}

void release_cached_blocks(int device, DeviceCache& dc, bool shutting_down) noexcept {
  try {
    std::unordered_map<CacheKey, std::vector<void*>, CacheKeyHash> blocks;
    {
      std::lock_guard<std::mutex> lock(dc.mutex);
      blocks.swap(dc.blocks);
      dc.bytes = 0;
    }
    if (blocks.empty()) return;
    int saved = -1;
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    if (saved != device) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(device));
    for (const auto& [key, ptrs] : blocks) {
      for (void* p : ptrs) GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(p, key.stream));
    }
    // At exit: the frees done before the runtime's teardown, not left queued on their streams.
    if (shutting_down) GW_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
    if (saved >= 0 && saved != device) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved));
  } catch (...) {
    detail::log_error(__FILE__, __LINE__, "block cache: could not release cached blocks");
  }
}

bool stream_capturing(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: do not cache
  }
  return status != cudaStreamCaptureStatusNone;
}

// A cached block of exactly `bytes` for `stream`, or nullptr.
void* cache_take(int device, cudaStream_t stream, std::size_t bytes) {
  DeviceCache& dc = block_cache().devices[device];
  std::lock_guard<std::mutex> lock(dc.mutex);
  auto it = dc.blocks.find({stream, bytes});
  if (it == dc.blocks.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  dc.bytes -= bytes;
  return p;
}

// Keeps a freed block; false if the cache declines it (full, shut down, or capturing).
bool cache_put(int device, cudaStream_t stream, std::size_t bytes, void* p) noexcept {
  try {
    BlockCache& bc = block_cache();
    if (bc.shut_down.load() || stream_capturing(stream)) return false;
    DeviceCache& dc = bc.devices[device];
    std::lock_guard<std::mutex> lock(dc.mutex);
    if (dc.bytes + bytes > g_cache_limit.load(std::memory_order_relaxed)) return false;
    dc.blocks[{stream, bytes}].push_back(p);
    dc.bytes += bytes;
    return true;
  } catch (...) {
    return false;  // e.g. out of host memory: the block goes back to the pool instead
  }
}
#endif

#if GRAPHWARD_HAS_CUDA
// Keep freed memory in the device's pool instead of returning it to the OS at every
// synchronization (the default threshold of 0 would make each step re-map its memory).
void configure_pool_once(int device) {
  static std::atomic<std::uint64_t> configured{0};  // bit per device (first 64)
  const std::uint64_t bit = 1ull << (device & 63);
  if (configured.load(std::memory_order_acquire) & bit) return;
  cudaMemPool_t pool = nullptr;
  GW_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t threshold = UINT64_MAX;
  GW_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  configured.fetch_or(bit, std::memory_order_acq_rel);
}

// Note [Out of memory]
// An allocation the device cannot serve throws OutOfMemoryError (base/error.h) saying what
// needed how much, what the device has free, what graphward's block cache holds, and — inside a
// capture — which capture; nothing is half-made (a capture that needed it is abandoned by
// capture_stream, its pool freed with it). Before giving up, an eager allocation returns the
// block cache and the CUDA pool's unused memory to the device and tries once more: that path
// synchronizes the device, and is taken only when the device is already out of memory. Inside a
// capture nothing can be returned (a free there would become a graph node): call empty_cache()
// before the capture, or need less.
std::string mib(std::size_t bytes) {
  return detail::concat(static_cast<double>(bytes) / (1024.0 * 1024.0), " MiB");
}

[[noreturn]] void out_of_memory(Device device, std::size_t bytes, const char* what) {
  (void)cudaGetLastError();  // not sticky: clear it for later launch checks
  std::size_t free_bytes = 0, total_bytes = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // legal inside a capture
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  const bool info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  if (exchanged) (void)cudaThreadExchangeStreamCaptureMode(&mode);
  (void)cudaGetLastError();
  const std::string* capture = capture_name();
  throw OutOfMemoryError(detail::concat(
      "graphward: out of memory on ", device.str(), ": ", what, " needed ", mib(bytes),
      capture ? detail::concat(" while capturing ", *capture, " (the capture was abandoned)")
              : std::string(),
      info ? detail::concat("; the device has ", mib(free_bytes), " free of ", mib(total_bytes))
           : std::string(),
      ", graphward's block cache holds ", mib(cached_bytes(device)),
      ". Expected: less memory in use — free the tensors you keep, call empty_cache(", device.str(),
      ")", capture ? " before the capture" : "", ", or use a smaller batch"));
}

// cudaMallocAsync on `stream`, with Note [Out of memory]'s one retry outside a capture.
void* malloc_async(Device device, std::size_t bytes, cudaStream_t stream, bool capturing_here,
                   const char* what) {
  void* p = nullptr;
  cudaError_t err = cudaMallocAsync(&p, bytes, stream);
  if (err == cudaErrorMemoryAllocation && !capturing_here) {
    (void)cudaGetLastError();
    empty_cache(device);
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    cudaMemPool_t pool = nullptr;
    GW_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device.index));
    GW_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    err = cudaMallocAsync(&p, bytes, stream);
  }
  if (err == cudaErrorMemoryAllocation) out_of_memory(device, bytes, what);
  GW_CUDA_CHECK(err);
  return p;
}
#endif
}  // namespace

// ---- step arena (Note [Step arena]) -----------------------------------------------------------

namespace detail {

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

}  // namespace detail

namespace {

thread_local std::shared_ptr<detail::ArenaState> t_step_arena;

// Frees a slot's memory now (the slot is not in use). Errors are logged: called from destructors.
void free_slot_memory(Device device, detail::ArenaSlot& slot) noexcept {
  if (!slot.ptr) return;
  if (device.is_cpu()) {
    host_free(slot.ptr, slot.bytes);
  } else {
#if GRAPHWARD_HAS_CUDA
    try {
      DeviceGuard guard(device);
      for (const auto& ev : slot.released_on) ev->block(slot.stream);  // rule 7
      GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(slot.ptr, slot.stream));
    } catch (const std::exception& e) {
      detail::log_error(__FILE__, __LINE__, e.what());
    }
#endif
  }
  slot.ptr = nullptr;
}

// Drops the slots from `from` on: free ones are freed, held ones become their storage's to free.
void drop_slots(detail::ArenaState& st, std::size_t from) noexcept {
  for (std::size_t i = from; i < st.slots.size(); ++i) {
    detail::ArenaSlot& slot = *st.slots[i];
    st.stats.bytes -= slot.bytes;
    if (slot.in_use) {
      slot.orphan = true;
    } else {
      free_slot_memory(st.device, slot);
    }
  }
  st.slots.resize(std::min(from, st.slots.size()));
  st.stats.slots = st.slots.size();
}

// The slot for the next allocation of the step (`block` bytes on `stream`), in use and ordered
// after its earlier users on the GPU; nullptr when this allocation must be served fresh (its slot
// is still held). Records a new slot past the end.
std::shared_ptr<detail::ArenaSlot> arena_serve(detail::ArenaState& st, std::size_t block,
                                               cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(st.mutex);
  if (st.cursor < st.slots.size()) {
    const std::shared_ptr<detail::ArenaSlot>& slot = st.slots[st.cursor];
    if (slot->bytes == block && slot->stream == stream) {
      ++st.cursor;
      if (slot->in_use) {  // a tensor of an earlier step still holds it
        ++st.stats.held;
        return nullptr;
      }
#if GRAPHWARD_HAS_CUDA
      if (!st.device.is_cpu()) {
        if (st.step_end_recorded &&
            std::find(st.waited.begin(), st.waited.end(), stream) == st.waited.end()) {
          st.step_end.block(stream);
          st.waited.push_back(stream);
        }
        for (auto& ev : slot->released_on) {
          const bool seen = std::any_of(st.waited_events.begin(), st.waited_events.end(),
                                        [&](const auto& w) { return w.first == ev && w.second == stream; });
          if (seen) continue;
          ev->block(stream);
          st.waited_events.emplace_back(std::move(ev), stream);
        }
        slot->released_on.clear();
      }
#endif
      slot->in_use = true;
      ++st.stats.served;
      return slot;
    }
    drop_slots(st, st.cursor);  // the step diverged: record the rest anew
    ++st.stats.rerecords;
  }
  auto slot = std::make_shared<detail::ArenaSlot>();
  slot->bytes = block;
  slot->stream = stream;
  if (st.device.is_cpu()) {
    slot->ptr = host_alloc(block, "a step-arena slot");
  } else {
#if GRAPHWARD_HAS_CUDA
    configure_pool_once(st.device.index);
    slot->ptr = malloc_async(st.device, block, stream, false, "a step-arena slot");
#endif
  }
  slot->in_use = true;
  st.slots.push_back(slot);
  st.cursor = st.slots.size();
  st.stats.slots = st.slots.size();
  st.stats.bytes += block;
  ++st.stats.recorded;
  return slot;
}

}  // namespace

StepArena::StepArena(Device device) : state_(std::make_shared<detail::ArenaState>(device)) {
  if (device.is_cuda()) check_cuda_device(device, "StepArena");
}

StepArena::~StepArena() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->alive = false;
  drop_slots(*state_, 0);
}

Device StepArena::device() const {
  return state_->device;
}

StepArena::Stats StepArena::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

void StepArena::record_step_end(cudaStream_t stream) {
  if (state_->device.is_cpu()) return;
#if GRAPHWARD_HAS_CUDA
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->step_end.valid()) state_->step_end = Event(state_->device);
  state_->step_end.record(stream);
  state_->step_end_recorded = true;
#else
  (void)stream;
#endif
}

StepScope::StepScope(StepArena& arena) : state_(arena.state_) {
  GW_CHECK(!t_step_arena, "StepScope: a step is already open on this thread; steps do not nest");
  // Note [Deferred release]: the last step's saved tensors are back in the arena before its slots
  // are matched.
  detail::wait_for_releases();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->cursor = 0;
#if GRAPHWARD_HAS_CUDA
    state_->waited.clear();
    state_->waited_events.clear();
#endif
    ++state_->stats.steps;
  }
  t_step_arena = state_;
  detail::tape_log_reset();  // Note [Tape log]: the step's tape starts here
}

StepScope::~StepScope() {
  t_step_arena.reset();
}

// ---- graph memory pool (Note [Graph memory pool]) ----------------------------------------------

namespace detail {

struct GraphPoolState {
  explicit GraphPoolState(Device d) : device(d) {}
  std::mutex mutex;
  Device device;
  bool scoped = false;  // a GraphPoolScope is open: freed blocks may be reused
  std::vector<std::pair<void*, std::size_t>> blocks;  // every block and its size
  std::size_t bytes = 0;
  std::map<std::pair<cudaStream_t, std::size_t>, std::vector<void*>> free;  // reusable now
  std::map<std::size_t, std::vector<void*>> unused;  // not yet used by the capture in scope
  ~GraphPoolState() {
#if GRAPHWARD_HAS_CUDA
    if (blocks.empty()) return;
    int saved = -1;
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    if (saved != device.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(device.index));
    for (const auto& [p, n] : blocks) GW_CUDA_CHECK_NOTHROW(cudaFree(p));  // waits for the device
    if (saved >= 0 && saved != device.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(saved));
#endif
  }
};

}  // namespace detail

namespace {

thread_local std::shared_ptr<detail::GraphPoolState> t_graph_pool;

#if GRAPHWARD_HAS_CUDA
// A block of `bytes` for an allocation on `stream` (being captured) from the pool: a reusable one,
// or a new one made with cudaMalloc under a relaxed capture mode.
void* graph_pool_take(detail::GraphPoolState& st, cudaStream_t stream, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(st.mutex);
  auto it = st.free.find({stream, bytes});
  if (it != st.free.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  auto un = st.unused.find(bytes);  // a block an earlier capture with this pool used
  if (un != st.unused.end() && !un->second.empty()) {
    void* p = un->second.back();
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
    out_of_memory(st.device, bytes, "a block of the graph's memory pool (its intermediates)");
  }
  GW_CUDA_CHECK(err);
  try {
    st.blocks.emplace_back(p, bytes);
  } catch (...) {
    GW_CUDA_CHECK_NOTHROW(cudaFree(p));
    throw;
  }
  st.bytes += bytes;
  return p;
}
#endif

}  // namespace

GraphMemoryPool::GraphMemoryPool(Device device)
    : state_(std::make_shared<detail::GraphPoolState>(device)) {
  GW_CHECK(device.is_cuda(), "GraphMemoryPool: expected a CUDA device, got ", device.str());
  check_cuda_device(device, "GraphMemoryPool");
}

GraphMemoryPool::~GraphMemoryPool() = default;  // blocks go with the last storage holding them

std::size_t GraphMemoryPool::bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->bytes;
}

std::size_t GraphMemoryPool::blocks() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->blocks.size();
}

GraphPoolScope::GraphPoolScope(GraphMemoryPool& pool) : state_(pool.state_) {
  GW_CHECK(!t_graph_pool, "GraphPoolScope: a graph memory pool is already in use on this thread");
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->scoped = true;
  state_->unused.clear();  // a new capture: every block is free for it
  for (const auto& [p, n] : state_->blocks) state_->unused[n].push_back(p);
  t_graph_pool = state_;
}

GraphPoolScope::~GraphPoolScope() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->scoped = false;
  state_->free.clear();  // the graph is made: nothing is reused any more
  state_->unused.clear();
  t_graph_pool.reset();
}

bool Storage::release_to_arena() noexcept {
  try {
    std::lock_guard<std::mutex> lock(arena_->mutex);
    if (!arena_->alive || slot_->orphan) return false;
#if GRAPHWARD_HAS_CUDA
    for (cudaStream_t s : other_streams_) {  // rule 7 across steps: the next user waits for them
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
  const std::size_t rounded =
      (std::max<std::size_t>(bytes, 1) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (t_step_arena && t_step_arena->device.is_cpu()) {  // Note [Step arena]
    std::shared_ptr<detail::ArenaSlot> slot = arena_serve(*t_step_arena, rounded, nullptr);
    if (slot) {
      if (debug::poison_new_memory()) std::memset(slot->ptr, 0xFF, rounded);
      std::shared_ptr<Storage> storage(new Storage(Device::cpu(), slot->ptr, bytes, nullptr));
      storage->slot_ = std::move(slot);
      storage->arena_ = t_step_arena;
      storage->block_bytes_ = rounded;
      return storage;
    }
  }
  void* p = host_alloc(rounded, "a tensor");
  std::shared_ptr<Storage> storage;
  try {
    storage.reset(new Storage(Device::cpu(), p, bytes, nullptr));
  } catch (...) {
    host_free(p, rounded);
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

std::shared_ptr<Storage> Storage::allocate(Device device, std::size_t bytes, cudaStream_t stream) {
  if (device.is_cpu()) return allocate_cpu(bytes);
#if GRAPHWARD_HAS_CUDA
  check_cuda_device(device, "Storage::allocate");
  GW_CHECK(stream != nullptr, "Storage::allocate: expected a stream for ", device.str());
  GW_CHECK(device.index < kCacheDevices, "Storage::allocate: device index ", device.index,
           " exceeds graphward's limit of ", kCacheDevices, " devices");
  DeviceGuard guard(device);
  void* p = nullptr;
  const std::size_t block = block_size(bytes);
  const bool capturing_here = stream_capturing(stream);
  if (!capturing_here) detail::release_deferred_storage();  // Note [Frees during a capture]
  // Note [Graph memory pool]: a stream being captured, with a pool in scope.
  if (t_graph_pool && t_graph_pool->device == device && bytes > 0 && capturing_here) {
    p = graph_pool_take(*t_graph_pool, stream, block);
    std::shared_ptr<Storage> storage(new Storage(device, p, bytes, stream));  // owns nothing yet
    storage->graph_pool_ = t_graph_pool;
    storage->block_bytes_ = block;
    if (debug::poison_new_memory()) GW_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, block, stream));
    return storage;
  }
  // Note [Step arena]: inside a step, outside a capture.
  if (t_step_arena && t_step_arena->device == device && bytes > 0 && !capturing_here) {
    std::shared_ptr<detail::ArenaSlot> slot = arena_serve(*t_step_arena, block, stream);
    if (slot) {
      if (debug::poison_new_memory())
        GW_CUDA_CHECK(cudaMemsetAsync(slot->ptr, 0xFF, block, stream));
      std::shared_ptr<Storage> storage(new Storage(device, slot->ptr, bytes, stream));
      storage->slot_ = std::move(slot);
      storage->arena_ = t_step_arena;
      storage->block_bytes_ = block;
      return storage;
    }
  }
  // Note [Block cache]: graphward's own streams, outside a capture, with the cache on.
  const bool cacheable = bytes > 0 && g_cache_limit.load(std::memory_order_relaxed) > 0 &&
                         is_graphward_stream(stream) && !capturing_here;
  if (bytes > 0) {
    if (cacheable) p = cache_take(device.index, stream, block);
    if (!p) {
      // Not inside a capture, where setting a pool attribute is refused: the first eager
      // allocation does it.
      if (!capturing_here) configure_pool_once(device.index);
      p = malloc_async(device, block, stream, capturing_here,
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
// nor the event waits of rule 7 (they would become graph nodes, not orderings of real work).
// Yet a tensor made eagerly can die inside a capture: the previous step's tape, dropped while
// a StepGraph captures the next. Its block, and what orders its release (the streams that used
// it, its fences, its arena slot), then move to a new Storage on a deferred list; that one is
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
    detail::log_error(__FILE__, __LINE__, std::string("Storage: ") + e.what() +
                                              " (a block read by a replayed graph is kept)");
    return;
  }
  if (owner_) return;  // Note [Borrowed storage]: the owner frees the memory
  // Note [Frees during a capture]
  if (!graph_pool_ && !graph_allocation_ && data_ && !device_.is_cpu() && capturing_a_user() &&
      defer_release()) {
    return;
  }
  if (slot_ && release_to_arena()) return;  // the arena keeps the memory (Note [Step arena])
  if (graph_pool_) {  // the pool keeps the memory (Note [Graph memory pool])
    try {
      std::lock_guard<std::mutex> lock(graph_pool_->mutex);
      if (graph_pool_->scoped && other_streams_.empty() && fences_.empty()) {
        graph_pool_->free[{alloc_stream_, block_bytes_}].push_back(data_);
      }
    } catch (...) {
      // not reused: the block stays the pool's
    }
    return;
  }
  if (device_.is_cpu()) {
    host_free(data_, block_bytes_);
    return;
  }
#if GRAPHWARD_HAS_CUDA
  if (!data_) return;
  // Note [Frees at the join]: a block that several of an eager backward's streams used waits for
  // the join instead.
  if (cacheable_ && t_joined_frees && (!other_streams_.empty() || !fences_.empty()) &&
      t_joined_frees->take(*this)) {
    return;
  }
  const int saved_device = [] {
    int d = 0;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
  }();
  if (saved_device != device_.index) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(device_.index));
  // Rule 7: the block may be handed out on alloc_stream_ only after every other stream that used
  // it has finished with it: alloc_stream_ waits for each (Note [Event pool]: one pooled event,
  // handed back once the wait is enqueued).
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
      detail::log_error(__FILE__, __LINE__, "Storage: no event to order a free by (a block is kept)");
      return;
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
    detail::log_error(__FILE__, __LINE__, "Storage: a free could not be ordered after the streams "
                                          "that used the memory (a block is kept)");
    return;
  }
  // Note [Block cache]: with those waits on alloc_stream_, every later use of the block on it is
  // ordered after all of its uses, as for a block used on its own stream only: into the cache.
  if (cacheable_ && cache_put(device_.index, alloc_stream_, block_bytes_, data_)) {
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

// ---- frees at the join (Note [Frees at the join]) ---------------------------------------------

detail::JoinedFrees::JoinedFrees(Device device, cudaStream_t caller,
                                 const std::vector<cudaStream_t>& joined,
                                 const std::vector<cudaStream_t>& moved)
    : device_(device), caller_(caller) {
#if GRAPHWARD_HAS_CUDA
  if (!device.is_cuda() || device.index >= kCacheDevices || (joined.empty() && moved.empty()) ||
      g_cache_limit.load(std::memory_order_relaxed) == 0 || stream_capturing(caller)) {
    return;
  }
  joined_.reserve(joined.size() + 1);
  joined_.push_back(caller);
  for (cudaStream_t s : joined) {
    if (!s || stream_capturing(s)) return;  // inactive: a capture frees as it does
    joined_.push_back(s);
  }
  for (cudaStream_t s : moved) {
    if (!s || stream_capturing(s)) return;
  }
  moved_ = &moved;
  active_ = true;
  previous_ = t_joined_frees;
  t_joined_frees = this;
#else
  (void)joined, (void)moved;
#endif
}

bool detail::JoinedFrees::take(const Storage& st) {
#if GRAPHWARD_HAS_CUDA
  if (!active_ || done_ || st.device_ != device_) return false;
  auto joined = [&](cudaStream_t s) {
    return std::find(joined_.begin(), joined_.end(), s) != joined_.end();
  };
  if (!joined(st.alloc_stream_) &&
      std::find(moved_->begin(), moved_->end(), st.alloc_stream_) == moved_->end()) {
    return false;
  }
  for (cudaStream_t s : st.other_streams_) {
    if (!joined(s)) return false;
  }
  for (const auto& fence : st.fences_) {
    if (!joined(fence.first)) return false;
  }
  try {
    blocks_.push_back({st.data_, st.block_bytes_, st.alloc_stream_});
  } catch (...) {
    return false;  // out of host memory: the storage orders its free itself
  }
  return true;
#else
  (void)st;
  return false;
#endif
}

void detail::JoinedFrees::joined() {
  done_ = true;
  give_back();
}

void detail::JoinedFrees::give_back() noexcept {
#if GRAPHWARD_HAS_CUDA
  if (!active_) return;
  t_joined_frees = previous_;
  active_ = false;
  if (blocks_.empty()) return;
  try {
    DeviceGuard guard(device_);
    if (!done_) {
      // Left before the join: the caller's stream waits for every joined stream first.
      for (std::size_t i = 1; i < joined_.size(); ++i) {
        stream_wait_stream(device_, caller_, joined_[i]);
      }
    }
    Event ev = Event::pooled(device_);
    // Back to the cache of its own stream, which first waits for the caller's stream once (its
    // point after the join): one wait a stream.
    bool recorded = false;
    std::vector<cudaStream_t> waited;
    for (const Block& b : blocks_) {
      if (b.stream != caller_ &&
          std::find(waited.begin(), waited.end(), b.stream) == waited.end()) {
        if (!recorded) ev.record(caller_);
        recorded = true;
        ev.block(b.stream);
        waited.push_back(b.stream);
      }
      if (!cache_put(device_.index, b.stream, b.bytes, b.data)) {
        GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(b.data, b.stream));
      }
    }
  } catch (const std::exception& e) {
    // The blocks cannot be ordered after their users: kept rather than risk reuse.
    detail::log_error(__FILE__, __LINE__, e.what());
  }
  blocks_.clear();
#endif
}

detail::JoinedFrees::~JoinedFrees() {
  give_back();
}

// ---- block cache API --------------------------------------------------------------------------

std::size_t cached_bytes(Device device) {
#if GRAPHWARD_HAS_CUDA
  if (!device.is_cuda()) return 0;
  check_cuda_device(device, "cached_bytes");
  if (device.index >= kCacheDevices) return 0;
  DeviceCache& dc = block_cache().devices[device.index];
  std::lock_guard<std::mutex> lock(dc.mutex);
  return dc.bytes;
#else
  (void)device;
  return 0;
#endif
}

void empty_cache(Device device) {
#if GRAPHWARD_HAS_CUDA
  if (!device.is_cuda()) return;
  check_cuda_device(device, "empty_cache");
  if (device.index >= kCacheDevices) return;
  detail::release_deferred_storage();  // Note [Frees during a capture]: those whose time has come
  release_cached_blocks(device.index, block_cache().devices[device.index]);
#else
  (void)device;
#endif
}

std::size_t host_bytes_in_use() {
  return g_host_bytes.load(std::memory_order_relaxed);
}

std::size_t host_peak_bytes() {
  return g_host_peak.load(std::memory_order_relaxed);
}

void reset_host_peak_bytes() {
  g_host_peak.store(g_host_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void set_host_memory_limit(std::size_t bytes) {
  g_host_limit.store(bytes, std::memory_order_relaxed);
}

std::size_t host_memory_limit() {
  return g_host_limit.load(std::memory_order_relaxed);
}

void set_block_cache_limit(std::size_t bytes) {
#if GRAPHWARD_HAS_CUDA
  g_cache_limit.store(bytes);
#else
  (void)bytes;
#endif
}

std::size_t block_cache_limit() {
#if GRAPHWARD_HAS_CUDA
  return g_cache_limit.load();
#else
  return 0;
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
  if (step.fence) self.add_read(step.stream, step.fence);  // may throw: nothing changed then
  saves_.fetch_sub(step_saves_, std::memory_order_relaxed);  // the step's nodes are released
  step_saves_ = 0;
  step_reads_.reset();
}

void Storage::bump_version() {
  settle();
  ++version_;
  if (saves_.load(std::memory_order_relaxed) > 0) {
    detail::tape_mutations().fetch_add(1, std::memory_order_acq_rel);
  }
}

namespace {
std::atomic<std::uint64_t> g_watched_hazards{0};
}  // namespace

std::uint64_t detail::watched_hazard_epoch() {
  return g_watched_hazards.load(std::memory_order_acquire);
}

void Storage::new_hazard() const {
  if (watched_) g_watched_hazards.fetch_add(1, std::memory_order_acq_rel);
}

void Storage::note_use(cudaStream_t stream) {
  if (stream != producer_ &&
      std::find(reads_since_write_.begin(), reads_since_write_.end(), stream) ==
          reads_since_write_.end()) {
    reads_since_write_.push_back(stream);
    new_hazard();
  }
  if (stream == alloc_stream_) return;
  if (std::find(other_streams_.begin(), other_streams_.end(), stream) == other_streams_.end()) {
    other_streams_.push_back(stream);
  }
}

void Storage::record_use(cudaStream_t stream, bool wrote) {
  if (device_.is_cpu()) return;
  settle();
  note_use(stream);
  if (wrote) {
    if (producer_ != stream) new_hazard();
    producer_ = stream;
    ++writes_;
    reads_since_write_.clear();
  }
}

void Storage::add_read(cudaStream_t stream, std::shared_ptr<const Event> done) {
  if (device_.is_cpu() || stream == alloc_stream_) return;  // ordered before any reuse already
  for (auto& [s, ev] : fences_) {
    if (s == stream) {  // the newer event covers the older one's work
      ev = std::move(done);
      return;
    }
  }
  fences_.emplace_back(stream, std::move(done));
  new_hazard();
}

void Storage::sync_for_read(cudaStream_t stream) {
  if (device_.is_cpu() || stream == producer_) return;
#if GRAPHWARD_HAS_CUDA
  if (t_planned_sync) {  // Note [Planned synchronization]
    note_use(stream);
    return;
  }
  // An event recorded into a stream capture can be waited on only inside that capture, and one
  // recorded outside cannot be waited on inside: while graphward captures (a StepGraph's forward
  // reads across streams here), the event is recorded for this read alone and not kept.
  const bool in_capture = capturing();
  // A stream that already waited for this write outside a capture is ordered after it: a reader's
  // stream (a branch reading a parameter at every layer, every step) waits once a write, not once
  // a read.
  if (!in_capture && event_for_write_ == writes_ &&
      std::find(waited_for_write_.begin(), waited_for_write_.end(), stream) !=
          waited_for_write_.end()) {
    note_use(stream);
    return;
  }
  if (event_for_write_ != writes_ || in_capture) {
    if (!producer_event_.valid()) producer_event_ = Event::pooled(device_);  // Note [Event pool]
    producer_event_.record(producer_);
    event_for_write_ = in_capture ? UINT64_MAX : writes_;
    waited_for_write_.clear();
  }
  producer_event_.block(stream);
  if (!in_capture) waited_for_write_.push_back(stream);
  note_use(stream);
#endif
}

void Storage::sync_for_write(cudaStream_t stream) {
  if (device_.is_cpu()) return;
#if GRAPHWARD_HAS_CUDA
  settle();
  if (t_planned_sync) {  // Note [Planned synchronization]
    note_use(stream);
    if (producer_ != stream) new_hazard();
    producer_ = stream;
    ++writes_;
    reads_since_write_.clear();
    return;
  }
  sync_for_read(stream);  // read-after-write and write-after-write with the producer
  // Write-after-read with the streams that read it since the last write. The readers before that
  // write are ordered before it, so before this one (which waits for the producer): waiting for
  // them again would tie the write to streams that used the memory long ago — inside a capture,
  // to streams outside it (a parameter broadcast on a ProcessGroup's stream, then updated by a
  // StepGraph's optimizer: cudaErrorStreamCaptureIsolation).
  for (cudaStream_t s : reads_since_write_) {
    if (s != stream && s != producer_) stream_wait_stream(device_, stream, s);
  }
  for (const auto& [s, ev] : fences_) {
    if (s != stream) ev->block(stream);
  }
  if (alloc_stream_ != stream && alloc_stream_ != producer_) {
    stream_wait_stream(device_, stream, alloc_stream_);
  }
  note_use(stream);
  if (producer_ != stream) new_hazard();
  producer_ = stream;
  ++writes_;
  reads_since_write_.clear();
#else
  (void)stream;
#endif
}

}  // namespace graphward
