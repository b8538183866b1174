#include "graphward/engine/tape/host_state.h"

#include "graphward/base/error.h"
#include "graphward/engine/runtime/math_mode.h"

namespace graphward {

namespace {
thread_local HostStateLog* t_log = nullptr;
}  // namespace

HostStateScope::HostStateScope(HostStateLog& log) {
  GW_CHECK(t_log == nullptr,
           "HostStateScope: a capture's host state is logged already on this "
           "thread (a captured step inside another)");
  t_log = &log;
  log.math_mode = detail::math_mode_word();
}
HostStateScope::~HostStateScope() {
  t_log = nullptr;
}

namespace detail {
HostStateLog* host_state_log() noexcept {
  return t_log;
}

void note_requires_grad(HostStateLog& log, const Tensor& leaf) {
  if (!log.seen_leaves.insert(leaf.id()).second) return;
  log.requires_grad.push_back({leaf, leaf.requires_grad()});
}

void note_grad(HostStateLog& log, const Tensor& param) {
  if (!log.seen_params.insert(param.id()).second) return;
  log.grads.push_back({param, param.grad_id()});
}
}  // namespace detail

std::string HostStateLog::change() const {
  if (const std::uint64_t now = detail::math_mode_word(); now != math_mode) {
    return detail::concat("the TF32 switches changed since the capture (",
                          detail::math_mode_str(now), " now; ", detail::math_mode_str(math_mode),
                          " then)");
  }
  for (const RequiresGrad& r : requires_grad) {
    if (r.leaf.requires_grad() == r.value) continue;
    return detail::concat("leaf ", r.leaf.str(), r.value ? " no longer requires" : " requires",
                          " grad (set_requires_grad since the capture)");
  }
  for (const Grad& g : grads) {
    const void* now = g.param.grad_id();
    if (now == g.grad) continue;
    return detail::concat("the .grad of parameter ", g.param.str(),
                          now == nullptr      ? " was dropped"
                          : g.grad == nullptr ? " was made"
                                              : " is another tensor",
                          " since the capture (an optimizer of the step reads it)");
  }
  return "";
}

}  // namespace graphward
