#pragma once
// The graph cache (docs/DESIGN.md, "Capture and replay"): captured executables keyed by the
// structure of the tape they were captured from, each with the addresses it was last made valid
// for.
//
// Before every replay the caller asks decide() with this step's signature:
//   * same structure, same addresses  -> kReplay:  launch the cached executable as it is;
//   * same structure, other addresses -> kUpdate:  update that executable to the new pointers;
//   * a structure not in the cache    -> kCapture: capture a new graph and insert() it.
// Updates and captures come with a readable reason (what changed, against which entry). An entry
// may leave some addresses unbound (Entry::unbound): its executable refreshes what they point at
// itself before each launch (Note [Input slots], capture/backward_graph.h), so they are not
// compared. The cache holds at most `capacity` executables; inserting beyond evicts the least
// recently used. Nothing
// here touches CUDA: `Exec` is whatever the caller keeps per entry (a cudaGraphExec_t owner on the
// GPU; anything in tests).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/capture/signature.h"

namespace graphward::capture {

struct GraphCacheCounters {
  std::uint64_t captures = 0;   // new graphs captured and inserted
  std::uint64_t updates = 0;    // executables updated to new addresses
  std::uint64_t replays = 0;    // launches (after an update or capture too)
  std::uint64_t evictions = 0;  // entries dropped to stay within capacity
};

// An address a graph does not bake in (Entry::unbound): its position, and its group's first.
struct Unbound {
  std::uint32_t position = 0, leader = 0;
  bool operator<(const Unbound& o) const { return position < o.position; }
};

template <class Exec>
class GraphCache {
 public:
  struct Entry {
    TapeSignature signature;
    Exec exec;
    // Positions in signature.addresses that are not compared (ascending), each with the first
    // position of its group: the executable reads its own copy of what they point at, refreshed
    // before each launch, one copy a group, so the positions of a group must still point at one
    // tensor (equal addresses).
    std::vector<Unbound> unbound;
  };
  enum class Action { kReplay, kUpdate, kCapture };
  struct Decision {
    Action action = Action::kCapture;
    Entry* entry = nullptr;  // kReplay/kUpdate: the entry to launch (now the most recently used)
    std::string reason;      // kUpdate/kCapture: why (empty for kReplay)
  };

  explicit GraphCache(std::size_t capacity) : capacity_(capacity) {
    GW_CHECK(capacity > 0, "GraphCache: capacity must be at least 1");
  }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return capacity_; }
  const GraphCacheCounters& counters() const { return counters_; }

  // What to do with a step whose tape has signature `now`. Marks a matching entry most recently
  // used. Counts nothing: the caller counts what it did (count_update, count_replay, insert).
  Decision decide(const TapeSignature& now) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (!it->signature.same_structure(now)) continue;
      entries_.splice(entries_.begin(), entries_, it);  // most recently used first
      Entry& e = entries_.front();
      if (addresses_match(e, now)) return {Action::kReplay, &e, {}};
      return {Action::kUpdate, &e, update_reason(e, now)};
    }
    if (entries_.empty()) return {Action::kCapture, nullptr, "no graph captured yet"};
    // Against the most recently used entry: usually the previous step's graph.
    return {Action::kCapture, nullptr,
            describe_difference(entries_.front().signature, now) + " (" +
                std::to_string(entries_.size()) + " cached graph" +
                (entries_.size() == 1 ? "" : "s") + ", none with this structure)"};
  }

  // The entry the last decide() or insert() returned (the most recently used), or nullptr.
  Entry* most_recent() { return entries_.empty() ? nullptr : &entries_.front(); }

  // decide() for a signature whose nodes' part (TapeSignature::nodes_words) is already known to
  // equal that of `e`, the most recently used entry (the tape log's running comparison): compares
  // only the rest of the structure and the addresses. Falls back to decide() if the rest differs.
  Decision decide_nodes_known(Entry& e, const TapeSignature& now) {
    GW_CHECK(&e == most_recent(), "GraphCache::decide_nodes_known: internal error: expected the "
                                  "most recently used entry");
    const TapeSignature& was = e.signature;
    const bool same = was.structure_hash == now.structure_hash &&
                      was.nodes_words == now.nodes_words &&
                      was.structure.size() == now.structure.size() &&
                      std::equal(was.structure.begin() + static_cast<std::ptrdiff_t>(was.nodes_words),
                                 was.structure.end(),
                                 now.structure.begin() + static_cast<std::ptrdiff_t>(now.nodes_words));
    if (!same) return decide(now);
    if (addresses_match(e, now)) return {Action::kReplay, &e, {}};
    return {Action::kUpdate, &e, update_reason(e, now)};
  }

  // A newly captured executable for `signature`: inserted as the most recently used entry, the
  // least recently used one evicted beyond capacity. Counts a capture.
  Entry& insert(const TapeSignature& signature, Exec exec, std::vector<Unbound> unbound = {}) {
    std::sort(unbound.begin(), unbound.end());
    entries_.push_front(Entry{signature, std::move(exec), std::move(unbound)});
    entries_.front().signature.nodes.clear();  // this step's handles: not kept
    entries_.front().signature.streams.clear();
    entries_.front().signature.leaves.clear();
    ++counters_.captures;
    while (entries_.size() > capacity_) {
      entries_.pop_back();
      ++counters_.evictions;
    }
    return entries_.front();
  }

  // Whether `now`'s addresses are those `e` was made valid for, its unbound positions aside.
  static bool addresses_match(const Entry& e, const TapeSignature& now) {
    if (e.unbound.empty()) return e.signature.same_addresses(now);
    const std::vector<std::uintptr_t>& a = e.signature.addresses;
    const std::vector<std::uintptr_t>& b = now.addresses;
    if (a.size() != b.size()) return false;
    std::size_t from = 0;
    for (const Unbound& u : e.unbound) {
      const std::uint32_t skip = u.position;
      if (skip >= a.size() || u.leader >= b.size()) return false;
      if (b[skip] != b[u.leader]) return false;  // the group split: its positions need own copies
      if (!std::equal(a.begin() + static_cast<std::ptrdiff_t>(from),
                      a.begin() + static_cast<std::ptrdiff_t>(skip),
                      b.begin() + static_cast<std::ptrdiff_t>(from))) {
        return false;
      }
      from = skip + 1;
    }
    return std::equal(a.begin() + static_cast<std::ptrdiff_t>(std::min(from, a.size())), a.end(),
                      b.begin() + static_cast<std::ptrdiff_t>(std::min(from, a.size())));
  }
  // The positions where `now`'s addresses differ from `e`'s, its unbound positions aside (same
  // structure: the same number of addresses).
  static std::vector<std::uint32_t> changed_addresses(const Entry& e, const TapeSignature& now) {
    std::vector<std::uint32_t> out;
    const std::vector<std::uintptr_t>& a = e.signature.addresses;
    const std::size_t n = std::min(a.size(), now.addresses.size());
    for (std::size_t i = 0; i < n; ++i) {
      if (a[i] != now.addresses[i] &&
          !std::binary_search(e.unbound.begin(), e.unbound.end(),
                              Unbound{static_cast<std::uint32_t>(i), 0})) {
        out.push_back(static_cast<std::uint32_t>(i));
      }
    }
    return out;
  }

  // Why `now` updates `e` (same structure): describe_difference, its unbound positions aside.
  static std::string update_reason(const Entry& e, const TapeSignature& now) {
    if (e.unbound.empty()) return describe_difference(e.signature, now);
    const std::vector<std::uint32_t> changed = changed_addresses(e, now);
    if (changed.empty()) {
      return "a tensor read by " + std::to_string(e.unbound.size()) +
             " saved places at capture now differs among them (they had one input slot)";
    }
    return std::to_string(changed.size()) + " of " + std::to_string(now.addresses.size()) +
           " addresses changed (" + std::to_string(e.unbound.size()) +
           " refreshed by the graph not counted); the first is " +
           now.address_owner_str(changed.front());
  }

  // The entry's executable was updated to `signature`'s addresses.
  void count_update(Entry& entry, const TapeSignature& signature) {
    entry.signature.addresses = signature.addresses;
    entry.signature.address_hash = signature.address_hash;
    entry.signature.address_owners = signature.address_owners;
    ++counters_.updates;
  }
  void count_replay() { ++counters_.replays; }

  void clear() { entries_.clear(); }

 private:
  std::size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
  GraphCacheCounters counters_;
};

}  // namespace graphward::capture
