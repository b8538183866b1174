#pragma once
// Checks of a BackwardPlan's stream order (DESIGN.md rules 2-5), shared by the plan's property test
// (random hand-built tapes) and the random-program test (tests/fuzz): which steps must precede
// which, and whether stream order and the plan's waits guarantee it.
#include <utility>
#include <vector>

#include "engine/backward_plan.h"

namespace graphward::testing {

// happens_before[a][b]: step a is ordered before step b by stream order and waits.
inline std::vector<std::vector<bool>> happens_before(const BackwardPlan& p,
                                                     const std::vector<bool>& skip_wait) {
  const int n = static_cast<int>(p.steps.size());
  std::vector<std::vector<int>> next(n);
  std::vector<int> last_on_stream(p.streams.size(), -1);
  for (int i = 0; i < n; ++i) {
    int& last = last_on_stream[p.steps[i].stream];
    if (last >= 0) next[last].push_back(i);
    last = i;
  }
  for (std::size_t w = 0; w < p.waits.size(); ++w) {
    if (!skip_wait[w]) next[p.waits[w].producer].push_back(p.waits[w].consumer);
  }
  std::vector<std::vector<bool>> hb(n, std::vector<bool>(n, false));
  for (int i = n - 1; i >= 0; --i) {  // every edge goes forward in plan order
    for (int j : next[i]) {
      hb[i][j] = true;
      for (int k = 0; k < n; ++k) {
        if (hb[j][k]) hb[i][k] = true;
      }
    }
  }
  return hb;
}

// The orderings the plan must guarantee: (earlier step, later step) pairs.
inline std::vector<std::pair<int, int>> required(const BackwardPlan& p) {
  std::vector<std::pair<int, int>> req;
  for (const auto& b : p.buffers) {
    if (b.kind == BackwardPlan::BufferKind::kGrad) {
      for (int c : b.contributors) {
        if (c >= 0) req.push_back({c, b.owner});
      }
    } else if (b.kind == BackwardPlan::BufferKind::kLeaf) {
      for (std::size_t i = 1; i < b.contributors.size(); ++i) {
        if (b.contributors[i - 1] >= 0 && b.contributors[i - 1] != b.contributors[i]) {
          req.push_back({b.contributors[i - 1], b.contributors[i]});
        }
      }
    }
  }
  return req;
}

inline bool satisfied(const BackwardPlan& p, const std::vector<std::vector<bool>>& hb,
                      const std::pair<int, int>& r) {
  return p.steps[r.first].stream == p.steps[r.second].stream ? r.first < r.second
                                                             : hb[r.first][r.second];
}

}  // namespace graphward::testing
