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
#include <string>

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

}  // namespace graphward
