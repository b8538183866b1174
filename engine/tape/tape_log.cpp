#include "graphward/engine/tape/tape_log.h"

#include <algorithm>
#include <cstring>

#include "graphward/engine/tape/autograd.h"

namespace graphward::detail {

namespace {
thread_local TapeLog t_log;
std::atomic<std::uint64_t> g_log_epoch{0};  // epochs are unique across threads

void clear(TapeLog& log) {
  log.words.clear();
  log.words.push_back(kLogSignatureTag);
  log.node_offsets.clear();
  log.ops.clear();
  log.addresses.clear();
  log.address_owners.clear();
  log.nodes.clear();
  log.streams.clear();
  log.leaves.clear();
  log.leaf_index.clear();
}
}  // namespace

TapeLog& tape_log() {
  return t_log;
}

void tape_log_reset() {
  TapeLog& log = t_log;
  if (log.armed == 0) return;
  clear(log);
  log.epoch = g_log_epoch.fetch_add(1, std::memory_order_relaxed) + 1;
  log.unusable = nullptr;
  log.on_track = log.expect != nullptr;
  log.mutations_at_reset = tape_mutations().load(std::memory_order_acquire);
  if (!log.reads || log.reads.use_count() > 1 || log.reads->any_saved || log.reads->partial ||
      log.reads->lost || log.reads->replayed.load(std::memory_order_relaxed)) {
    log.reads = std::make_shared<StepReads>();  // the last one was used: a fresh one
  }
}

void tape_log_arm() {
  if (t_log.armed++ == 0) {
    t_log.armed = 1;
    tape_log_reset();
  }
}

void tape_log_disarm() {
  if (t_log.armed > 0 && --t_log.armed == 0) {
    clear(t_log);
    t_log.words.shrink_to_fit();
    t_log.unusable = "no BackwardGraph on this thread";
    t_log.expect.reset();
    t_log.reads.reset();
  }
}

void tape_log_expect(std::shared_ptr<const Words> nodes_part) {
  t_log.expect = std::move(nodes_part);
  t_log.on_track = false;  // until the next reset
}

void tape_log_append(Node& node) {
  TapeLog& log = t_log;
  if (log.armed == 0 || log.unusable) return;
  const NodeRecord& rec = node.record();
  if (log.words.size() + rec.words.size() > TapeLog::kMaxWords) {
    log.unusable = "the step's tape outgrew the tape log";
    return;
  }
  node.log_epoch = log.epoch;
  node.log_index = static_cast<int>(log.nodes.size());
  const std::size_t at = log.words.size();
  log.node_offsets.push_back(static_cast<std::uint32_t>(at));
  log.ops.push_back(node.interned_name());
  log.nodes.push_back(&node);
  log.words.resize(at + rec.words.size());
  std::uint64_t* w = log.words.data() + at;
  std::memcpy(w, rec.words.data(), rec.words.size() * sizeof(std::uint64_t));
  const std::size_t leaves_before = log.leaves.size();
  for (const NodeRecord::PatchAt& p : rec.patches) {
    std::uint64_t& word = w[p.word];
    switch (p.kind) {
      case NodeRecord::Patch::kStream: {
        const auto s = reinterpret_cast<cudaStream_t>(word);
        const auto it = std::find(log.streams.begin(), log.streams.end(), s);
        word = static_cast<std::uint64_t>(it - log.streams.begin());
        if (it == log.streams.end()) log.streams.push_back(s);
        break;
      }
      case NodeRecord::Patch::kNode: {
        const auto* producer = reinterpret_cast<const Node*>(word);
        if (producer->log_epoch != log.epoch) {
          log.unusable = "an input of the step's tape came from a node made before the step";
          return;  // the log is given up for this step; what it holds is never read
        }
        word = static_cast<std::uint64_t>(producer->log_index);
        break;
      }
      case NodeRecord::Patch::kLeaf: {
        const Tensor& leaf = node.inputs()[p.input].edge.leaf;
        const auto [id, inserted] =
            log.leaf_index.emplace(&leaf.grad(), static_cast<int>(log.leaves.size()));
        if (inserted) log.leaves.push_back(leaf);
        word = static_cast<std::uint64_t>(id);
        break;
      }
    }
  }
  const auto index = static_cast<std::uint32_t>(node.log_index);
  for (const auto& [address, j] : rec.saved_addresses) {
    log.addresses.push_back(address);
    log.address_owners.push_back(address_owner(kOwnerSaved, index, j));
  }
  // Leaves used for the first time: their dtype, shape and data, which never change.
  for (std::size_t l = leaves_before; l < log.leaves.size(); ++l) {
    const Tensor::LeafView v = log.leaves[l].leaf_view();
    log.words.push_back(kLeafRecordTag);
    log.words.push_back(static_cast<std::uint64_t>(v.dtype));
    log.words.push_back(v.shape->size());
    for (std::int64_t d : *v.shape) log.words.push_back(static_cast<std::uint64_t>(d));
    log.addresses.push_back(reinterpret_cast<std::uintptr_t>(v.data));
    log.address_owners.push_back(address_owner(kOwnerLeafData, static_cast<std::uint32_t>(l), 0));
  }
  if (log.on_track) {  // the running comparison with the last replayed signature
    const std::size_t n = log.words.size() - at;
    log.on_track =
        at + n <= log.expect->size() &&
        std::memcmp(log.expect->data() + at, log.words.data() + at, n * sizeof(std::uint64_t)) == 0;
  }
}

const char* tape_log_unusable_for(const Node* root) {
  const TapeLog& log = t_log;
  if (log.armed == 0) return "no BackwardGraph on this thread";
  if (log.unusable) return log.unusable;
  if (tape_mutations().load(std::memory_order_acquire) != log.mutations_at_reset)
    return "a saved tensor was modified in place, or a backward released part of a tape, since "
           "the step began";
  if (root && root->log_epoch != log.epoch)
    return "the loss was not computed on this thread since the step began";
  return nullptr;
}

}  // namespace graphward::detail
