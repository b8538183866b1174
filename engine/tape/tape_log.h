#pragma once
// Note [Tape log]
// A replayed backward must prove, every step, that this step's tape is the one its graph was
// captured from (capture/signature.h). Walking a 200-node tape to prove it costs the host the
// time of several graph launches. So the proof is built while the forward records the tape, when
// every node's data is at hand anyway: while a BackwardGraph is alive on a thread, each node that
// thread creates appends its record (Note [Node record]) to the thread's tape log, with its
// producers, streams and leaves numbered in creation order (first appearance), and its saved
// tensors' addresses. At the backward, the log *is* the structure and addresses of the step's
// tape, and the signature check is a compare of two flat buffers — no walk. A leaf's dtype, shape
// and data (which never change) are logged at its first use too; only the leaves' .grads, which
// may change until the backward, are read at the backward (capture/signature.cpp). Better still,
// each appended record is compared at once with the same place of the signature the last replay
// used
// (`expect`): when the whole log matched it, the check before the replay compares only the leaves,
// seeds, roots, mode and addresses.
//
// The log stands for the tape only when nothing escaped it; otherwise the signature falls back to
// the walk, which is always correct (and says why in the signature's `source_note`):
//   * a logged node's producer was created before the log began (a tensor kept from an earlier
//     step, or made on another thread): "an input came from before the step";
//   * the root's node is not in the log (the forward ran on another thread, or before the reset);
//   * a tape mutation since the reset: a storage that a live node saved was modified in place, or
//     a logged node's saved tensors were released (a backward ran) — the walk checks these and
//     raises the errors backward() would;
//   * the log grew beyond its cap (kMaxWords), or was already consumed by a signature.
// The log is reset when a step begins (StepScope) and after every BackwardGraph::backward; it may
// hold nodes the backward does not reach (they make the signature conservative, never wrong: the
// tape reachable from the root is a function of the log).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/ptr_index.h"
#include "graphward/engine/runtime/tensor.h"

namespace graphward {

class Node;

namespace detail {

// A std::allocator that leaves new elements uninitialized: signature words are all written right
// after the vector grows, and zeroing them first cost as much as writing them.
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Words = std::vector<std::uint64_t, UninitAllocator<std::uint64_t>>;

// Who owns an address of a signature (for readable reasons): kind, index (node or leaf), j.
enum AddressOwnerKind : std::uint32_t {
  kOwnerSaved = 1,
  kOwnerLeafData = 2,
  kOwnerLeafGrad = 3,
  kOwnerSeed = 4
};
inline std::uint32_t address_owner(AddressOwnerKind kind, std::uint32_t index, std::uint32_t j) {
  return (static_cast<std::uint32_t>(kind) << 28) | ((index & 0xFFFFF) << 8) | (j & 0xFF);
}

// The first word of a signature: how it was made (a log's and a walk's numberings differ, so the
// two kinds never compare equal).
inline constexpr std::uint64_t kLogSignatureTag = 0x4c4f47;     // "LOG"
inline constexpr std::uint64_t kWalkSignatureTag = 0x57414c4b;  // "WALK"
// Opens a leaf's record: its dtype and shape (in the log: after the record of the node that first
// used it; in a walk's signature: after all the nodes).
inline constexpr std::uint64_t kLeafRecordTag = 0x4c454146;  // "LEAF"

struct TapeLog {
  static constexpr std::size_t kMaxWords = std::size_t{1} << 22;  // 32 MiB of records
  int armed = 0;                   // BackwardGraphs that asked for the log on this thread
  std::uint64_t epoch = 0;         // logged nodes carry it (Node::log_epoch)
  const char* unusable = nullptr;  // why the log cannot stand for the tape (nullptr: it can)
  std::uint64_t mutations_at_reset = 0;
  Words words;  // kLogSignatureTag, then the nodes' records, patched, in creation order
  std::vector<std::uint32_t> node_offsets;  // where each node's record starts in `words`
  std::vector<const std::string*> ops;      // each node's interned op name
  // Saved tensors' data pointers, node by node, and each leaf's after the node that first used it.
  std::vector<std::uintptr_t> addresses;
  std::vector<std::uint32_t> address_owners;  // address_owner(kOwnerSaved, node, j), ...
  std::vector<Node*> nodes;                   // creation order
  std::vector<cudaStream_t> streams;          // numbered by first appearance
  std::vector<Tensor> leaves;                 // numbered by first appearance
  PtrIndex leaf_index{16};                    // a leaf's .grad slot -> its number
  // The running comparison: the nodes' part of the signature the last backward on this thread
  // replayed (set by tape_log_expect), and whether every node logged since the reset matched it
  // word for word. Then the check before a replay compares only the small rest (leaves, seeds,
  // roots, mode) and the addresses: the forward did the rest, a node at a time.
  std::shared_ptr<const Words> expect;
  bool on_track = false;
  // The step the logged nodes belong to (Note [Reads of a replayed step], engine/runtime/memory.h): a new
  // one at every reset.
  std::shared_ptr<StepReads> reads;
};

// This thread's log.
TapeLog& tape_log();
// Empties this thread's log and starts a new epoch (a no-op unless armed).
void tape_log_reset();
// A BackwardGraph on this thread wants the log (arm) or no longer does (disarm; the log is emptied
// when none does).
void tape_log_arm();
void tape_log_disarm();
// The nodes' part of the signature the next step is expected to have (nullptr: none).
void tape_log_expect(std::shared_ptr<const Words> nodes_part);
// Appends `node` to this thread's log if armed (called by the Node constructor).
void tape_log_append(Node& node);
// tape_mutations() (engine/runtime/memory.h) counts what makes a logged tape stale (Note [Tape log]).
// Whether the log can stand for a tape rooted at `root` now; if not, why.
const char* tape_log_unusable_for(const Node* root);

}  // namespace detail
}  // namespace graphward
