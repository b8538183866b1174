#pragma once
// Memory owners.
//
// DeviceBuffer: a plain cudaMalloc'd block (workspaces, persistent buffers); freed with cudaFree.
// Storage: the memory behind tensors, stream-ordered (Note [Stream-ordered memory]).
//
// Note [Stream-ordered memory]
// CUDA storage is allocated with cudaMallocAsync on the current stream of its device (the CUDA
// runtime's memory pool, kept warm with an unlimited release threshold) and freed with
// cudaFreeAsync on that same stream. A Storage remembers the last stream that wrote it (its
// producer) and every other stream that used it:
//   * a read on stream S != producer makes S wait on an event recorded on the producer, recorded
//     lazily: once per write, only when another stream reads (rule [read after write]);
//   * a write on stream S waits for the producer and for every other stream that read it;
//   * the free first makes the allocating stream wait for every other stream that used the memory,
//     so the pool never hands it out while another stream may still use it (rule [reuse after
//     use]).
// CPU storage is plain aligned host memory; none of the stream bookkeeping applies to it.
//
// Note [Block cache]
// Memory used only on the stream that allocated it — most of a step's activations and gradients —
// is not returned to the CUDA pool when freed: it goes to a per-device cache keyed by (stream,
// size), and the next allocation of that size on that stream takes it with no CUDA call at all (a
// cudaMallocAsync/cudaFreeAsync pair costs host time on every allocation, and more in some pool
// states: docs/DECISIONS.md, "a block cache in front of the CUDA pool").
// Reuse needs no event: every earlier use was on that stream, so later work there is ordered after
// it — the reasoning cudaMallocAsync itself applies to same-stream reuse. Memory used on another
// stream first makes its own stream wait for that one (rule [reuse after use]: an event recorded
// there, Note [Event pool]); from then on the same holds and it goes to the cache too (a
// cross-stream gradient of a multistream backward no longer costs a cudaFreeAsync and a
// cudaMallocAsync every step). The cache is bypassed while the stream is being captured into a CUDA
// graph (graph memory belongs to the graph) and for streams graphward did not create (a raw stream
// may be destroyed and its handle reused). It holds at most block_cache_limit() bytes per device;
// empty_cache() returns its blocks to the pool, and process exit does.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/engine/runtime/stream.h"

namespace graphward {

class Storage;
namespace detail {
struct ArenaSlot;
struct ArenaState;
struct GraphPoolState;
class JoinedFrees;

// Note [Reads of a replayed step]
// A replayed backward reads the step's saved tensors on the caller's stream, and then releases
// them. Done tensor by tensor on the caller's thread — a read recorded on each saved storage
// (rule [reuse after use]: its free waits for the graph; rule [read after write]: a later writer on
// another stream waits for it), each node marked released, each storage's count of the nodes that
// saved it lowered — that is most of a 200-node replay's host time (docs/RESULTS.md). Instead the
// step's nodes share one StepReads (made when the tape log begins a step, Note [Tape log]), and
// each storage a node of the step saved points to it and counts the saves it made. A replay that
// reaches every node of the step fills it in once: the stream, the event its graph records at its
// end (Note [A replay's fence], capture/stream_capture.h; none when every saved storage was
// allocated on that stream: a read there is ordered before any reuse anyway), `replayed`. From then
// on the step's nodes read as released (Node::released), and each storage applies the read the next
// time its bookkeeping is consulted (a write, a free, a hazard query: Storage::settle), on
// whichever thread holds it — the release worker for the activations it drops last, the caller's
// thread for a parameter the optimizer writes. The saved tensors are dropped on the release worker
// (Note [Deferred release]). Where the step cannot be answered for as a whole, a replay goes node
// by node: a node of the step released or destroyed on its own (`partial`), a storage that a node
// of a later step saved before this step was replayed (`lost`: it can keep track of one step), a
// node the backward does not reach, a signature walked instead of logged.
struct StepReads {
  std::atomic<bool> replayed{false};   // set once, after the fields below
  cudaStream_t stream = nullptr;       // the replay's (caller's) stream
  std::shared_ptr<const Event> fence;  // recorded on `stream` by the replay, or none
  // Written on the thread that records the step's nodes, read by its replay (the same thread).
  bool partial = false;
  bool lost = false;
  bool any_saved = false;
  bool mixed_streams = false;           // saved storages allocated on more than one stream
  cudaStream_t alloc_stream = nullptr;  // the one they were allocated on, if not mixed
  // Note [Backwards sharing a tape] (engine/tape/autograd.cpp): a replay of the whole step claims it at
  // once (`claimed`); a backward claiming nodes of the step one by one counts them here.
  std::atomic<bool> claimed{false};
  std::atomic<int> node_claims{0};
};

// Note [Writes of a replayed graph]
// A replayed backward writes every .grad it reaches on the caller's stream. Recorded on each
// .grad's storage after every launch (its producer, its count of writes, its readers since), that
// is one storage touched per leaf per step, the largest part of what a replay of many parameters
// does after its launch. Instead the storages a BackwardGraph wrote follow one GraphWrites: once
// written and watched directly, each is told to follow it (Storage::follow_graph_writes); a later
// replay over the same .grads only sets the stream and bumps `epoch`, and each storage applies
// "written on `stream`" the next time its bookkeeping is consulted (Storage::settle: a read, a
// write, a hazard query, its free). Several replays between two consultations count as one
// write, on the last replay's stream: each replay's launch is ordered after the one before it
// (graphs of one BackwardGraph launched on another stream wait for the last launch), so a reader
// that waits for the last stream waits for every earlier write. A BackwardGraph whose .grads
// change makes a new GraphWrites; the old one is never bumped again, so a storage that no longer
// is a .grad of it is not written by its replays. A storage follows one GraphWrites at a time:
// told to follow another (a second BackwardGraph over shared parameters), it marks the one it
// left `abandoned`, and that BackwardGraph's next replay writes its .grads directly again.
struct GraphWrites {
  std::atomic<std::uint64_t> epoch{0};
  std::atomic<cudaStream_t> stream{nullptr};
  std::atomic<bool> abandoned{false};  // a storage that followed it follows another now
};

// Counts tape mutations (Note [Tape log], engine/tape/tape_log.h): in-place writes to a storage a tape
// node saved (Storage::bump_version), releases of logged nodes. Process-wide. Kept here, below the
// tape, so that a storage counts its own writes.
std::atomic<std::uint64_t>& tape_mutations();
}  // namespace detail

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device device, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_ = Device::cuda(0);
};

namespace detail {
// Note [Frees during a capture]: releases the storage whose last handle died while one of its
// streams was being captured, once none of its streams is; called at the end of each graphward
// capture, by the next allocation outside a capture, and by empty_cache. Returns how many remain
// deferred.
std::size_t release_deferred_storage() noexcept;
}  // namespace detail

class Storage : public std::enable_shared_from_this<Storage> {
 public:
  // Allocates `bytes` on `device`; for CUDA, stream-ordered on `stream`, which becomes the
  // producer.
  static std::shared_ptr<Storage> allocate(Device device, std::size_t bytes, cudaStream_t stream);
  static std::shared_ptr<Storage> allocate_cpu(std::size_t bytes);
  // Note [Borrowed storage]: `bytes` at `data` on CUDA `device`, memory that `owner` owns (a
  // part of a larger block): the storage keeps `owner` alive and frees nothing itself, the owner
  // frees the block when its last user lets go (a cudaFree, which waits for the device). The
  // stream bookkeeping is a storage's like any other; `stream` is the allocating stream and the
  // first producer (the one that wrote `data` last). Data-parallel gradients live in their
  // bucket's flat buffer this way (Note [Gradients in buckets], dist/process_group.h).
  // When the last handle goes, `stream` first waits for every other stream that used the memory
  // and — an owner that is a Storage itself (a view at an offset into a tensor's memory) — the
  // owner records a use on `stream`: the owner's own free is then ordered after every use made
  // through the borrowed storage (rule [reuse after use]).
  static std::shared_ptr<Storage> borrow(Device device, void* data, std::size_t bytes,
                                         cudaStream_t stream, std::shared_ptr<const void> owner);
  static std::shared_ptr<Storage> borrow(Device device, void* data, std::size_t bytes,
                                         cudaStream_t stream, std::shared_ptr<Storage> owner);
  // Note [Adopted storage]: `bytes` at `data` that another library owns and reuses in stream
  // order on `stream` once released (a DLPack tensor, engine/runtime/dlpack.h): as borrow(), and when the
  // last handle goes, `stream` first waits for every other stream that used the memory (rule [reuse
  // after use]) and only then is `owner` let go. CPU memory too (`stream` null): then `owner`
  // simply goes.
  static std::shared_ptr<Storage> adopt(Device device, void* data, std::size_t bytes,
                                        cudaStream_t stream, std::shared_ptr<const void> owner);
  bool borrowed() const { return owner_ != nullptr; }
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Bumped by every in-place write; autograd compares it with the version it saved.
  std::uint64_t version() const { return version_; }
  // An in-place write to memory a live node saved is a tape mutation (Note [Tape log]).
  void bump_version();
  // A node saved (+1) or released (-1) a tensor of this storage.
  void note_saved(int delta) const { saves_.fetch_add(delta, std::memory_order_relaxed); }
  // Note [Leaves shared across threads] (engine/backward/eager_executor.cpp): a backward holds the claim
  // on each leaf it writes the .grad of (this storage is the leaf's) while it runs. try_claim takes
  // it if free; claim waits for it; release gives it back and wakes a waiter.
  bool try_claim_grad() const { return !grad_claim_.exchange(true, std::memory_order_acquire); }
  void claim_grad() const {
    while (grad_claim_.exchange(true, std::memory_order_acquire)) {
      grad_claim_.wait(true, std::memory_order_relaxed);
    }
  }
  void release_grad_claim() const {
    grad_claim_.store(false, std::memory_order_release);
    grad_claim_.notify_all();
  }
  // Note [Reads of a replayed step]: a node of `step` saved a tensor of this storage (after
  // note_saved(+1)); a node of `step` gave it up on its own (a substituted saved tensor).
  void note_step_save(const std::shared_ptr<detail::StepReads>& step) const;
  void forget_step_save(const detail::StepReads* step) const;
  // Applies a replayed step's read of this storage, if one is pending. Called by every member
  // below that reads or changes the bookkeeping.
  void settle() const {
    if (step_reads_ && step_reads_->replayed.load(std::memory_order_acquire)) settle_step_reads();
    if (graph_writes_ &&
        graph_writes_->epoch.load(std::memory_order_acquire) != graph_writes_seen_) {
      settle_graph_writes();
    }
  }
  // Note [Writes of a replayed graph]: from now on each bump of `writes`' epoch is a write of
  // this memory on `writes`' stream (applied by settle). Replaces the GraphWrites it followed.
  // CUDA only.
  void follow_graph_writes(std::shared_ptr<detail::GraphWrites> writes);
  // Whether a recorded op produced this memory (an activation), as opposed to data that entered
  // the tape from outside (a batch, targets, a constant): Note [Input slots],
  // capture/backward_graph.h.
  void mark_recorded() { recorded_ = true; }
  bool recorded() const { return recorded_; }

  // The stream whose work last wrote this memory (nullptr for CPU storage).
  cudaStream_t producer_stream() const {
    settle();
    return producer_;
  }
  // Prepare a read on `stream`: wait for the producer if it is another stream.
  void sync_for_read(cudaStream_t stream);
  // Prepare a write on `stream`: wait for the producer and the streams that read it since the
  // last write (earlier readers are ordered before that write); `stream` becomes producer.
  void sync_for_write(cudaStream_t stream);
  // Work on `stream` that this storage did not see used its memory — a replayed CUDA graph launched
  // on `stream` read it, or wrote it (`wrote`: `stream` becomes the producer). Records the use for
  // rule [reuse after use] (the free waits for `stream`) and rule [read after write] (later readers
  // wait for `stream`); no wait.
  void record_use(cudaStream_t stream, bool wrote);
  // The same, for a read by work that `done` (an event recorded on `stream` after that work)
  // completes: later writers on other streams and the free wait for `done` instead of recording an
  // event of their own on `stream` (no CUDA call here; one event can cover a whole step's
  // storages). A newer fence on the same stream replaces an older one. CUDA only.
  void record_read(cudaStream_t stream, std::shared_ptr<const Event> done) {
    settle();
    add_read(stream, std::move(done));
  }
  // Whether every use of this memory so far (allocation, writes, reads) was on `stream` (always
  // true on the CPU). Only then may work on `stream` overwrite it without any wait, even where the
  // plan orders nothing: e.g. an in-place gradient while other branches may still read the memory.
  // Calls f(stream) for every stream whose work a new write must wait for (rule [read after
  // write]): the last writer (at first, the allocating stream) and every stream that read the
  // memory since (CUDA; nothing on the CPU). Streams may repeat.
  template <class F>
  void for_each_write_hazard(F&& f) const {
    if (device_.is_cpu()) return;
    settle();
    f(producer_);
    for (cudaStream_t s : reads_since_write_) f(s);
    for (const auto& fence : fences_) f(fence.first);
  }
  // A BackwardGraph writes this memory at every replay (a leaf's .grad): from now on, every new
  // write hazard on it (a reader since the last write, a writer on another stream) bumps
  // watched_hazard_epoch(), so that a replay can skip looking for hazards when none appeared.
  void watch() { watched_ = true; }
  bool used_only_on(cudaStream_t stream) const {
    if (device_.is_cpu()) return true;
    settle();
    return alloc_stream_ == stream && producer_ == stream && other_streams_.empty() &&
           fences_.empty();
  }

 private:
  Storage(Device device, void* data, std::size_t bytes, cudaStream_t stream);
  // The bookkeeping of a use on `stream` (no wait): the streams that used the memory and read it
  // since its last write; note_write also makes `stream` the producer of a new write.
  void note_use(cudaStream_t stream);
  void note_write(cudaStream_t stream);
  // Note [Memory from outside a capture]: inside a CaptureUsesScope, logs this use (`wrote`:
  // a write) unless the capture allocated this memory.
  void log_capture_use(bool wrote);
  // Whether `other`'s work is outside the capture `stream` belongs to: then the wait is logged
  // (an event recorded on `other` now) and true is returned; false: wait inside the capture.
  bool wait_logged_outside(cudaStream_t stream, cudaStream_t other) const;
  // A block served by a step arena goes back to it; false if this storage must free it itself.
  bool release_to_arena() noexcept;
  // Note [Frees during a capture]: true if alloc_stream_ or a stream that used it is capturing.
  bool capturing_a_user() const noexcept;
  // Hands the block (and what orders its release) to a new Storage on the deferred list; false
  // if it could not (out of host memory).
  bool defer_release() noexcept;
  friend std::size_t detail::release_deferred_storage() noexcept;
  friend class detail::JoinedFrees;

  Device device_;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t block_bytes_ = 0;    // the block's size (bytes_ rounded up)
  bool cacheable_ = false;         // may go to the block cache when freed (Note [Block cache])
  bool graph_allocation_ = false;  // allocated inside a capture (an allocation node's memory)
  std::shared_ptr<detail::ArenaSlot> slot_;    // the step-arena slot it was served from, if any
  std::shared_ptr<detail::ArenaState> arena_;  // that slot's arena (Note [Step arena])
  std::shared_ptr<detail::GraphPoolState> graph_pool_;  // Note [Graph memory pool]: its owner
  std::shared_ptr<const void> owner_;  // Note [Borrowed storage]: what owns the memory
  Storage* owner_storage_ = nullptr;   // owner_, when it is a Storage (borrow's second form)
  bool release_in_order_ =
      false;  // Note [Adopted storage]: owner_ goes after rule [reuse after use]'s waits
  // Rule [reuse after use] for the free: alloc_stream_ waits for every other stream that used the
  // memory (on the current device); false, with the reason logged, if it could not.
  bool order_after_users() noexcept;
  std::uint64_t version_ = 0;
  mutable std::atomic<int> saves_{0};            // live nodes that saved a tensor of this storage
  mutable std::atomic<bool> grad_claim_{false};  // try_claim_grad()
  // Note [Reads of a replayed step]: the step whose nodes saved it last, and how many of its
  // saves_ are theirs (given back when the step's read is settled).
  mutable std::shared_ptr<detail::StepReads> step_reads_;
  mutable int step_saves_ = 0;
  void settle_step_reads() const;
  // Note [Writes of a replayed graph]: what it follows, and the epoch it applied last.
  mutable std::shared_ptr<detail::GraphWrites> graph_writes_;
  mutable std::uint64_t graph_writes_seen_ = 0;
  void settle_graph_writes() const;
  void add_read(cudaStream_t stream, std::shared_ptr<const Event> done);
  cudaStream_t alloc_stream_ = nullptr;
  cudaStream_t producer_ = nullptr;
  Event producer_event_;                         // created on the first cross-stream read
  std::uint64_t writes_ = 0;                     // number of writes so far
  std::uint64_t event_for_write_ = UINT64_MAX;   // the write the event was recorded after
  std::vector<cudaStream_t> waited_for_write_;   // streams that waited on that event (no capture)
  std::vector<cudaStream_t> other_streams_;      // streams other than alloc_stream_ that used it
  std::vector<cudaStream_t> reads_since_write_;  // streams other than producer_ that read it since
  bool watched_ = false;                         // watch()
  bool recorded_ = false;                        // mark_recorded()
  void new_hazard() const;                       // bumps the epoch if watched
  // Reads by work that an event completes (record_read): (the event's stream, the event).
  std::vector<std::pair<cudaStream_t, std::shared_ptr<const Event>>> fences_;
};

namespace detail {
// Bumped by every new write hazard on a watched storage (Storage::watch).
std::uint64_t watched_hazard_epoch();

// Note [Frees at the join]
// Memory that several streams used is freed by making its allocating stream wait for the others:
// an event recorded on each other stream and a wait, two CUDA calls a stream, on the freeing
// thread. An eager backward on several streams frees such memory during its run — the gradient a
// branch's first step consumed from the caller's stream, the activation of a branch that the loss
// read — and those calls were most of what a second stream cost it where there was nothing to
// overlap. A JoinedFrees scope, opened on the executor's thread for the run, takes those blocks
// instead, when every stream that used one is a stream the backward joins at its end (or the
// caller's), and gives them back to the block cache after the join: the join's waits order every
// use before the caller's stream's point after it, and each allocating stream other than the
// caller's waits for that point once — one event and a wait a stream, no call per tensor. The
// memory is reused after the backward rather than during it (it was used across streams: usually
// a few tensors), and work enqueued later on a branch stream starts after the backward's join.
// Left without joined() (an error in the run), the scope makes the caller's stream wait for each
// joined stream first. Inactive in a capture and with the cache off: frees go as before.
// An eager backward whose steps all moved onto the caller's stream (Note [Streams of an eager
// backward], engine/backward/backward_plan.h) joins nothing, but reads there the memory its forward
// streams allocated: the scope also takes a block allocated on one of those `moved` streams when
// every other stream that used it is the caller's or a joined one (the moved stream itself is not
// joined, so its block must not have been used on another moved stream), and gives it back the
// same way.
class JoinedFrees {
 public:
  // `moved` must outlive the scope.
  JoinedFrees(Device device, cudaStream_t caller, const std::vector<cudaStream_t>& joined,
              const std::vector<cudaStream_t>& moved);
  ~JoinedFrees();
  JoinedFrees(const JoinedFrees&) = delete;
  JoinedFrees& operator=(const JoinedFrees&) = delete;
  // Call once the caller's stream has waited on every joined stream: the blocks go to the cache.
  void joined();
  // Storage's destructor: true if the scope took its block (every user a joined stream).
  bool take(const Storage& storage);

 private:
  void give_back() noexcept;
  Device device_;
  cudaStream_t caller_ = nullptr;
  std::vector<cudaStream_t> joined_;                  // the caller's stream first
  const std::vector<cudaStream_t>* moved_ = nullptr;  // the caller's (outlives the scope)
  struct Block {
    void* data;
    std::size_t bytes;
    cudaStream_t stream;  // its allocating stream
  };
  std::vector<Block> blocks_;
  bool active_ = false;
  bool done_ = false;
  JoinedFrees* previous_ = nullptr;
};
}  // namespace detail

// ---- host memory (Note [Host memory], allocation.cpp)
// ------------------------------------------------ Bytes of host memory graphward's CPU tensors
// (and CPU step arenas) hold now, and the most they held since the process began or the last
// reset_host_peak_bytes() (which sets it to now).
std::size_t host_bytes_in_use();
std::size_t host_peak_bytes();
void reset_host_peak_bytes();
// The most bytes of host memory they may hold (default: no limit, SIZE_MAX). An allocation past
// it throws OutOfMemoryError, as one the system refuses does; lowering it frees nothing.
void set_host_memory_limit(std::size_t bytes);
std::size_t host_memory_limit();

// ---- the block cache (Note [Block cache]) -------------------------------------------------------
// Bytes the cache holds for `device`.
std::size_t cached_bytes(Device device);
// Returns every cached block of `device` to the CUDA pool (stream-ordered on its stream).
void empty_cache(Device device);
// The most the cache holds per device (default 4 GiB); 0 turns caching off. Blocks beyond it go
// back to the pool.
void set_block_cache_limit(std::size_t bytes);
std::size_t block_cache_limit();

// Note [Planned synchronization]
// Inside a PlannedSyncScope the caller has ordered every access with explicit events (a backward
// plan does: rules [forward stream], [cross-stream gradients] and [fork and join]), so storage
// inserts no waits of its own: reads and writes only record which streams used the memory (rule
// [reuse after use] still holds) and who wrote it last. Outside, each op waits for whatever it
// reads or writes (rule [read after write]). A scope made with `planned` false turns it off again
// inside one (work the plan did not order: an optimizer step in the backward).
class PlannedSyncScope {
 public:
  explicit PlannedSyncScope(bool planned = true);
  ~PlannedSyncScope();
  PlannedSyncScope(const PlannedSyncScope&) = delete;
  PlannedSyncScope& operator=(const PlannedSyncScope&) = delete;

 private:
  bool previous_;
};

// Note [Memory from outside a capture]
// A capturing stream cannot wait for an event recorded on a stream outside its capture
// (cudaErrorStreamCaptureIsolation), yet a captured step uses memory whose last writer or readers
// ran outside it: a learning rate set on the default stream while the step is captured on
// another, parameters the last replays wrote on another stream, parameters a StepInBackward
// stepped on its stream in the warm-up (Note [Optimizer steps in the backward], engine/backward/optim.h).
// Inside a CaptureUsesScope (a StepGraph's capture) storage logs every memory the capture uses and
// did not allocate, and whether it wrote it; a wait that would reach out of the capture is not
// made: an event is recorded on the outside stream instead (recording there is allowed) and kept
// in the log. The graph's owner orders its launches as the step's ops would have been: before the
// first, its stream waits for those events; before every launch it waits for each logged memory's
// writer and, for memory the graph writes, its readers (sync_for_read / sync_for_write on the
// launch stream); after it, the uses are recorded on the launch stream (record_use) — so a reader
// of the optimizer's state after the replays orders itself after them, whichever of the step's
// streams wrote the state inside the capture. Without a scope such a wait is made, and the capture
// fails as CUDA says.
struct CaptureUseLog {
  struct Use {
    std::shared_ptr<Storage> storage;
    bool wrote = false;
  };
  std::vector<Use> uses;  // each storage once
#if GRAPHWARD_HAS_CUDA
  std::vector<Event> outside;  // recorded on streams outside the capture, at the waits not made
  std::vector<std::shared_ptr<const Event>> fences;  // replays' fences not waited on
#endif
};
// Logs the calling thread's storage uses into `log` for the scope (scopes do not nest: the inner
// one replaces the outer one for its lifetime).
class CaptureUsesScope {
 public:
  explicit CaptureUsesScope(CaptureUseLog& log);
  ~CaptureUsesScope();
  CaptureUsesScope(const CaptureUsesScope&) = delete;
  CaptureUsesScope& operator=(const CaptureUsesScope&) = delete;

 private:
  CaptureUseLog* previous_;
};

namespace debug {
// When on, every new allocation is filled with 0xFF bytes (a NaN in float32 and float64), so an
// element a kernel forgot to write shows up as NaN. Off by default; GRAPHWARD_POISON=1 turns it on.
void set_poison_new_memory(bool on);
bool poison_new_memory();
}  // namespace debug

}  // namespace graphward
