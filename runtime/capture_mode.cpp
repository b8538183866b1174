#include "runtime/capture_mode.h"

#include "base/error.h"
#include "runtime/cuda.h"

namespace graphward {

namespace {
thread_local const std::string* t_capturing = nullptr;  // what the innermost scope captures
thread_local bool t_whole_step = false;
thread_local CaptureWatchers* t_watchers = nullptr;  // Note [Watched replays]
}  // namespace

CaptureWatchers::CaptureWatchers() : previous_(t_watchers) {
  t_watchers = this;
}
CaptureWatchers::~CaptureWatchers() {
  t_watchers = previous_;
}
void watch_this_capture(const std::shared_ptr<ReplayWatcher>& watcher) {
  if (!t_watchers || !watcher) return;
  for (const auto& w : t_watchers->watchers_) {
    if (w == watcher) return;
  }
  t_watchers->watchers_.push_back(watcher);
}

WholeStepScope::WholeStepScope() noexcept : previous_(t_whole_step) {
  t_whole_step = true;
}

WholeStepScope::~WholeStepScope() {
  t_whole_step = previous_;
}

bool in_whole_step() noexcept {
  return t_whole_step;
}

CaptureModeScope::CaptureModeScope(std::string what)
    : previous_(t_capturing), what_(std::move(what)) {
  t_capturing = &what_;
}

CaptureModeScope::~CaptureModeScope() {
  t_capturing = previous_;
}

bool capturing() noexcept {
  return t_capturing != nullptr;
}

const std::string* capture_name() noexcept {
  return t_capturing;
}

void check_capturable(const char* op) {
  GW_CHECK(t_capturing == nullptr, op, " cannot run while graphward is capturing ", *t_capturing,
           " into a CUDA graph: it waits for the GPU or reads a tensor's value on the host, which "
           "a graph cannot replay (the read would happen once, at capture time); move it out of "
           "the captured work (e.g. read the loss after backward() or StepGraph::run() returns)");
}

void check_launch_stream(const void* stream) {
  if (t_capturing == nullptr) return;
#if GRAPHWARD_HAS_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GW_CUDA_CHECK(
      cudaStreamIsCapturing(static_cast<cudaStream_t>(const_cast<void*>(stream)), &status));
  GW_CHECK(status == cudaStreamCaptureStatusActive, "an op was launched on stream ", stream,
           ", which is not part of the capture of ", *t_capturing, " (its capture status: ",
           status == cudaStreamCaptureStatusNone ? "not capturing" : "capture invalidated",
           "): its work would run once, now, and be missing from every replay. Expected: inside "
           "captured work, run ops on the capturing stream, or on a stream that first waits for "
           "it (Stream::wait_stream(the capturing stream)) and that it waits for before the step "
           "returns");
#else
  (void)stream;
#endif
}

}  // namespace graphward
