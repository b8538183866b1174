#pragma once
// Note [Host state of a captured step]
// A captured whole step (StepGraph, capture/step_graph.h) bakes in decisions the host made from
// state a user may change between replays: which of an op's leaf inputs require grad (whether it
// recorded a node, and where its gradients go) and which parameters an optimizer stepped, zeroed
// or clipped (whether each had a .grad, and which tensor that was). A replay after such a change
// would run the old decisions: a layer unfrozen with set_requires_grad(true) never trains, one
// frozen with its .grad kept is still given fresh gradients, a .grad dropped is still read. So
// while a capture runs, a HostStateLog notes each such read — needs_grad() of the tape notes the
// leaves it looks at, the optimizers the parameters they visit — and StepGraph checks the log
// before every replay: a change is captured anew, with the reason (never a stale replay). The
// log holds each tensor once; outside a capture nothing is noted (one thread-local test). The
// TF32 switches (Note [TF32], engine/runtime/math_mode.h) are noted when the capture begins.
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "graphward/engine/runtime/tensor.h"

namespace graphward {

struct HostStateLog {
  struct RequiresGrad {
    Tensor leaf;
    bool value;
  };
  struct Grad {
    Tensor param;
    const void* grad;  // Tensor::grad_id() when noted (nullptr: no .grad)
  };
  std::vector<RequiresGrad> requires_grad;
  std::vector<Grad> grads;
  // The TF32 switches at the capture (Note [TF32], engine/runtime/math_mode.h): every GEMM and
  // convolution of the step chose its kernels by them.
  std::uint64_t math_mode = 0;
  std::unordered_set<const void*> seen_leaves, seen_params;

  // "" while every noted read would decide as at the capture, else what changed.
  std::string change() const;
};

// Notes the calling thread's reads into `log` for the scope (scopes do not nest: the inner
// one is refused).
class HostStateScope {
 public:
  explicit HostStateScope(HostStateLog& log);
  ~HostStateScope();
  HostStateScope(const HostStateScope&) = delete;
  HostStateScope& operator=(const HostStateScope&) = delete;
};

namespace detail {
// The calling thread's log (nullptr outside a HostStateScope).
HostStateLog* host_state_log() noexcept;
// A decision read `leaf`'s requires_grad (a leaf: no grad_fn) / `param`'s .grad.
void note_requires_grad(HostStateLog& log, const Tensor& leaf);
void note_grad(HostStateLog& log, const Tensor& param);
}  // namespace detail

}  // namespace graphward
