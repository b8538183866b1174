#include "engine/capture_mode.h"

#include "engine/error.h"

namespace graphward {

namespace {
thread_local const std::string* t_capturing = nullptr;  // what the innermost scope captures
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

void check_capturable(const char* op) {
  GW_CHECK(t_capturing == nullptr, op, " cannot run while graphward is capturing ", *t_capturing,
           " into a CUDA graph: it waits for the GPU or reads a tensor's value on the host, which "
           "a graph cannot replay (the read would happen once, at capture time); move it out of "
           "the captured work (e.g. read the loss after backward() or StepGraph::run() returns)");
}

}  // namespace graphward
