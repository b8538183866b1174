#pragma once
// Tape signatures (DESIGN.md, "Capture and replay"). A CUDA graph bakes in the backward's structure
// and every pointer its kernels touch, so before any replay the tape of this step is summarized and
// compared with the tape the graph was captured from. Nothing is replayed on a mismatch.
//
// A TapeSignature has two parts, both in a canonical order that depends only on the tape's
// structure (a depth-first walk from the roots in root order, each node's inputs in order, nodes
// numbered at first visit):
//   * structure — every node's op, stream and output shape; each input's edge (to which node, to
//     which leaf, or none), shape, dtype and producing stream; each saved tensor's shape and dtype;
//     each leaf's shape, dtype and whether its .grad exists; the seeds' shapes; the gradient mode.
//     Streams are numbered in order of first appearance, the caller's stream first, so the same
//     model on other streams has the same structure. Equal structures capture to the same graph.
//   * addresses — the data pointer of every saved tensor, every leaf and its .grad, and every seed:
//     what the kernels of a captured graph point at. Same structure, other addresses: the
//     executable can be updated (cudaGraphExecUpdate) instead of captured again.
// Computing one is a walk of the tape — no plan is built — and comparing is two vector compares, so
// the check costs little next to a graph launch.
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/backward_plan.h"

namespace graphward::capture {

// A std::allocator that leaves new elements uninitialized: the signature's words are all written
// right after the vector grows, and zeroing them first cost as much as writing them.
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

struct TapeSignature {
  Words structure;
  std::vector<std::uintptr_t> addresses;
  std::uint64_t structure_hash = 0;
  std::uint64_t address_hash = 0;

  // For readable reasons (not compared): where each node's record starts in `structure`, each
  // node's op (interned: valid after the tape is gone), and for each address who owns it (see
  // address_owner_str()).
  std::vector<std::uint32_t> node_offsets;
  std::vector<const std::string*> ops;
  std::vector<std::uint32_t> address_owners;
  // This step's streams in numbering order (streams[0]: the caller's) and nodes in canonical order:
  // handles for the step that computed the signature (waits before a replay, releasing the saved
  // tensors after it). Not compared; meaningless once the tape is gone.
  std::vector<cudaStream_t> streams;
  std::vector<Node*> nodes;
  std::vector<Tensor> leaves;  // in leaf numbering order

  int num_nodes() const { return static_cast<int>(node_offsets.size()); }
  bool same_structure(const TapeSignature& o) const {
    return structure_hash == o.structure_hash && structure == o.structure;
  }
  bool same_addresses(const TapeSignature& o) const {
    return address_hash == o.address_hash && addresses == o.addresses;
  }
  // Node `i` of the canonical order, readable: "relu on s1 -> [64, 256] (in0: node 4 float32
  // [64, 256] from s1; saved: float32 [64, 256])".
  std::string describe_node(int i) const;
  // "saved tensor 0 of node 5 (linear)", "the .grad of leaf 3", "seed 0", ...
  std::string address_owner_str(std::size_t address_index) const;
};

// The signature of the backward of `roots` with `seeds` (empty: scalar roots, seeds made by the
// backward) called on `caller_stream`, writing leaf gradients by `grad_write`. Apart from `streams`
// and `nodes`, a signature holds no reference into the tape: it stays comparable after the tape is
// gone. Checks, as backward() does, that no node was released and no saved tensor was modified in
// place since it was saved. Throws what backward() would
// throw for an invalid tape (a released graph, a root that needs no grad).
TapeSignature tape_signature(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds,
                             cudaStream_t caller_stream, GradWrite grad_write);
// The same into `out`, reusing its buffers (what a step loop does: no allocation once warm).
void tape_signature(TapeSignature& out, const std::vector<Tensor>& roots,
                    const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                    GradWrite grad_write);

// Why `now` cannot replay a graph captured from `captured`: the first difference, readable. Empty
// when both structure and addresses are equal.
std::string describe_difference(const TapeSignature& captured, const TapeSignature& now);

}  // namespace graphward::capture
