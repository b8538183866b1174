#pragma once
// Streams and events (Note [Current stream]).
//
// Every thread has, for every CUDA device, a current stream: the stream forward ops launch on
// (rule [current stream]). Until a StreamGuard sets one it is the device's graphward default
// stream: a non-blocking stream created once per device and kept for the life of the process, so
// that nothing graphward launches ever synchronizes with the legacy default stream. The legacy
// default stream (0 / cudaStreamLegacy) and cudaStreamPerThread are refused as current streams.
//
// graphward::Stream objects hand their CUDA stream back to a per-device pool when destroyed, so
// tensors may outlive the Stream they were made on (Note [Stream lifetime] in stream.cpp). A raw
// stream passed to StreamGuard must outlive the tensors produced or consumed on it: their memory is
// freed in stream order on the stream that allocated it (Note [Stream-ordered memory], memory.h).
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"

namespace graphward {

// Owns a CUDA event (timing disabled unless asked). Move-only.
class Event {
 public:
  Event() = default;  // no event yet: call create() or use the constructor below
  explicit Event(Device device, bool enable_timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // A timing-disabled event from the device's pool (Note [Event pool]): no driver call once the
  // pool is warm; handed back to the pool, not destroyed, when this Event is.
  static Event pooled(Device device);

  cudaEvent_t get() const { return event_; }
  Device device() const { return device_; }
  bool valid() const { return event_ != nullptr; }

  void record(cudaStream_t stream);
  // Inside a stream capture: records the event as a node of the graph (cudaEventRecordExternal),
  // so that each replay records it (timing a replay's steps); outside one, as record().
  void record_external(cudaStream_t stream);
  // Makes `stream` wait for the work captured by the last record() (no host blocking).
  void block(cudaStream_t stream) const;
  bool query() const;  // true when the recorded work has finished
  void synchronize() const;
  // Milliseconds between `start` and this event; both must be timing events, recorded and done.
  float elapsed_ms_since(const Event& start) const;

 private:
  void reset() noexcept;
  cudaEvent_t event_ = nullptr;
  Device device_ = Device::cuda(0);
  bool pooled_ = false;
};

namespace detail {
// Note [Event pool]
// Storage records an event wherever memory crosses streams (a read on another stream, a free after
// other streams used it, a step-arena slot released by another stream), several a step for every
// tensor that does. cudaEventCreate and cudaEventDestroy cost more host time than the record and
// the wait they serve, so those events come from a per-device pool of timing-disabled events,
// created once and kept for the life of the process (like the default streams). An event goes
// back to the pool as soon as its holder is done with it, recorded or not: a wait already
// enqueued on it waits for the work it captured, whatever the event is recorded for next.
cudaEvent_t take_pooled_event(Device device);
void give_pooled_event(Device device, cudaEvent_t event) noexcept;
}  // namespace detail

// Owns a non-blocking CUDA stream on one device, taken from and returned to a per-device pool.
// Move-only.
class Stream {
 public:
  explicit Stream(Device device = Device::cuda(0), int priority = 0);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  Device device() const { return device_; }
  void synchronize() const;
  // This stream waits for all work enqueued on `other` so far (an event in between).
  void wait_stream(cudaStream_t other) const;

 private:
  void reset() noexcept;
  cudaStream_t stream_ = nullptr;
  Device device_ = Device::cuda(0);
  int priority_ = 0;
};

// The graphward default stream of `device` (created on first use, non-blocking, process lifetime).
cudaStream_t default_stream(Device device);
// The calling thread's current stream for `device` (its default stream until a guard sets one).
cudaStream_t current_stream(Device device);

// Sets the calling thread's current stream for the stream's device for the scope; restores the
// previous one. Checks that the stream is a real stream on that device.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);  // no driver call: usable while capturing
  StreamGuard(Device device, cudaStream_t stream);
  // For a stream graphward itself recorded as current on `device` (a backward plan's streams):
  // skips the checks, which cost a driver call.
  struct Recorded {};
  StreamGuard(Device device, cudaStream_t stream, Recorded);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Device device_;
  cudaStream_t previous_;
};

// `waiter` waits for everything enqueued on `producer` so far, through a fresh event. No-op when
// they are the same stream.
void stream_wait_stream(Device device, cudaStream_t waiter, cudaStream_t producer);
// Whether `stream` is being captured into a CUDA graph (by graphward or by anyone). CUDA only.
bool stream_is_capturing(cudaStream_t stream);

// Whether `stream` is one graphward created (a default stream or a graphward::Stream's): such a
// stream lives as long as the process (Note [Stream lifetime]), so a handle to it never dangles
// and is never reused for another stream. Streams passed in raw are not.
bool is_graphward_stream(cudaStream_t stream) noexcept;

}  // namespace graphward
