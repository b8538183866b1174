#include "graphward/engine/runtime/step_arena.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/memory_detail.h"

namespace graphward {

namespace {

// Frees a slot's memory now (the slot is not in use). Errors are logged: called from destructors.
void free_slot_memory(Device device, detail::ArenaSlot& slot) noexcept {
  if (!slot.ptr) return;
  if (device.is_cpu()) {
    detail::host_free(slot.ptr, slot.bytes);
  } else {
#if GRAPHWARD_HAS_CUDA
    try {
      DeviceGuard guard(device);
      for (const auto& ev : slot.released_on) ev->block(slot.stream);  // rule [reuse after use]
      GW_CUDA_CHECK_NOTHROW(cudaFreeAsync(slot.ptr, slot.stream));
    } catch (const std::exception& e) {
      detail::log_error(__FILE__, __LINE__, e.what());
    }
#endif
  }
  slot.ptr = nullptr;
}

// Drops the slots from `from` on: free ones are freed, held ones become their storage's to free.
void drop_slots(detail::ArenaState& st, std::size_t from) noexcept {
  for (std::size_t i = from; i < st.slots.size(); ++i) {
    detail::ArenaSlot& slot = *st.slots[i];
    st.stats.bytes -= slot.bytes;
    if (slot.in_use) {
      slot.orphan = true;
    } else {
      free_slot_memory(st.device, slot);
    }
  }
  st.slots.resize(std::min(from, st.slots.size()));
  st.stats.slots = st.slots.size();
}

}  // namespace

// The slot for the next allocation of the step (`block` bytes on `stream`), in use and ordered
// after its earlier users on the GPU; nullptr when this allocation must be served fresh (its slot
// is still held). Records a new slot past the end.
std::shared_ptr<detail::ArenaSlot> detail::arena_serve(detail::ArenaState& st, std::size_t block,
                                                       cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(st.mutex);
  if (st.cursor < st.slots.size()) {
    const std::shared_ptr<detail::ArenaSlot>& slot = st.slots[st.cursor];
    if (slot->bytes == block && slot->stream == stream) {
      ++st.cursor;
      if (slot->in_use) {  // a tensor of an earlier step still holds it
        ++st.stats.held;
        return nullptr;
      }
#if GRAPHWARD_HAS_CUDA
      if (!st.device.is_cpu()) {
        if (st.step_end_recorded &&
            std::find(st.waited.begin(), st.waited.end(), stream) == st.waited.end()) {
          st.step_end.block(stream);
          st.waited.push_back(stream);
        }
        for (auto& ev : slot->released_on) {
          const bool seen =
              std::any_of(st.waited_events.begin(), st.waited_events.end(),
                          [&](const auto& w) { return w.first == ev && w.second == stream; });
          if (seen) continue;
          ev->block(stream);
          st.waited_events.emplace_back(std::move(ev), stream);
        }
        slot->released_on.clear();
      }
#endif
      slot->in_use = true;
      ++st.stats.served;
      return slot;
    }
    drop_slots(st, st.cursor);  // the step diverged: record the rest anew
    ++st.stats.rerecords;
  }
  auto slot = std::make_shared<detail::ArenaSlot>();
  slot->bytes = block;
  slot->stream = stream;
  if (st.device.is_cpu()) {
    slot->ptr = detail::host_alloc(block, "a step-arena slot");
  } else {
#if GRAPHWARD_HAS_CUDA
    detail::configure_pool_once(st.device.index);
    slot->ptr = detail::malloc_async(st.device, block, stream, false, "a step-arena slot");
#endif
  }
  slot->in_use = true;
  st.slots.push_back(slot);
  st.cursor = st.slots.size();
  st.stats.slots = st.slots.size();
  st.stats.bytes += block;
  ++st.stats.recorded;
  return slot;
}

StepArena::StepArena(Device device) : state_(std::make_shared<detail::ArenaState>(device)) {
  if (device.is_cuda()) check_cuda_device(device, "StepArena");
}

StepArena::~StepArena() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->alive = false;
  drop_slots(*state_, 0);
}

Device StepArena::device() const {
  return state_->device;
}

StepArena::Stats StepArena::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

void StepArena::record_step_end(cudaStream_t stream) {
  if (state_->device.is_cpu()) return;
#if GRAPHWARD_HAS_CUDA
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->step_end.valid()) state_->step_end = Event(state_->device);
  state_->step_end.record(stream);
  state_->step_end_recorded = true;
#else
  (void)stream;
#endif
}

std::shared_ptr<detail::ArenaState> detail::open_step(StepArena& arena) {
  GW_CHECK(!thread_step_arena(),
           "StepScope: a step is already open on this thread; steps do not nest");
  const std::shared_ptr<ArenaState>& state = arena.state_;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->cursor = 0;
#if GRAPHWARD_HAS_CUDA
    state->waited.clear();
    state->waited_events.clear();
#endif
    ++state->stats.steps;
  }
  thread_step_arena() = state;
  return state;
}

void detail::close_step() noexcept {
  thread_step_arena().reset();
}

detail::OutsideStepArena::OutsideStepArena() : step_(std::move(thread_step_arena())) {
  thread_step_arena().reset();
}

detail::OutsideStepArena::~OutsideStepArena() {
  thread_step_arena() = std::move(step_);
}

}  // namespace graphward
