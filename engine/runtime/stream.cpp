#include "graphward/engine/runtime/stream.h"

#include <array>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/capture_mode.h"

namespace graphward {

namespace {
constexpr int kMaxDevices = 64;

#if !GRAPHWARD_HAS_CUDA
[[noreturn]] void no_cuda(const char* what) {
  GW_CHECK(false, what, ": graphward was built without CUDA");
  __builtin_unreachable();
}
#endif
}  // namespace

// ---- Event --------------------------------------------------------------------------------------

Event::Event(Device device, bool enable_timing) : device_(device) {
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(device);
  GW_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
#else
  (void)enable_timing;
  no_cuda("Event");
#endif
}

Event::~Event() {
  reset();
}

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      device_(other.device_),
      pooled_(std::exchange(other.pooled_, false)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
    pooled_ = std::exchange(other.pooled_, false);
  }
  return *this;
}

Event Event::pooled(Device device) {
  Event e;
  e.device_ = device;
#if GRAPHWARD_HAS_CUDA
  e.event_ = detail::take_pooled_event(device);
  e.pooled_ = true;
#else
  no_cuda("Event::pooled");
#endif
  return e;
}

// Note [Event pool]
#if GRAPHWARD_HAS_CUDA
namespace {
struct EventPool {
  std::mutex mutex;
  std::vector<cudaEvent_t> free;
};
// Never destroyed: the events live as long as the process (destroying them at exit could come
// after the CUDA context is gone).
EventPool& event_pool(int device) {
  static auto* pools = new std::array<EventPool, kMaxDevices>();
  return (*pools)[static_cast<std::size_t>(device)];
}
}  // namespace
#endif

cudaEvent_t detail::take_pooled_event(Device device) {
#if GRAPHWARD_HAS_CUDA
  GW_CHECK(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
           "Event::pooled: expected a CUDA device, got ", device.str());
  EventPool& pool = event_pool(device.index);
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (!pool.free.empty()) {
      cudaEvent_t ev = pool.free.back();
      pool.free.pop_back();
      return ev;
    }
  }
  DeviceGuard guard(device);
  cudaEvent_t ev = nullptr;
  GW_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return ev;
#else
  (void)device;
  no_cuda("Event::pooled");
#endif
}

void detail::give_pooled_event(Device device, cudaEvent_t event) noexcept {
#if GRAPHWARD_HAS_CUDA
  if (!event) return;
  EventPool& pool = event_pool(device.index);
  try {
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(event);
  } catch (...) {
    GW_CUDA_CHECK_NOTHROW(cudaEventDestroy(event));  // out of host memory: destroy it instead
  }
#else
  (void)device, (void)event;
#endif
}

void Event::reset() noexcept {
#if GRAPHWARD_HAS_CUDA
  if (event_ && pooled_) {
    detail::give_pooled_event(device_, event_);
  } else if (event_) {
    GW_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
  }
#endif
  event_ = nullptr;
  pooled_ = false;
}

#if GRAPHWARD_HAS_CUDA
void Event::record(cudaStream_t stream) {
  GW_CHECK(event_, "Event::record: the event was moved from or never created");
  GW_CUDA_CHECK(cudaEventRecord(event_, stream));
}
void Event::record_external(cudaStream_t stream) {
  GW_CHECK(event_, "Event::record_external: the event was moved from or never created");
  // cudaEventRecordExternal is for stream capture only (outside one the runtime refuses it with
  // cudaErrorIllegalState): outside a capture it is a plain record.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GW_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status == cudaStreamCaptureStatusActive) {
    GW_CUDA_CHECK(cudaEventRecordWithFlags(event_, stream, cudaEventRecordExternal));
  } else {
    GW_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
}
void Event::block(cudaStream_t stream) const {
  GW_CHECK(event_, "Event::block: the event was moved from or never created");
  GW_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}
bool Event::query() const {
  check_capturable("Event::query");  // Note [Capture-unsafe ops]
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  GW_CUDA_CHECK(err);
  return true;
}
void Event::synchronize() const {
  check_capturable("Event::synchronize");  // Note [Capture-unsafe ops]
  GW_CUDA_CHECK(cudaEventSynchronize(event_));
}
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  GW_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}
#else
void Event::record(cudaStream_t) {
  no_cuda("Event::record");
}
void Event::record_external(cudaStream_t) {
  no_cuda("Event::record_external");
}
void Event::block(cudaStream_t) const {
  no_cuda("Event::block");
}
bool Event::query() const {
  check_capturable("Event::query");  // Note [Capture-unsafe ops]
  no_cuda("Event::query");
}
void Event::synchronize() const {
  check_capturable("Event::synchronize");  // Note [Capture-unsafe ops]
  no_cuda("Event::synchronize");
}
float Event::elapsed_ms_since(const Event&) const {
  no_cuda("Event::elapsed_ms_since");
}
#endif

// ---- Stream -------------------------------------------------------------------------------------

// Note [Stream lifetime]
// Memory is freed, and cross-stream events are recorded, on the streams that used it, possibly long
// after the graphward::Stream that owned such a stream is gone. So a Stream never destroys its CUDA
// stream: it returns it to a per-device pool, and the next Stream of that device and priority takes
// it. Every stream graphward hands out thus stays valid for the life of the process, and stale
// handles held by storage only order work after whatever that stream runs later — never undefined
// behaviour. (PyTorch's stream pools rest on the same idea.) Streams a caller passes in raw must
// outlive the tensors produced or consumed on them.
namespace {
struct PooledStream {
  cudaStream_t stream;
  int device;
  int priority;
};
std::mutex& stream_pool_mutex() {
  static std::mutex m;
  return m;
}
std::vector<PooledStream>& stream_pool() {
  static auto* pool = new std::vector<PooledStream>();  // never destroyed: see the note
  return *pool;
}

// Every stream graphward created, append-only (they are never destroyed): read without a lock.
constexpr int kMaxRegistered = 4096;
std::array<std::atomic<cudaStream_t>, kMaxRegistered> g_registered{};
std::atomic<int> g_num_registered{0};
std::mutex g_register_mutex;

[[maybe_unused]] void register_stream(cudaStream_t stream) noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_register_mutex);
    const int n = g_num_registered.load(std::memory_order_relaxed);
    if (n >= kMaxRegistered) return;  // beyond the table: treated as a raw stream
    g_registered[n].store(stream, std::memory_order_relaxed);
    g_num_registered.store(n + 1, std::memory_order_release);
  } catch (...) {
    // Not registered: the stream is treated as a raw stream (its memory is not cached).
  }
}
}  // namespace

bool is_graphward_stream(cudaStream_t stream) noexcept {
  if (!stream) return false;
  const int n = g_num_registered.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (g_registered[i].load(std::memory_order_relaxed) == stream) return true;
  }
  return false;
}

Stream::Stream(Device device, int priority) : device_(device), priority_(priority) {
#if GRAPHWARD_HAS_CUDA
  check_cuda_device(device, "Stream");
  {
    std::lock_guard<std::mutex> lock(stream_pool_mutex());
    auto& pool = stream_pool();
    for (auto it = pool.begin(); it != pool.end(); ++it) {
      if (it->device == device.index && it->priority == priority) {
        stream_ = it->stream;
        pool.erase(it);
        return;
      }
    }
  }
  DeviceGuard guard(device);
  GW_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  register_stream(stream_);
#else
  (void)priority;
  no_cuda("Stream");
#endif
}

Stream::~Stream() {
  reset();
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)),
      device_(other.device_),
      priority_(other.priority_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
    priority_ = other.priority_;
  }
  return *this;
}

void Stream::reset() noexcept {
  if (!stream_) return;
  try {  // back to the pool, never destroyed (Note [Stream lifetime])
    std::lock_guard<std::mutex> lock(stream_pool_mutex());
    stream_pool().push_back({stream_, device_.index, priority_});
  } catch (const std::exception& e) {
    detail::log_error(__FILE__, __LINE__, e.what());  // the stream leaks; nothing dangles
  }
  stream_ = nullptr;
}

void Stream::synchronize() const {
  check_capturable("Stream::synchronize");  // Note [Capture-unsafe ops]
#if GRAPHWARD_HAS_CUDA
  GW_CUDA_CHECK(cudaStreamSynchronize(stream_));
#else
  no_cuda("Stream::synchronize");
#endif
}

void Stream::wait_stream(cudaStream_t other) const {
  stream_wait_stream(device_, stream_, other);
}

bool stream_is_capturing(cudaStream_t stream) {
#if GRAPHWARD_HAS_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GW_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  no_cuda("stream_is_capturing");
#endif
}

void stream_wait_stream(Device device, cudaStream_t waiter, cudaStream_t producer) {
#if GRAPHWARD_HAS_CUDA
  if (waiter == producer) return;
  // Note [Event pool]: the event goes back to the pool once the wait is enqueued.
  DeviceGuard guard(device);
  cudaEvent_t ev = detail::take_pooled_event(device);
  const cudaError_t rec = cudaEventRecord(ev, producer);
  const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(waiter, ev, 0) : rec;
  detail::give_pooled_event(device, ev);
  GW_CUDA_CHECK(wait);
#else
  (void)device, (void)waiter, (void)producer;
  no_cuda("stream_wait_stream");
#endif
}

// ---- default and current streams ----------------------------------------------------------------
// Note [Current stream]: the current stream is per thread and per device; nullptr in the slot means
// "the device's default stream". Default streams are created once and deliberately never destroyed
// (like the runtime's own default stream): tensors alive at process exit may still free on them.

cudaStream_t default_stream(Device device) {
  check_cuda_device(device, "default_stream");
#if GRAPHWARD_HAS_CUDA
  static std::array<std::atomic<cudaStream_t>, kMaxDevices> streams{};
  static std::mutex create_mutex;
  GW_CHECK(device.index < kMaxDevices, "default_stream: device index ", device.index,
           " exceeds graphward's limit of ", kMaxDevices, " devices");
  auto& slot = streams[device.index];
  cudaStream_t s = slot.load(std::memory_order_acquire);
  if (s) return s;
  std::lock_guard<std::mutex> lock(create_mutex);
  s = slot.load(std::memory_order_relaxed);
  if (!s) {
    DeviceGuard guard(device);
    GW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    register_stream(s);
    slot.store(s, std::memory_order_release);
  }
  return s;
#else
  no_cuda("default_stream");
#endif
}

namespace {
thread_local std::array<cudaStream_t, kMaxDevices> t_current_streams{};
}

cudaStream_t current_stream(Device device) {
  check_cuda_device(device, "current_stream");
  cudaStream_t s = t_current_streams[device.index];
  return s ? s : default_stream(device);
}

// A graphward::Stream is a non-blocking stream of its device by construction: no driver call to
// check it (cudaStreamGetDevice is refused while the thread captures a graph).
StreamGuard::StreamGuard(const Stream& stream)
    : StreamGuard(stream.device(), stream.get(), Recorded{}) {
  GW_CHECK(stream.get() != nullptr, "StreamGuard: the Stream was moved from");
}

StreamGuard::StreamGuard(Device device, cudaStream_t stream) : device_(device) {
  check_cuda_device(device, "StreamGuard");
  GW_CHECK(device.index < kMaxDevices, "StreamGuard: device index ", device.index,
           " exceeds graphward's limit of ", kMaxDevices, " devices");
#if GRAPHWARD_HAS_CUDA
  GW_CHECK(stream != nullptr && stream != cudaStreamLegacy,
           "StreamGuard: the legacy default stream cannot be a current stream (it synchronizes "
           "with every blocking stream); expected a stream created with cudaStreamNonBlocking, "
           "e.g. graphward::Stream");
  GW_CHECK(stream != cudaStreamPerThread,
           "StreamGuard: cudaStreamPerThread cannot be a current stream (it synchronizes with the "
           "legacy default stream); expected a stream created with cudaStreamNonBlocking");
  int stream_device = -1;
  GW_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
  GW_CHECK(stream_device == device.index, "StreamGuard: stream ", static_cast<void*>(stream),
           " belongs to cuda:", stream_device, ", not to ", device.str());
#endif
  previous_ = t_current_streams[device.index];
  t_current_streams[device.index] = stream;
}

StreamGuard::StreamGuard(Device device, cudaStream_t stream, Recorded) : device_(device) {
  previous_ = t_current_streams[device.index];
  t_current_streams[device.index] = stream;
}

StreamGuard::~StreamGuard() {
  t_current_streams[device_.index] = previous_;
}

}  // namespace graphward
