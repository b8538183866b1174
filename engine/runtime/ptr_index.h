#pragma once
// A small open-addressing map from pointers to indices, for the per-step walks of a tape (planning,
// signatures): no allocation per entry, where std::unordered_map allocates a node per insert.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "graphward/base/error.h"

namespace graphward::detail {

class PtrIndex {
 public:
  explicit PtrIndex(std::size_t expected) {
    std::size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    slots_.assign(cap, {nullptr, -1});
  }
  // The index stored for `key`, inserting `value` if absent; second: whether it was inserted.
  std::pair<int, bool> emplace(const void* key, int value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    auto& slot = find(key);
    if (slot.first) return {slot.second, false};
    slot = {key, value};
    ++size_;
    return {value, true};
  }
  int at(const void* key) const {
    const auto& slot = const_cast<PtrIndex*>(this)->find(key);
    GW_CHECK(slot.first != nullptr, "internal error: a pointer missing from a PtrIndex");
    return slot.second;
  }
  // The index stored for `key`, or -1.
  int find_index(const void* key) const {
    const auto& slot = const_cast<PtrIndex*>(this)->find(key);
    return slot.first ? slot.second : -1;
  }
  std::size_t size() const { return size_; }
  // Empties the map, keeping its table.
  void clear() {
    std::fill(slots_.begin(), slots_.end(), std::pair<const void*, int>{nullptr, -1});
    size_ = 0;
  }

 private:
  std::pair<const void*, int>& find(const void* key) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = (reinterpret_cast<std::uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull >> 7;
    for (i &= mask;; i = (i + 1) & mask) {
      if (slots_[i].first == key || slots_[i].first == nullptr) return slots_[i];
    }
  }
  void grow() {
    std::vector<std::pair<const void*, int>> old(slots_.size() * 2, {nullptr, -1});
    old.swap(slots_);
    size_ = 0;
    for (const auto& [k, v] : old) {
      if (k) emplace(k, v);
    }
  }
  std::vector<std::pair<const void*, int>> slots_;
  std::size_t size_ = 0;
};

}  // namespace graphward::detail
