#include "graphward/capture/signature.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <functional>
#include <sstream>

#include "graphward/engine/runtime/math_mode.h"
#include "graphward/engine/runtime/ptr_index.h"

namespace graphward::capture {

namespace {

// Record tags: they make a record self-describing for describe_node() and keep two different
// layouts from ever encoding to the same words.
constexpr std::uint64_t kNodeTag = 0x4e4f4445;  // "NODE"
constexpr std::uint64_t kLeafTag = detail::kLeafRecordTag;
constexpr std::uint64_t kSeedTag = 0x53454544;  // "SEED"
constexpr std::uint64_t kRootTag = 0x524f4f54;  // "ROOT"
constexpr std::uint64_t kModeTag = 0x4d4f4445;  // "MODE"
enum EdgeKind : std::uint64_t { kNoEdge = 0, kNodeEdge = 1, kLeafEdge = 2 };
enum LeafGrad : std::uint64_t { kNoGrad = 0, kGradLikeLeaf = 1, kGradOtherShape = 2 };
using OwnerKind = detail::AddressOwnerKind;
constexpr OwnerKind kSaved = detail::kOwnerSaved, kLeafData = detail::kOwnerLeafData,
                    kLeafGrad = detail::kOwnerLeafGrad, kSeed = detail::kOwnerSeed;
std::uint32_t owner(OwnerKind kind, std::uint32_t index, std::uint32_t j) {
  return detail::address_owner(kind, index, j);
}

// FNV-1a over 64-bit words, finalized: one multiply per word (the hash only picks the cache entry
// to compare; equality is always checked word by word).
// The structure's hash only picks which cache entries to compare word by word (equality is always
// checked in full), so it samples: the length and 64 words spread over the record. Hashing all of
// a 200-node structure's ~7000 words cost as much as the comparison it would save.
std::uint64_t fingerprint(const Words& words) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ words.size();
  const std::size_t n = words.size(), step = n / 64 + 1;
  for (std::size_t i = 0; i < n; i += step) h = (h ^ words[i]) * 0x100000001b3ull;
  if (n > 0) h = (h ^ words[n - 1]) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

// Four independent lanes: a single multiply chain is latency-bound.
template <class V>
std::uint64_t hash_words(const V& words) {
  constexpr std::uint64_t kPrime = 0x100000001b3ull;
  std::uint64_t h[4] = {0xcbf29ce484222325ull ^ words.size(), 0x84222325cbf29ce4ull,
                        0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull};
  const std::size_t n = words.size(), blocks = n / 4 * 4;
  for (std::size_t i = 0; i < blocks; i += 4) {
    for (int l = 0; l < 4; ++l) h[l] = (h[l] ^ static_cast<std::uint64_t>(words[i + l])) * kPrime;
  }
  for (std::size_t i = blocks; i < n; ++i)
    h[0] = (h[0] ^ static_cast<std::uint64_t>(words[i])) * kPrime;
  std::uint64_t out = h[0];
  for (int l = 1; l < 4; ++l) out = (out ^ (h[l] >> 31) ^ h[l]) * 0xbf58476d1ce4e5b9ull;
  return out ^ (out >> 29);
}

class Walker {
 public:
  void reset(cudaStream_t caller) {
    stream_ids_.assign(1, caller);
    leaf_index_.clear();
    leaves_.clear();
  }

  std::uint64_t stream_id(cudaStream_t s) {
    for (std::size_t i = 0; i < stream_ids_.size(); ++i) {
      if (stream_ids_[i] == s) return i;
    }
    stream_ids_.push_back(s);
    return stream_ids_.size() - 1;
  }
  // The leaf's index (by its shared .grad slot, as the plan identifies leaves), and whether new.
  std::pair<int, bool> leaf_id(const Tensor& leaf) {
    const auto [i, inserted] = leaf_index_.emplace(&leaf.grad(), static_cast<int>(leaves_.size()));
    if (inserted) leaves_.push_back(leaf);
    return {i, inserted};
  }
  const std::vector<Tensor>& leaves() const { return leaves_; }
  const std::vector<cudaStream_t>& streams() const { return stream_ids_; }
  // After the walk: the walker is thread_local, and leaves kept here would keep a model's
  // parameters alive after the model and every signature are gone (to the thread's end).
  void release_leaves() {
    leaf_index_.clear();
    leaves_.clear();
  }

 private:
  std::vector<cudaStream_t> stream_ids_;
  detail::PtrIndex leaf_index_{16};
  std::vector<Tensor> leaves_;
};

}  // namespace

namespace {

std::atomic<std::uint64_t> g_walk_epoch{0};

// Appends words through a raw pointer: the signature is computed before every replay, and
// std::vector::push_back's per-word checks were most of its cost.
class WordWriter {
 public:
  explicit WordWriter(Words& v) : v_(v), p_(v.data()), size_(v.size()) {}
  ~WordWriter() { finish(); }
  void finish() { v_.resize(size_); }
  void reserve(std::size_t more) {
    if (size_ + more > v_.size()) v_.resize(std::max(2 * v_.size(), size_ + more));
    p_ = v_.data();
  }
  void put(std::uint64_t x) { p_[size_++] = x; }
  void shape(const Shape& s) {
    p_[size_++] = s.size();
    for (std::int64_t d : s) p_[size_++] = static_cast<std::uint64_t>(d);
  }
  void append(const std::uint64_t* src, std::size_t n) {
    std::memcpy(p_ + size_, src, n * sizeof(std::uint64_t));
    size_ += n;
  }
  std::uint64_t& at(std::size_t i) { return p_[i]; }
  std::size_t size() const { return size_; }

 private:
  Words& v_;
  std::uint64_t* p_;
  std::size_t size_;
};

}  // namespace

TapeSignature tape_signature(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds,
                             cudaStream_t caller_stream, GradWrite grad_write) {
  TapeSignature sig;
  tape_signature(sig, roots, seeds, caller_stream, grad_write);
  return sig;
}

namespace {

void clear_signature(TapeSignature& sig) {
  sig.structure.clear();
  sig.addresses.clear();
  sig.node_offsets.clear();
  sig.ops.clear();
  sig.address_owners.clear();
  sig.streams.clear();
  sig.nodes.clear();
  sig.leaves.clear();
  sig.walk_reason = nullptr;
  sig.nodes_equal_to = nullptr;
}

// The leaves', seeds', roots' and mode's part, after the nodes' part (either source).
void finish(TapeSignature& sig, const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds,
            cudaStream_t caller_stream, GradWrite grad_write) {
  sig.structure.resize(sig.nodes_words);
  sig.addresses.resize(sig.nodes_addresses);
  sig.address_owners.resize(sig.nodes_addresses);
  const bool from_log = sig.source == TapeSignature::Source::kLog;
  auto leaf_number = [&sig](const Tensor& leaf) {
    for (std::size_t l = 0; l < sig.leaves.size(); ++l) {
      if (&sig.leaves[l].grad() == &leaf.grad()) return l;
    }
    sig.leaves.push_back(leaf);
    return sig.leaves.size() - 1;
  };
  // Roots that are leaves themselves get a leaf number too.
  std::uint64_t root_words[2 * 8];
  std::vector<std::uint64_t> more_root_words;
  std::uint64_t* rw = roots.size() <= 8 ? root_words : (more_root_words.resize(2 * roots.size()),
                                                        more_root_words.data());
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    if (t.grad_fn()) {
      rw[2 * r] = kNodeEdge;
      rw[2 * r + 1] = static_cast<std::uint64_t>(from_log ? t.grad_fn()->log_index
                                                          : t.grad_fn()->walk_index);
    } else {
      rw[2 * r] = kLeafEdge;
      rw[2 * r + 1] = leaf_number(t);
    }
  }
  std::size_t caller = 0;
  while (caller < sig.streams.size() && sig.streams[caller] != caller_stream) ++caller;
  if (caller == sig.streams.size()) sig.streams.push_back(caller_stream);
  WordWriter w(sig.structure);
  w.reserve(16 + 2 * roots.size());
  if (from_log) {
    // The leaves' dtypes, shapes and data are in the log (they never change); only the .grads
    // are read now: one word each (none / the leaf's shape / another shape, then that shape) and
    // the address. A .grad that is the same tensor as last time is not read again (grad_memo).
    const bool same_count = sig.grad_memo.size() == sig.leaves.size();
    bool all_hits = same_count;
    sig.grad_memo.resize(sig.leaves.size());
    w.reserve(2 + sig.leaves.size());
    w.put(kLeafTag);
    for (std::size_t l = 0; l < sig.leaves.size(); ++l) {
      const Tensor& leaf = sig.leaves[l];
      TapeSignature::GradMemo& m = sig.grad_memo[l];
      const void* gid = leaf.grad_id();
      if (m.leaf.id() != leaf.id() || m.grad.id() != gid || m.word == kGradOtherShape) {
        all_hits = false;
        const Tensor::LeafView v = leaf.leaf_view();
        m = {leaf, leaf.grad(),
             !v.grad_shape ? kNoGrad : *v.grad_shape == *v.shape ? kGradLikeLeaf : kGradOtherShape,
             reinterpret_cast<std::uintptr_t>(v.grad_data), nullptr};
        if (m.grad.defined()) m.grad_storage = m.grad.storage().get();
        if (m.word == kGradOtherShape) {
          w.put(m.word);
          w.reserve(2 + v.grad_shape->size() + sig.leaves.size() - l);
          w.shape(*v.grad_shape);
          sig.addresses.push_back(m.data);
          sig.address_owners.push_back(owner(kLeafGrad, static_cast<std::uint32_t>(l), 0));
          continue;
        }
      }
      w.put(m.word);
      sig.addresses.push_back(m.data);
      sig.address_owners.push_back(owner(kLeafGrad, static_cast<std::uint32_t>(l), 0));
    }
    sig.grads_unchanged = all_hits;
  } else {
    sig.grads_unchanged = false;
    for (std::size_t l = 0; l < sig.leaves.size(); ++l) {
      const Tensor::LeafView v = sig.leaves[l].leaf_view();
      w.reserve(8 + 2 * v.shape->size() + (v.grad_shape ? v.grad_shape->size() : 0));
      w.put(kLeafTag);
      w.put(static_cast<std::uint64_t>(v.dtype));
      w.shape(*v.shape);
      // The .grad: none, one of the leaf's shape (the usual case), or one of another shape.
      if (!v.grad_shape) {
        w.put(kNoGrad);
      } else if (*v.grad_shape == *v.shape) {
        w.put(kGradLikeLeaf);
      } else {
        w.put(kGradOtherShape);
        w.shape(*v.grad_shape);
      }
      sig.addresses.push_back(reinterpret_cast<std::uintptr_t>(v.data));
      sig.address_owners.push_back(owner(kLeafData, static_cast<std::uint32_t>(l), 0));
      sig.addresses.push_back(reinterpret_cast<std::uintptr_t>(v.grad_data));
      sig.address_owners.push_back(owner(kLeafGrad, static_cast<std::uint32_t>(l), 0));
    }
  }
  w.put(kSeedTag);
  w.put(seeds.size());
  for (std::size_t s = 0; s < seeds.size(); ++s) {
    const Tensor& t = seeds[s];
    w.reserve(4 + (t.defined() ? t.dim() : 0));
    w.put(t.defined());
    if (!t.defined()) continue;
    w.put(static_cast<std::uint64_t>(t.dtype()));
    w.shape(t.shape());
    sig.addresses.push_back(reinterpret_cast<std::uintptr_t>(t.raw_data()));
    sig.address_owners.push_back(owner(kSeed, static_cast<std::uint32_t>(s), 0));
  }
  w.reserve(8 + 2 * roots.size());
  w.put(kRootTag);
  w.put(roots.size());
  for (std::size_t i = 0; i < 2 * roots.size(); ++i) w.put(rw[i]);
  w.put(kModeTag);
  w.put(static_cast<std::uint64_t>(grad_write));
  w.put(detail::math_mode_word());  // Note [TF32]: a captured backward runs the kernels it chose
  w.put(caller);                    // the caller's stream's number: 0 for a walk
  w.finish();
  sig.structure_hash = fingerprint(sig.structure);
  sig.address_hash = hash_words(sig.addresses);
}

// From the calling thread's tape log (Note [Tape log]); false (with the reason in walk_reason) if
// the log cannot stand for the tape of `roots`.
bool from_log(TapeSignature& sig, const std::vector<Tensor>& roots) {
  const char* why = nullptr;
  for (const Tensor& t : roots) {
    why = t.grad_fn() ? detail::tape_log_unusable_for(t.grad_fn().get())
                      : detail::tape_log_unusable_for(nullptr);
    if (why) break;
  }
  if (why) {
    sig.walk_reason = why;
    return false;
  }
  detail::TapeLog& log = detail::tape_log();
  const void* matched = log.on_track && log.expect && log.expect->size() == log.words.size()
                            ? log.expect.get()
                            : nullptr;
  // Take the log's buffers (and give it ours, emptied, for the next step): no copy.
  clear_signature(sig);
  std::swap(sig.structure, log.words);
  std::swap(sig.node_offsets, log.node_offsets);
  std::swap(sig.ops, log.ops);
  std::swap(sig.addresses, log.addresses);
  std::swap(sig.address_owners, log.address_owners);
  std::swap(sig.nodes, log.nodes);
  std::swap(sig.streams, log.streams);
  std::swap(sig.leaves, log.leaves);
  log.leaf_index.clear();
  log.words.clear();
  log.words.push_back(detail::kLogSignatureTag);
  log.unusable = "the step's tape log was taken by a signature already";
  sig.source = TapeSignature::Source::kLog;
  sig.nodes_equal_to = matched;
  log.on_track = false;
  sig.nodes_words = sig.structure.size();
  sig.nodes_addresses = sig.addresses.size();
  return true;
}

}  // namespace

void tape_signature(TapeSignature& sig, const std::vector<Tensor>& roots,
                    const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                    GradWrite grad_write) {
  GW_CHECK(!roots.empty(), "tape_signature: expected at least one root");
  for (std::size_t r = 0; r < roots.size(); ++r) {
    GW_CHECK(roots[r].defined() && roots[r].requires_grad(), "tape_signature: root ", r,
             " is undefined or does not require grad");
  }
  if (from_log(sig, roots)) {
    finish(sig, roots, seeds, caller_stream, grad_write);
    return;
  }
  const char* why = sig.walk_reason;
  tape_signature_walk(sig, roots, seeds, caller_stream, grad_write);
  sig.walk_reason = why;
}

void refresh_leaves(TapeSignature& sig, const std::vector<Tensor>& roots,
                    const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                    GradWrite grad_write) {
  finish(sig, roots, seeds, caller_stream, grad_write);
}

void tape_signature_walk(TapeSignature& sig, const std::vector<Tensor>& roots,
                         const std::vector<Tensor>& seeds, cudaStream_t caller_stream,
                         GradWrite grad_write) {
  GW_CHECK(!roots.empty(), "tape_signature: expected at least one root");
  // Reuse the buffers' capacity: a signature is computed every step.
  clear_signature(sig);
  sig.source = TapeSignature::Source::kWalk;
  sig.walk_reason = "asked for a walk";
  // 1. Discover the nodes in canonical order: depth first from the roots, inputs in order. A node
  // is marked with this walk's epoch and its index (Node::walk_epoch) instead of hashed.
  const std::uint64_t epoch = g_walk_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  std::vector<Node*>& nodes = sig.nodes;
  thread_local std::vector<Node*> stack;
  stack.clear();
  auto seen = [epoch](const Node* n) { return n->walk_epoch == epoch; };
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    GW_CHECK(t.defined() && t.requires_grad(), "tape_signature: root ", r,
             " is undefined or does not require grad");
    if (t.grad_fn()) stack.push_back(t.grad_fn().get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (seen(n)) continue;
      n->check_saved_fast();  // released, or a saved tensor modified in place: refused by name
      n->walk_epoch = epoch;
      n->walk_index = static_cast<int>(nodes.size());
      nodes.push_back(n);
      const auto& producers = n->record().producers;
      for (auto it = producers.rbegin(); it != producers.rend(); ++it) {  // first input first
        if (*it && !seen(*it)) stack.push_back(const_cast<Node*>(*it));
      }
    }
  }

  // 2. Emit the nodes in canonical order; finish() adds the leaves, seeds, roots and the mode.
  thread_local Walker walk;
  walk.reset(caller_stream);
  sig.node_offsets.reserve(nodes.size());
  sig.ops.reserve(nodes.size());
  sig.addresses.reserve(nodes.size() * 2 + 8);
  sig.address_owners.reserve(nodes.size() * 2 + 8);
  {
    WordWriter w(sig.structure);
    w.reserve(nodes.size() * 40 + 64);
    w.put(detail::kWalkSignatureTag);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const Node* n = nodes[i];
      const NodeRecord& rec = n->record();  // Note [Node record]: made when the node was
      w.reserve(rec.words.size());
      const std::size_t at = w.size();
      sig.node_offsets.push_back(static_cast<std::uint32_t>(at));
      sig.ops.push_back(n->interned_name());
      w.append(rec.words.data(), rec.words.size());
      for (const NodeRecord::PatchAt& p : rec.patches) {
        std::uint64_t& word = w.at(at + p.word);
        switch (p.kind) {
          case NodeRecord::Patch::kStream:
            word = walk.stream_id(reinterpret_cast<cudaStream_t>(word));
            break;
          case NodeRecord::Patch::kNode:
            word = static_cast<std::uint64_t>(reinterpret_cast<const Node*>(word)->walk_index);
            break;
          case NodeRecord::Patch::kLeaf:
            word = static_cast<std::uint64_t>(walk.leaf_id(n->inputs()[p.input].edge.leaf).first);
            break;
        }
      }
      for (const auto& [address, j] : rec.saved_addresses) {
        sig.addresses.push_back(address);
        sig.address_owners.push_back(owner(kSaved, static_cast<std::uint32_t>(i), j));
      }
    }
  }
  sig.streams.assign(walk.streams().begin(), walk.streams().end());
  sig.leaves.assign(walk.leaves().begin(), walk.leaves().end());
  walk.release_leaves();
  sig.nodes_words = sig.structure.size();
  sig.nodes_addresses = sig.addresses.size();
  finish(sig, roots, seeds, caller_stream, grad_write);
}

namespace {

// Reads a record back; every read is bounds-checked so a malformed record says so instead of
// reading past the end.
class Reader {
 public:
  Reader(const Words& w, std::size_t pos) : w_(w), pos_(pos) {}
  bool ok() const { return ok_; }
  std::uint64_t next() {
    if (pos_ >= w_.size()) {
      ok_ = false;
      return 0;
    }
    return w_[pos_++];
  }
  std::string shape() {
    const std::uint64_t nd = next();
    if (nd > 64) {
      ok_ = false;
      return "?";
    }
    Shape s;
    for (std::uint64_t d = 0; d < nd && ok_; ++d) s.push_back(static_cast<std::int64_t>(next()));
    return shape_str(s);
  }

 private:
  const Words& w_;
  std::size_t pos_;
  bool ok_ = true;
};

const char* dtype_str(std::uint64_t d) {
  return dtype_name(static_cast<DType>(d));
}

}  // namespace

std::string TapeSignature::describe_node(int i) const {
  if (i < 0 || i >= num_nodes()) return "(no such node)";
  Reader r(structure, node_offsets[static_cast<std::size_t>(i)]);
  std::ostringstream os;
  if (r.next() != kNodeTag) return "(malformed record)";
  r.next();  // op (interned name)
  os << *ops[static_cast<std::size_t>(i)] << " on s" << r.next() << " -> " << r.shape();
  const std::uint64_t nin = r.next(), nsaved = r.next();
  for (std::uint64_t k = 0; k < nin && r.ok(); ++k) {
    const std::uint64_t kind = r.next(), target = r.next(), dtype = r.next(), stream = r.next();
    os << (k == 0 ? " (" : "; ") << "in" << k << ": ";
    if (kind == kNodeEdge) {
      os << "node " << target;
    } else if (kind == kLeafEdge) {
      os << "leaf " << target;
    } else {
      os << "no grad";
    }
    os << " " << dtype_str(dtype);
    if (kind != kNodeEdge) os << r.shape();
    os << " from s" << stream;
  }
  if (nin > 0) os << ")";
  for (std::uint64_t k = 0; k < nsaved && r.ok(); ++k) {
    os << (k == 0 ? " saved: " : ", ");
    if (!r.next()) {
      os << "none";
      continue;
    }
    const std::uint64_t dtype = r.next();
    os << dtype_str(dtype) << r.shape();
  }
  const std::uint64_t nattributes = r.ok() ? r.next() : 0;  // Note [Node attributes]
  for (std::uint64_t k = 0; k < nattributes && r.ok(); ++k) {
    const std::uint64_t real = r.next(), bits = r.next();
    os << (k == 0 ? " attributes: " : ", ");
    if (real) {
      os << std::bit_cast<double>(bits);
    } else {
      os << static_cast<std::int64_t>(bits);
    }
  }
  if (!r.ok()) os << " (truncated record)";
  return os.str();
}

std::string TapeSignature::address_owner_str(std::size_t a) const {
  if (a >= address_owners.size()) return "(no such address)";
  const std::uint32_t o = address_owners[a];
  const std::uint32_t kind = o >> 28, index = (o >> 8) & 0xFFFFF, j = o & 0xFF;
  std::ostringstream os;
  switch (kind) {
    case kSaved:
      os << "saved tensor " << j << " of node " << index;
      if (index < ops.size()) os << " (" << *ops[index] << ")";
      break;
    case kLeafData:
      os << "the data of leaf " << index;
      break;
    case kLeafGrad:
      os << "the .grad of leaf " << index;
      break;
    case kSeed:
      os << "seed " << index;
      break;
    default:
      os << "address " << a;
  }
  return os.str();
}

std::string describe_difference(const TapeSignature& captured, const TapeSignature& now) {
  std::ostringstream os;
  if (captured.source != now.source) {
    auto how = [](const TapeSignature& s) {
      return s.source == TapeSignature::Source::kLog
                 ? std::string("from the step's tape log")
                 : "by a walk of the tape (the log was not used: " +
                       std::string(s.walk_reason ? s.walk_reason : "?") + ")";
    };
    os << "this step's signature was made " << how(now) << ", the captured one " << how(captured);
    return os.str();
  }
  if (!captured.same_structure(now)) {
    const int common = std::min(captured.num_nodes(), now.num_nodes());
    for (int i = 0; i < common; ++i) {
      const std::size_t a0 = captured.node_offsets[static_cast<std::size_t>(i)];
      const std::size_t a1 = i + 1 < captured.num_nodes()
                                 ? captured.node_offsets[static_cast<std::size_t>(i) + 1]
                                 : captured.nodes_words;
      const std::size_t b0 = now.node_offsets[static_cast<std::size_t>(i)];
      const std::size_t b1 = i + 1 < now.num_nodes()
                                 ? now.node_offsets[static_cast<std::size_t>(i) + 1]
                                 : now.nodes_words;
      const bool same = (a1 - a0) == (b1 - b0) &&
                        std::equal(captured.structure.begin() + static_cast<std::ptrdiff_t>(a0),
                                   captured.structure.begin() + static_cast<std::ptrdiff_t>(a1),
                                   now.structure.begin() + static_cast<std::ptrdiff_t>(b0));
      if (!same) {
        os << "the tape changed at node " << i << ": it was `" << captured.describe_node(i)
           << "`, now `" << now.describe_node(i) << "`";
        if (captured.num_nodes() != now.num_nodes()) {
          os << " (" << captured.num_nodes() << " nodes before, " << now.num_nodes() << " now)";
        }
        return os.str();
      }
    }
    if (captured.num_nodes() != now.num_nodes()) {
      os << "the tape has " << now.num_nodes() << " nodes, the captured one "
         << captured.num_nodes();
      if (now.num_nodes() > common)
        os << "; new: node " << common << " `" << now.describe_node(common) << "`";
      return os.str();
    }
    os << "the tape's leaves, seeds, roots, gradient mode or TF32 switches changed (the nodes are "
          "the same; now "
       << detail::math_mode_str(detail::math_mode_word()) << ")";
    return os.str();
  }
  if (!captured.same_addresses(now)) {
    int changed = 0;
    std::size_t first = 0;
    for (std::size_t a = 0; a < now.addresses.size(); ++a) {
      if (captured.addresses[a] != now.addresses[a]) {
        if (changed++ == 0) first = a;
      }
    }
    os << changed << " of " << now.addresses.size() << " addresses changed; the first is "
       << now.address_owner_str(first);
    return os.str();
  }
  return "";
}

}  // namespace graphward::capture
