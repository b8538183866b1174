#include "graphward/capture/backward_graph.h"
#include "graphward/capture/backward_graph_detail.h"

#include <algorithm>
#include <memory>
#include <unordered_set>
#include <vector>

#include "graphward/capture/stream_capture.h"
#include "graphward/engine/runtime/ptr_index.h"

// Note [Input slots] (capture/backward_graph.h): which saved tensors a captured backward reads
// from a slot, and the slots' refresh before each launch.

namespace graphward {

#if GRAPHWARD_HAS_CUDA
std::vector<BackwardGraph::InputSlot> BackwardGraph::choose_slots(
    const capture::GraphCache<std::shared_ptr<Executable>>::Entry* updating,
    GradWrite grad_write) {
  const capture::TapeSignature& sig = signature_;
  const capture::TapeSignature& warm = warm_[static_cast<std::size_t>(grad_write)];
  const bool log = sig.source == capture::TapeSignature::Source::kLog;
  std::vector<InputSlot> slots;
  // Only nodes the backward reaches (walk_, alive): a log also lists nodes of the step that the
  // loss does not reach, which may be gone by now.
  const std::unordered_set<const Node*> reached(walk_.nodes.begin(), walk_.nodes.end());
  auto add = [&](std::uint32_t address) {
    const std::uint32_t o = sig.address_owners[address];
    if ((o >> 28) != detail::kOwnerSaved) return;
    const std::uint32_t node = (o >> 8) & 0xFFFFF, j = o & 0xFF;
    if (node >= sig.nodes.size() || !reached.count(sig.nodes[node])) return;
    const Node& n = *sig.nodes[node];
    if ((log ? n.log_index : n.walk_index) != static_cast<int>(node)) return;
    // Activations, an op's own buffers and parameters are not inputs: when they move, the
    // executable is updated.
    if (j >= n.saved().size() || !n.saved_from_outside(j)) return;
    const Tensor& t = n.saved()[j].tensor;
    if (!t.defined() || t.nbytes() == 0) return;
    for (const InputSlot& s : slots) {
      if (s.address == address) return;
    }
    slots.push_back({address, node, j, 0, Tensor()});
  };
  if (updating) {
    // The same structure again: keep the entry's slots (and their memory), and give one to every
    // saved tensor that moved since.
    for (const InputSlot& s : updating->exec->slots) slots.push_back(s);
    for (std::uint32_t a :
         capture::GraphCache<std::shared_ptr<Executable>>::changed_addresses(*updating, sig)) {
      add(a);
    }
  } else if (warm.nodes_words > 0 && warm.nodes_words == walk_.nodes_words &&
             warm.nodes_addresses == walk_.nodes_addresses &&
             std::equal(warm.structure.begin(),
                        warm.structure.begin() + static_cast<std::ptrdiff_t>(warm.nodes_words),
                        walk_.structure.begin())) {
    // The first capture of the warm-up's structure: a saved tensor that moved since the warm-up
    // is taken to be a new one every step (the batch). Positions are the walk's; the slot is
    // found in this step's signature by its owner.
    for (std::size_t a = 0; a < walk_.nodes_addresses; ++a) {
      if (walk_.addresses[a] == warm.addresses[a]) continue;
      const std::uint32_t o = walk_.address_owners[a];
      if ((o >> 28) != detail::kOwnerSaved) continue;
      const std::size_t i = (o >> 8) & 0xFFFFF;
      if (i >= walk_.nodes.size()) continue;
      const Node* n = walk_.nodes[i];
      const int index = log ? n->log_index : n->walk_index;
      if (index < 0) continue;
      const std::uint32_t want =
          detail::address_owner(detail::kOwnerSaved, static_cast<std::uint32_t>(index), o & 0xFF);
      for (std::size_t p = 0; p < sig.nodes_addresses; ++p) {
        if (sig.address_owners[p] == want) {
          add(static_cast<std::uint32_t>(p));
          break;
        }
      }
    }
  }
  return slots;
}

const Tensor& BackwardGraph::slot_source(const InputSlot& slot) const {
  return signature_.nodes[slot.node]->saved()[slot.saved].tensor;
}

void BackwardGraph::fill_slots(Executable& exec, cudaStream_t caller) {
  std::vector<InputSlot>& slots = exec.slots;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    // Places that save one tensor share one copy (the batch read by every branch's first layer).
    const Tensor& src = slot_source(slots[i]);
    std::size_t leader = i;
    for (std::size_t j = 0; j < i; ++j) {
      const Tensor& other = slot_source(slots[j]);
      if (slots[j].leader == j && other.raw_data() == src.raw_data() &&
          other.shape() == src.shape() && other.dtype() == src.dtype()) {
        leader = j;
        break;
      }
    }
    slots[i].leader = static_cast<std::uint32_t>(leader);
    if (leader != i) {
      slots[i].copy = slots[leader].copy;
      continue;
    }
    // Each group's memory is its own device allocation: outside the step arena (whose slots the
    // next step reuses) and the block cache, alive as long as the executable. A slot that shared
    // another's copy before (an update that split the group) gets its own.
    bool own = slots[i].copy.defined();
    for (std::size_t j = 0; j < i && own; ++j) {
      own = slots[j].copy.raw_data() != slots[i].copy.raw_data();
    }
    if (!own) slots[i].copy = capture::input_slot_like(src, device_, caller);
  }
  refresh_slots(exec, caller);
  for (InputSlot& slot : slots) {
    signature_.nodes[slot.node]->substitute_saved(slot.saved, slot.copy);
  }
}

void BackwardGraph::refresh_slots(const Executable& exec, cudaStream_t caller) {
  // Note [Input slots]: this step's tensor into the graph's slot, on the caller's stream, after
  // the tensor's producer; the previous launch that read the slot ran on this stream or was
  // waited for (order_before_launch). One copy a group, all of them in one launch.
  capture::SlotRefresh refresh(caller);
  for (std::size_t i = 0; i < exec.slots.size(); ++i) {
    const InputSlot& slot = exec.slots[i];
    if (slot.leader != i) continue;
    const Tensor& src = slot_source(slot);
    refresh.add(slot.copy, src);
    slot_sources_.push_back(src);
  }
  refresh.flush();
}
#endif

}  // namespace graphward
