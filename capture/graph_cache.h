#pragma once
// The graph cache (DESIGN.md, "Capture and replay"): captured executables keyed by the structure of
// the tape they were captured from, each with the addresses it was last made valid for.
//
// Before every replay the caller asks decide() with this step's signature:
//   * same structure, same addresses  -> kReplay:  launch the cached executable as it is;
//   * same structure, other addresses -> kUpdate:  update that executable to the new pointers;
//   * a structure not in the cache    -> kCapture: capture a new graph and insert() it.
// Updates and captures come with a readable reason (what changed, against which entry). The cache
// holds at most `capacity` executables; inserting beyond evicts the least recently used. Nothing
// here touches CUDA: `Exec` is whatever the caller keeps per entry (a cudaGraphExec_t owner on the
// GPU; anything in tests).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <utility>

#include "capture/signature.h"
#include "engine/error.h"

namespace graphward::capture {

struct GraphCacheCounters {
  std::uint64_t captures = 0;   // new graphs captured and inserted
  std::uint64_t updates = 0;    // executables updated to new addresses
  std::uint64_t replays = 0;    // launches (after an update or capture too)
  std::uint64_t evictions = 0;  // entries dropped to stay within capacity
};

template <class Exec>
class GraphCache {
 public:
  struct Entry {
    TapeSignature signature;
    Exec exec;
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
      if (e.signature.same_addresses(now)) return {Action::kReplay, &e, {}};
      return {Action::kUpdate, &e, describe_difference(e.signature, now)};
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
    if (was.same_addresses(now)) return {Action::kReplay, &e, {}};
    return {Action::kUpdate, &e, describe_difference(was, now)};
  }

  // A newly captured executable for `signature`: inserted as the most recently used entry, the
  // least recently used one evicted beyond capacity. Counts a capture.
  Entry& insert(const TapeSignature& signature, Exec exec) {
    entries_.push_front(Entry{signature, std::move(exec)});
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
