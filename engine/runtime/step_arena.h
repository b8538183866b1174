#pragma once
// Note [Step arena]
// A captured backward reads its step's activations at the addresses they had when it was captured.
// A StepArena makes those addresses the same every step: inside a StepScope, the i-th allocation of
// the calling thread on the arena's device is served from the arena's i-th slot, and a slot is
// recorded the first time (the step that records is the only one that allocates). A step is matched
// slot by slot:
//   * same size and stream: the slot's memory, again;
//   * the slot is still held (a tensor of an earlier step kept alive, e.g. last step's loss): that
//     one allocation is served fresh and the slot skipped, so the kept tensor is never overwritten
//     and the rest of the step keeps its addresses;
//   * another size or stream (the step changed): the arena drops the slots from there on and
//     records the rest of this step anew; the next step of the new kind matches again.
// Reuse across steps is ordered on the GPU, never by a host synchronize: a slot is handed to stream
// S only after S waited for the event recorded by record_step_end() (the end of the previous
// step's backward) and for every other stream that used the slot's memory before it was released
// (events recorded at release; an event that many slots share, such as a replayed backward's
// fence, is waited on once a stream and step). Allocations on a stream that is being captured into
// a CUDA graph bypass the arena: graph memory belongs to the graph.
//
// CPU tensors are served too (no streams, no events): the arena's matching logic is the same, and
// it is what CI tests.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"

namespace graphward {

class StepArena;
namespace detail {
struct ArenaState;
std::shared_ptr<ArenaState> open_step(StepArena& arena);
}  // namespace detail

class StepArena {
 public:
  struct Stats {
    std::size_t slots = 0;        // recorded slots
    std::size_t bytes = 0;        // memory they hold
    std::uint64_t steps = 0;      // StepScopes begun
    std::uint64_t served = 0;     // allocations served from a recorded slot
    std::uint64_t recorded = 0;   // allocations that recorded a new slot
    std::uint64_t held = 0;       // allocations served fresh because their slot was still held
    std::uint64_t rerecords = 0;  // steps that diverged and dropped the slots from there on
  };

  explicit StepArena(Device device);
  // Slots still held by tensors are left to them (freed when they die); the rest is freed.
  ~StepArena();
  StepArena(const StepArena&) = delete;
  StepArena& operator=(const StepArena&) = delete;

  Device device() const;
  Stats stats() const;
  // Call after the step's backward was enqueued on `stream` (CUDA): the next step reuses slots only
  // after this point of `stream` on the GPU. No-op on the CPU.
  void record_step_end(cudaStream_t stream);

 private:
  friend std::shared_ptr<detail::ArenaState> detail::open_step(StepArena& arena);
  std::shared_ptr<detail::ArenaState> state_;
};

namespace detail {
// The arena's side of a StepScope (engine/tape/step_scope.h): open_step makes `arena` serve the calling
// thread's allocations from its first slot on (an Error if a step is already open on the thread);
// close_step ends that.
std::shared_ptr<ArenaState> open_step(StepArena& arena);
void close_step() noexcept;

// While one lives, the calling thread's allocations are served outside its step's arena: for a
// tensor that outlives the step and is made in one step only (a backward graph's seed, a .grad
// made at a first capture). In the arena it would take a slot in that step and in no later one,
// so every allocation after it would move in the next step.
class OutsideStepArena {
 public:
  OutsideStepArena();
  ~OutsideStepArena();
  OutsideStepArena(const OutsideStepArena&) = delete;
  OutsideStepArena& operator=(const OutsideStepArena&) = delete;

 private:
  std::shared_ptr<ArenaState> step_;
};
}  // namespace detail

}  // namespace graphward
