// Storage's stream bookkeeping: which streams used a memory and wrote it last, and the waits a read
// or a write on another stream makes (rules [read after write] and [reuse after use],
// engine/runtime/memory.h); Note [Planned synchronization] and Note [Memory from outside a capture].
#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/memory.h"

namespace graphward {

namespace {
thread_local bool t_planned_sync = false;
thread_local CaptureUseLog* t_capture_uses = nullptr;  // Note [Memory from outside a capture]
std::atomic<std::uint64_t> g_watched_hazards{0};
}  // namespace

PlannedSyncScope::PlannedSyncScope(bool planned) : previous_(t_planned_sync) {
  t_planned_sync = planned;
}
PlannedSyncScope::~PlannedSyncScope() {
  t_planned_sync = previous_;
}

CaptureUsesScope::CaptureUsesScope(CaptureUseLog& log) : previous_(t_capture_uses) {
  t_capture_uses = &log;
}
CaptureUsesScope::~CaptureUsesScope() {
  t_capture_uses = previous_;
}

std::uint64_t detail::watched_hazard_epoch() {
  return g_watched_hazards.load(std::memory_order_acquire);
}

void Storage::new_hazard() const {
  if (watched_) g_watched_hazards.fetch_add(1, std::memory_order_acq_rel);
}

void Storage::log_capture_use(bool wrote) {
  CaptureUseLog& log = *t_capture_uses;
  if (graph_allocation_ || graph_pool_) return;  // the capture's own memory
  for (CaptureUseLog::Use& u : log.uses) {
    if (u.storage.get() == this) {
      u.wrote = u.wrote || wrote;
      return;
    }
  }
  std::shared_ptr<Storage> self = weak_from_this().lock();
  if (self) log.uses.push_back({std::move(self), wrote});
}

bool Storage::wait_logged_outside(cudaStream_t stream, cudaStream_t other) const {
#if GRAPHWARD_HAS_CUDA
  if (!t_capture_uses) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone, other_status = status;
  unsigned long long id = 0, other_id = 0;
  GW_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
  GW_CUDA_CHECK(cudaStreamGetCaptureInfo(other, &other_status, &other_id));
  if (status != cudaStreamCaptureStatusActive ||
      (other_status == cudaStreamCaptureStatusActive && other_id == id)) {
    return false;
  }
  Event e = Event::pooled(device_);  // Note [Event pool]
  e.record(other);
  t_capture_uses->outside.push_back(std::move(e));
  return true;
#else
  (void)stream, (void)other;
  return false;
#endif
}

void Storage::note_use(cudaStream_t stream) {
  if (stream != producer_ && std::find(reads_since_write_.begin(), reads_since_write_.end(),
                                       stream) == reads_since_write_.end()) {
    reads_since_write_.push_back(stream);
    new_hazard();
  }
  if (stream == alloc_stream_) return;
  if (std::find(other_streams_.begin(), other_streams_.end(), stream) == other_streams_.end()) {
    other_streams_.push_back(stream);
  }
}

void Storage::note_write(cudaStream_t stream) {
  note_use(stream);
  if (producer_ != stream) new_hazard();
  producer_ = stream;
  ++writes_;
  reads_since_write_.clear();
}

void Storage::record_use(cudaStream_t stream, bool wrote) {
  if (device_.is_cpu()) return;
  settle();
  if (wrote) {
    note_write(stream);
  } else {
    note_use(stream);
  }
}

void Storage::add_read(cudaStream_t stream, std::shared_ptr<const Event> done) {
  if (device_.is_cpu() || stream == alloc_stream_) return;  // ordered before any reuse already
  for (auto& [s, ev] : fences_) {
    if (s == stream) {  // the newer event covers the older one's work
      ev = std::move(done);
      return;
    }
  }
  fences_.emplace_back(stream, std::move(done));
  new_hazard();
}

void Storage::sync_for_read(cudaStream_t stream) {
  if (device_.is_cpu()) return;
  settle();  // Note [Writes of a replayed graph]: the producer may be a replay's stream
  if (t_capture_uses) log_capture_use(/*wrote=*/false);
  if (stream == producer_) return;
#if GRAPHWARD_HAS_CUDA
  if (t_planned_sync) {  // Note [Planned synchronization]
    note_use(stream);
    return;
  }
  // An event recorded into a stream capture can be waited on only inside that capture, and one
  // recorded outside cannot be waited on inside: while graphward captures (a StepGraph's forward
  // reads across streams here), the event is recorded for this read alone and not kept.
  const bool in_capture = capturing();
  if (in_capture &&
      wait_logged_outside(stream, producer_)) {  // Note [Memory from outside a capture]
    note_use(stream);
    return;
  }
  // A stream that already waited for this write outside a capture is ordered after it: a reader's
  // stream (a branch reading a parameter at every layer, every step) waits once a write, not once
  // a read.
  if (!in_capture && event_for_write_ == writes_ &&
      std::find(waited_for_write_.begin(), waited_for_write_.end(), stream) !=
          waited_for_write_.end()) {
    note_use(stream);
    return;
  }
  if (event_for_write_ != writes_ || in_capture) {
    if (!producer_event_.valid()) producer_event_ = Event::pooled(device_);  // Note [Event pool]
    producer_event_.record(producer_);
    event_for_write_ = in_capture ? UINT64_MAX : writes_;
    waited_for_write_.clear();
  }
  producer_event_.block(stream);
  if (!in_capture) waited_for_write_.push_back(stream);
  note_use(stream);
#endif
}

void Storage::sync_for_write(cudaStream_t stream) {
  if (device_.is_cpu()) return;
#if GRAPHWARD_HAS_CUDA
  settle();
  if (t_capture_uses) log_capture_use(/*wrote=*/true);
  if (t_planned_sync) {  // Note [Planned synchronization]
    note_write(stream);
    return;
  }
  // Read-after-write and write-after-write with the producer, and write-after-read with the
  // producer's own reads, which are not recorded (its stream orders them after its write): so a
  // fresh event on the producer's stream, never the one an earlier read of this write waited for —
  // that one was recorded before the reads the producer issued since (a parameter read on a branch,
  // then read again on its own stream, then written on the branch).
  // Note [Memory from outside a capture]: inside a StepGraph's capture, a wait for a stream outside
  // it is logged instead, here and below.
  const bool in_capture = capturing();
  if (stream != producer_) {
    if (!in_capture || !wait_logged_outside(stream, producer_)) {
      if (!producer_event_.valid()) producer_event_ = Event::pooled(device_);  // Note [Event pool]
      producer_event_.record(producer_);
      producer_event_.block(stream);
    }
    event_for_write_ = UINT64_MAX;  // this write's readers record their own
    waited_for_write_.clear();
  }
  // Write-after-read with the streams that read it since the last write. The readers before that
  // write are ordered before it, so before this one (which waits for the producer): waiting for
  // them again would tie the write to streams that used the memory long ago — inside a capture,
  // to streams outside it (a parameter broadcast on a ProcessGroup's stream, then updated by a
  // StepGraph's optimizer: cudaErrorStreamCaptureIsolation).
  for (cudaStream_t s : reads_since_write_) {
    if (s == stream || s == producer_) continue;
    if (!in_capture || !wait_logged_outside(stream, s)) stream_wait_stream(device_, stream, s);
  }
  for (const auto& [s, ev] : fences_) {  // replays' reads (recorded outside any capture)
    if (s == stream) continue;
    if (in_capture && t_capture_uses) {
      t_capture_uses->fences.push_back(ev);
    } else {
      ev->block(stream);
    }
  }
  // The allocating stream is not waited for: it was the first producer (the first write waited
  // for it, and every write since waited for the one before).
  note_write(stream);
#else
  (void)stream;
#endif
}

}  // namespace graphward
