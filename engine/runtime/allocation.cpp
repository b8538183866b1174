#include "graphward/engine/runtime/memory_detail.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/capture_mode.h"

namespace graphward {

using detail::kHostAlignment;
#if GRAPHWARD_HAS_CUDA
using detail::kCacheDevices;
#endif

namespace {

// Note [Host memory]
// CPU tensors' memory comes from host_alloc and goes back through host_free, which count what
// graphward holds (host_bytes_in_use) and keep it within set_host_memory_limit. An allocation the
// limit or the system refuses throws OutOfMemoryError, as a device's does, saying what needed how
// much: never std::bad_alloc, and nothing is half-made.
std::atomic<std::size_t> g_host_bytes{0};
std::atomic<std::size_t> g_host_peak{0};
std::atomic<std::size_t> g_host_limit{SIZE_MAX};

#if GRAPHWARD_HAS_CUDA
// ---- the block cache (Note [Block cache]) ----
std::atomic<std::size_t> g_cache_limit{std::size_t{4} << 30};

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

#endif
}  // namespace

void* detail::host_alloc(std::size_t bytes, const char* what) {
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

void detail::host_free(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  std::free(p);
  g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

#if GRAPHWARD_HAS_CUDA
bool detail::stream_capturing(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: do not cache
  }
  return status != cudaStreamCaptureStatusNone;
}

// A cached block of exactly `bytes` for `stream`, or nullptr.
void* detail::cache_take(int device, cudaStream_t stream, std::size_t bytes) {
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
bool detail::cache_put(int device, cudaStream_t stream, std::size_t bytes, void* p,
                       bool not_capturing) noexcept {
  try {
    BlockCache& bc = block_cache();
    if (bc.shut_down.load() || (!not_capturing && stream_capturing(stream))) return false;
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

// Keep freed memory in the device's pool instead of returning it to the OS at every
// synchronization (the default threshold of 0 would make each step re-map its memory).
void detail::configure_pool_once(int device) {
  static std::atomic<std::uint64_t> configured{0};  // bit per device (first 64)
  const std::uint64_t bit = 1ull << (device & 63);
  if (configured.load(std::memory_order_acquire) & bit) return;
  cudaMemPool_t pool = nullptr;
  GW_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t threshold = UINT64_MAX;
  GW_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  configured.fetch_or(bit, std::memory_order_acq_rel);
}

[[noreturn]] void detail::out_of_memory(Device device, std::size_t bytes, const char* what) {
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
void* detail::malloc_async(Device device, std::size_t bytes, cudaStream_t stream,
                           bool capturing_here, const char* what) {
  void* p = nullptr;
  cudaError_t err = cudaMallocAsync(&p, bytes, stream);
  if (err == cudaErrorMemoryAllocation && !capturing_here) {
    (void)cudaGetLastError();
    empty_cache(device);
    {
      detail::DeviceWideWait wait(
          device.index);  // Note [Device-wide waits and other threads' captures]
      GW_CUDA_CHECK(cudaDeviceSynchronize());
    }
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
  previous_ = current_joined_frees();
  current_joined_frees() = this;
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
  current_joined_frees() = previous_;
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
    // Back to the cache of its own stream, which first waits for the caller's stream once (its
    // point after the join): one wait a stream, one event for all of them.
    Event ev;
    std::vector<cudaStream_t> waited;
    for (const Block& b : blocks_) {
      if (b.stream != caller_ &&
          std::find(waited.begin(), waited.end(), b.stream) == waited.end()) {
        if (!ev.valid()) {
          ev = Event::pooled(device_);
          ev.record(caller_);
        }
        ev.block(b.stream);
        waited.push_back(b.stream);
      }
      // Each block's stream was found not capturing when the scope opened (the constructor).
      if (!cache_put(device_.index, b.stream, b.bytes, b.data, /*not_capturing=*/true)) {
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
  // Freeing memory synchronizes with the device: refused by name inside a capture (it surfaced
  // later as an invalid value in the next kernel's launch check).
  check_capturable("empty_cache (it frees device memory, which synchronizes)");
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

}  // namespace graphward
