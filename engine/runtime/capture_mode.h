#pragma once
// Note [Capture-unsafe ops]
// While graphward captures a backward into a CUDA graph (capture/), the code that runs is recorded,
// not executed, and on replay only the recorded GPU work runs again. An op that waits for the GPU
// (a synchronize, a host read of a device tensor, a host-to-device upload) would invalidate the
// capture; host code that reads a tensor's value would run once, at capture time, and its result
// would be baked into every replay. Such ops call check_capturable(op) first: inside a
// CaptureModeScope it throws a graphward::Error that names the op and what is being captured,
// before anything is enqueued, instead of corrupting or silently freezing the graph.
//
// Ops that check: Tensor::item, Tensor::to_vector, Tensor::to (host <-> device and across
// devices), Stream::synchronize, Event::synchronize, Event::query, and a timed backward() (its
// trace synchronizes).
#include <memory>
#include <string>
#include <vector>

namespace graphward {

// Marks the calling thread as capturing `what` (e.g. "the backward of step 12") for the scope.
// Scopes nest; the innermost names the capture.
class CaptureModeScope {
 public:
  explicit CaptureModeScope(std::string what);
  ~CaptureModeScope();
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;

 private:
  const std::string* previous_;
  std::string what_;
};

// Whether the calling thread is inside a CaptureModeScope.
bool capturing() noexcept;

// Marks the calling thread as running a whole training step that is or will be captured (a
// StepGraph's warm-up steps and its capture): a backward() there splits its weight gradients onto
// side streams unless told otherwise (BackwardOptions::split_weight_grads), so that the warm-up
// makes the side streams' library handles, which a capture cannot. Scopes nest.
class WholeStepScope {
 public:
  WholeStepScope() noexcept;
  ~WholeStepScope();
  WholeStepScope(const WholeStepScope&) = delete;
  WholeStepScope& operator=(const WholeStepScope&) = delete;

 private:
  bool previous_;
};
// Whether the calling thread is inside a WholeStepScope.
bool in_whole_step() noexcept;
// What the innermost scope captures (nullptr outside any).
const std::string* capture_name() noexcept;
// Throws graphward::Error naming `op` when the calling thread is capturing.
void check_capturable(const char* op);
// Note [Streams inside a capture]: inside a CaptureModeScope, every op runs on a stream that is
// part of the capture — the capturing stream, or one that joined it by waiting on work captured
// there (an op's own wait for an input made inside the capture joins its stream: rule [read after
// write]). An op on any other stream would run once, now, and be missing from every replay; an op
// calls this with its launch stream after waiting for its inputs (CudaScope::read; a `void*`
// cudaStream_t: this header stays CUDA-free), and it throws a graphward::Error naming the stream
// and the capture when the stream is not capturing. Free outside a capture (a thread-local test);
// one cudaStreamIsCapturing inside. Not checked: factories with no input (zeros, randn), whose
// output, read on a captured stream, makes the capture fail instead.
void check_launch_stream(const void* stream);

namespace detail {

// Note [Device-wide waits and other threads' captures]
// A call that waits for the whole device invalidates every stream capture underway on it, whatever
// thread made the capture and in whatever mode: cudaDeviceSynchronize, and cublasDestroy and
// cublasLtDestroy, which call it (measured on an H200 with CUDA 13: a thread-local capture on one
// thread, each call once on another; cudaFree, cudaFreeHost, cudnnDestroy, stream and event
// destruction, synchronous copies on the legacy stream and stream or event synchronizes leave it
// active). graphward captures on one thread while others run eagerly, and a thread's cuBLAS
// handles are destroyed when it exits: a two-thread training loop lost the other thread's capture
// whenever one thread ended first. So every capture graphward makes (capture::capture_stream)
// holds its device's CaptureUnderway for its length, and every device-wide wait graphward makes
// holds the device's DeviceWideWait around it: the wait begins once the captures underway on other
// threads have ended, and no capture begins until it is done (a capture about to begin waits for a
// device-wide wait that is waiting, so captures in a row cannot starve it). A thread's own capture
// never blocks it (that wait would never end): such a wait invalidates the thread's own capture, as
// before, and graphward refuses the ones it knows by name (Note [Capture-unsafe ops]). Devices past
// the 64th are not gated.
class CaptureUnderway {
 public:
  explicit CaptureUnderway(int device);
  ~CaptureUnderway();
  CaptureUnderway(const CaptureUnderway&) = delete;
  CaptureUnderway& operator=(const CaptureUnderway&) = delete;

 private:
  int device_;
};
class DeviceWideWait {
 public:
  explicit DeviceWideWait(int device) noexcept;
  ~DeviceWideWait();
  DeviceWideWait(const DeviceWideWait&) = delete;
  DeviceWideWait& operator=(const DeviceWideWait&) = delete;

 private:
  int device_;
  bool holding_ = false;
};
// How many captures graphward has underway on `device`, on every thread (for tests).
int captures_underway(int device) noexcept;

}  // namespace detail

// Note [Watched replays]
// Work a graph captures may wait on the GPU for something outside the process — a collective
// waits for the other ranks — and a replay of it would then hang forever when a peer died. So
// what enqueues such work inside a capture registers a ReplayWatcher for the graph being made
// (watch_this_capture); the graph keeps its capture's watchers (capture::Graph) and calls them
// around every launch: before it, a watcher that knows the work can never finish (its group was
// aborted, or is gone) refuses the launch with an error naming the graph; after it, the watcher
// records the launch and sees that it finishes in time (dist's ReplayWatchdog). A graph no
// watcher registered with (every single-process graph) pays nothing.
class ReplayWatcher {
 public:
  virtual ~ReplayWatcher() = default;
  // Throws a graphward::Error naming `graph` where the launch must not happen.
  virtual void before_launch(const std::string& graph) = 0;
  // Right after a launch on `stream` (a cudaStream_t: this header stays CUDA-free).
  virtual void after_launch(void* stream, const std::string& graph) = 0;
};
// Registers `watcher` (once) with the graph being captured on this thread: with the innermost
// CaptureWatchers; nothing where none is open.
void watch_this_capture(const std::shared_ptr<ReplayWatcher>& watcher);
// Collects the watchers registered on this thread while it lives (capture_stream opens one around
// each capture). Scopes nest; the innermost collects.
class CaptureWatchers {
 public:
  CaptureWatchers();
  ~CaptureWatchers();
  CaptureWatchers(const CaptureWatchers&) = delete;
  CaptureWatchers& operator=(const CaptureWatchers&) = delete;
  std::vector<std::shared_ptr<ReplayWatcher>> take() { return std::move(watchers_); }

 private:
  friend void watch_this_capture(const std::shared_ptr<ReplayWatcher>& watcher);
  CaptureWatchers* previous_;
  std::vector<std::shared_ptr<ReplayWatcher>> watchers_;
};

}  // namespace graphward
