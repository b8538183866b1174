#include "capture/signature.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "engine/ptr_index.h"

namespace graphward::capture {

namespace {

// Record tags: they make a record self-describing for describe_node() and keep two different
// layouts from ever encoding to the same words.
constexpr std::uint64_t kNodeTag = 0x4e4f4445;  // "NODE"
constexpr std::uint64_t kLeafTag = 0x4c454146;  // "LEAF"
constexpr std::uint64_t kSeedTag = 0x53454544;  // "SEED"
constexpr std::uint64_t kRootTag = 0x524f4f54;  // "ROOT"
constexpr std::uint64_t kModeTag = 0x4d4f4445;  // "MODE"
enum EdgeKind : std::uint64_t { kNoEdge = 0, kNodeEdge = 1, kLeafEdge = 2 };
enum OwnerKind : std::uint32_t { kSaved = 1, kLeafData = 2, kLeafGrad = 3, kSeed = 4 };

std::uint32_t owner(OwnerKind kind, std::uint32_t index, std::uint32_t j) {
  return (static_cast<std::uint32_t>(kind) << 28) | ((index & 0xFFFFF) << 8) | (j & 0xFF);
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

template <class T>
std::uint64_t hash_words(const std::vector<T>& words) {
  std::uint64_t h = 0xcbf29ce484222325ull ^ words.size();
  for (T w : words) h = mix(h, static_cast<std::uint64_t>(w));
  return h;
}

void put_shape(std::vector<std::uint64_t>& out, const Shape& shape) {
  out.push_back(shape.size());
  for (std::int64_t d : shape) out.push_back(static_cast<std::uint64_t>(d));
}

class Walker {
 public:
  explicit Walker(cudaStream_t caller) { stream_ids_.push_back(caller); }

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

 private:
  std::vector<cudaStream_t> stream_ids_;
  detail::PtrIndex leaf_index_{16};
  std::vector<Tensor> leaves_;
};

}  // namespace

TapeSignature tape_signature(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds,
                             cudaStream_t caller_stream, GradWrite grad_write) {
  GW_CHECK(!roots.empty(), "tape_signature: expected at least one root");
  TapeSignature sig;
  // 1. Discover the nodes in canonical order: depth first from the roots, inputs in order.
  std::vector<Node*>& nodes = sig.nodes;
  detail::PtrIndex index(64);
  std::vector<Node*> stack;
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    GW_CHECK(t.defined() && t.requires_grad(), "tape_signature: root ", r,
             " is undefined or does not require grad");
    if (t.grad_fn()) stack.push_back(t.grad_fn().get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!index.emplace(n, static_cast<int>(nodes.size())).second) continue;
      n->check_saved();  // released, or a saved tensor modified in place: refused by name
      nodes.push_back(n);
      const auto& in = n->inputs();
      for (auto it = in.rbegin(); it != in.rend(); ++it) {  // first input visited first
        if (it->edge.node && index.find_index(it->edge.node.get()) < 0) {
          stack.push_back(it->edge.node.get());
        }
      }
    }
  }

  // 2. Emit: nodes in canonical order, then leaves, seeds, roots and the mode.
  Walker walk(caller_stream);
  std::vector<std::uint64_t>& w = sig.structure;
  w.reserve(nodes.size() * 24 + 16);
  sig.node_offsets.reserve(nodes.size());
  sig.ops.reserve(nodes.size());
  sig.addresses.reserve(nodes.size() * 2 + 8);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    sig.node_offsets.push_back(static_cast<std::uint32_t>(w.size()));
    sig.ops.push_back(n->interned_name());
    w.push_back(kNodeTag);
    w.push_back(reinterpret_cast<std::uintptr_t>(n->interned_name()));  // one pointer per op name
    w.push_back(walk.stream_id(n->stream()));
    put_shape(w, n->output_shape());
    w.push_back(n->inputs().size());
    w.push_back(n->saved().size());
    for (const InputMeta& in : n->inputs()) {
      if (in.edge.node) {
        w.push_back(kNodeEdge);
        w.push_back(static_cast<std::uint64_t>(index.at(in.edge.node.get())));
      } else if (in.edge.leaf.defined()) {
        w.push_back(kLeafEdge);
        w.push_back(static_cast<std::uint64_t>(walk.leaf_id(in.edge.leaf).first));
      } else {
        w.push_back(kNoEdge);
        w.push_back(0);
      }
      w.push_back(static_cast<std::uint64_t>(in.dtype));
      w.push_back(walk.stream_id(in.stream));
      put_shape(w, in.shape);
    }
    for (std::size_t j = 0; j < n->saved().size(); ++j) {
      const Tensor& t = n->saved()[j].tensor;
      w.push_back(t.defined());
      if (!t.defined()) continue;
      w.push_back(static_cast<std::uint64_t>(t.dtype()));
      put_shape(w, t.shape());
      sig.addresses.push_back(reinterpret_cast<std::uintptr_t>(t.raw_data()));
      sig.address_owners.push_back(
          owner(kSaved, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(j)));
    }
  }
  // Roots that are leaves themselves get a leaf index too.
  std::vector<std::uint64_t> root_words;
  for (const Tensor& t : roots) {
    if (t.grad_fn()) {
      root_words.push_back(kNodeEdge);
      root_words.push_back(static_cast<std::uint64_t>(index.at(t.grad_fn().get())));
    } else {
      root_words.push_back(kLeafEdge);
      root_words.push_back(static_cast<std::uint64_t>(walk.leaf_id(t).first));
    }
  }
  for (std::size_t l = 0; l < walk.leaves().size(); ++l) {
    const Tensor& leaf = walk.leaves()[l];
    w.push_back(kLeafTag);
    w.push_back(static_cast<std::uint64_t>(leaf.dtype()));
    put_shape(w, leaf.shape());
    const Tensor& g = leaf.grad();
    w.push_back(g.defined());
    if (g.defined()) put_shape(w, g.shape());
    sig.addresses.push_back(reinterpret_cast<std::uintptr_t>(leaf.raw_data()));
    sig.address_owners.push_back(owner(kLeafData, static_cast<std::uint32_t>(l), 0));
    sig.addresses.push_back(g.defined() ? reinterpret_cast<std::uintptr_t>(g.raw_data()) : 0);
    sig.address_owners.push_back(owner(kLeafGrad, static_cast<std::uint32_t>(l), 0));
  }
  w.push_back(kSeedTag);
  w.push_back(seeds.size());
  for (std::size_t s = 0; s < seeds.size(); ++s) {
    const Tensor& t = seeds[s];
    w.push_back(t.defined());
    if (!t.defined()) continue;
    w.push_back(static_cast<std::uint64_t>(t.dtype()));
    put_shape(w, t.shape());
    sig.addresses.push_back(reinterpret_cast<std::uintptr_t>(t.raw_data()));
    sig.address_owners.push_back(owner(kSeed, static_cast<std::uint32_t>(s), 0));
  }
  w.push_back(kRootTag);
  w.push_back(roots.size());
  w.insert(w.end(), root_words.begin(), root_words.end());
  w.push_back(kModeTag);
  w.push_back(static_cast<std::uint64_t>(grad_write));
  sig.streams = walk.streams();
  sig.leaves = walk.leaves();
  sig.structure_hash = hash_words(sig.structure);
  sig.address_hash = hash_words(sig.addresses);
  return sig;
}

namespace {

// Reads a record back; every read is bounds-checked so a malformed record says so instead of
// reading past the end.
class Reader {
 public:
  Reader(const std::vector<std::uint64_t>& w, std::size_t pos) : w_(w), pos_(pos) {}
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
  const std::vector<std::uint64_t>& w_;
  std::size_t pos_;
  bool ok_ = true;
};

const char* dtype_str(std::uint64_t d) {
  return static_cast<DType>(d) == DType::kFloat64 ? "float64" : "float32";
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
    os << " " << dtype_str(dtype) << r.shape() << " from s" << stream;
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
  if (!captured.same_structure(now)) {
    const int common = std::min(captured.num_nodes(), now.num_nodes());
    for (int i = 0; i < common; ++i) {
      const std::size_t a0 = captured.node_offsets[static_cast<std::size_t>(i)];
      const std::size_t a1 = i + 1 < captured.num_nodes()
                                 ? captured.node_offsets[static_cast<std::size_t>(i) + 1]
                                 : captured.structure.size();
      const std::size_t b0 = now.node_offsets[static_cast<std::size_t>(i)];
      const std::size_t b1 = i + 1 < now.num_nodes()
                                 ? now.node_offsets[static_cast<std::size_t>(i) + 1]
                                 : now.structure.size();
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
    os << "the tape's leaves, seeds, roots or gradient mode changed (the nodes are the same)";
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
