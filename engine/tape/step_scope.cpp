#include "graphward/engine/tape/step_scope.h"

#include "graphward/engine/tape/deferred_release.h"
#include "graphward/engine/tape/tape_log.h"

namespace graphward {

StepScope::StepScope(StepArena& arena) {
  // Note [Deferred release]: the last step's saved tensors are back in the arena before its slots
  // are matched.
  detail::wait_for_releases();
  state_ = detail::open_step(arena);
  detail::tape_log_reset();  // Note [Tape log]: the step's tape starts here
}

StepScope::~StepScope() {
  detail::close_step();
}

}  // namespace graphward
