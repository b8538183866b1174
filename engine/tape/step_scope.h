#pragma once
// A step of a training loop on the calling thread: its allocations are served by a StepArena
// (Note [Step arena], engine/runtime/step_arena.h) and its tape starts anew (Note [Tape log],
// engine/tape/tape_log.h).
#include <memory>

#include "graphward/engine/runtime/step_arena.h"

namespace graphward {

// One step: the calling thread's allocations on the arena's device are served by the arena for
// the scope. Scopes do not nest (one step at a time per thread).
class StepScope {
 public:
  explicit StepScope(StepArena& arena);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  std::shared_ptr<detail::ArenaState> state_;
};

}  // namespace graphward
