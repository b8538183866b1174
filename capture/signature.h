#pragma once
// Tape signatures (docs/DESIGN.md, "Capture and replay"). A CUDA graph bakes in the backward's
// structure and every pointer its kernels touch, so before any replay the tape of this step is
// summarized and compared with the tape the graph was captured from. Nothing is replayed on a
// mismatch.
//
// A TapeSignature has two parts, both in a canonical order that depends only on the tape's
// structure (a depth-first walk from the roots in root order, each node's inputs in order, nodes
// numbered at first visit):
//   * structure — every node's op, stream and output shape; each input's edge (to which node, to
//     which leaf, or none), shape, dtype and producing stream; each saved tensor's shape and dtype;
//     what the node's backward uses besides tensors and shapes (Note [Node attributes],
//     engine/tape/autograd.h: a scale factor, a window's start, a convolution's stride); each leaf's
//     shape, dtype and whether its .grad exists; the seeds' shapes; the gradient mode.
//     Streams are numbered in order of first appearance, the caller's stream first, so the same
//     model on other streams has the same structure. Equal structures capture to the same graph.
//   * addresses — the data pointer of every saved tensor, every leaf and its .grad, and every seed:
//     what the kernels of a captured graph point at. Same structure, other addresses: the
//     executable can be updated (cudaGraphExecUpdate) instead of captured again.
// Two ways to make one, never equal to each other (the first word says which):
//   * from the step's tape log (Note [Tape log], engine/tape/tape_log.h): the forward appended every
//     node's record as it recorded the tape, numbered in creation order; the signature takes the
//     log's buffers and adds the leaves, seeds, roots and mode — no walk. Used whenever the log
//     can stand for the tape;
//   * by a walk of the tape (the canonical depth-first order below): always correct, and a visit
//     of every node.
// Comparing is two vector compares, so with the log the check costs little next to a launch.
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "graphward/engine/backward/backward_plan.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/engine/tape/tape_log.h"

namespace graphward::capture {

using detail::Words;

struct TapeSignature {
  enum class Source : std::uint8_t { kWalk, kLog };
  Source source = Source::kWalk;
  const char* walk_reason = nullptr;  // kWalk: why the tape log could not be used
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
  // Where the nodes' part of `structure` and `addresses` ends (the leaves, seeds, roots and mode
  // follow; refresh_leaves() makes them again).
  std::size_t nodes_words = 0, nodes_addresses = 0;
  // kLog: the expectation (detail::TapeLog::expect) the nodes' part equals word for word, by the
  // running comparison during the forward; nullptr if none or it did not match.
  const void* nodes_equal_to = nullptr;
  // Per leaf, what its .grad was when last read (not compared; kept from step to step): a .grad
  // that is the same tensor (Tensor::grad_id) of the same leaf is not read again. The memo holds
  // both tensors, so their identities cannot be reused by other tensors meanwhile.
  struct GradMemo {
    Tensor leaf, grad;
    std::uint64_t word = 0;
    std::uintptr_t data = 0;
    Storage* grad_storage = nullptr;  // grad's (nullptr: no .grad): what a replay writes
  };
  std::vector<GradMemo> grad_memo;
  // kLog: every leaf's .grad was the same tensor as at the last signature made into this object
  // (all memo hits); false otherwise, and always for kWalk.
  bool grads_unchanged = false;

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
// The same into `out`, reusing its buffers (what a step loop does: no allocation once warm). Takes
// the calling thread's tape log when it can stand for the tape (and consumes it), else walks.
void tape_signature(TapeSignature& out, const std::vector<Tensor>& roots,
                    const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                    GradWrite grad_write);
// Always by a walk of the tape (`nodes` then holds exactly the nodes the backward reaches).
void tape_signature_walk(TapeSignature& out, const std::vector<Tensor>& roots,
                         const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                         GradWrite grad_write);
// Makes the leaves', seeds', roots' and mode's part of `sig` again (after leaves' .grads changed),
// keeping the nodes' part. The same arguments as the call that made `sig`.
void refresh_leaves(TapeSignature& sig, const std::vector<Tensor>& roots,
                    const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                    GradWrite grad_write);

// Why `now` cannot replay a graph captured from `captured`: the first difference, readable. Empty
// when both structure and addresses are equal.
std::string describe_difference(const TapeSignature& captured, const TapeSignature& now);

}  // namespace graphward::capture
