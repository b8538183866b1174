#pragma once
// Checks of a BackwardPlan's stream order (rules [forward stream], [cross-stream gradients], [fork
// and join] and [leaf gradients]), shared by the plan's property test (random hand-built tapes) and
// the random-program test (tests/fuzz): which steps must precede which, and whether stream order
// and the plan's waits guarantee it.
#include <utility>
#include <vector>

#include "graphward/engine/backward/backward_plan.h"

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

// The forks and joins a plan needs (rule [fork and join]): every stream other than the caller's is
// joined; a forward stream is forked unless its first step is ordered after a step of the caller's
// stream (stream 0), which orders all of its work after everything before the backward, as a fork
// would.
inline void expect_forks_and_joins(const BackwardPlan& p, const std::vector<std::vector<bool>>& hb,
                                   std::vector<int>* forks, std::vector<int>* joins) {
  forks->clear();
  joins->clear();
  const int k = static_cast<int>(p.streams.size());
  for (int x = 1; x < k; ++x) {
    joins->push_back(x);
    if (x < static_cast<int>(p.side_of.size()) && p.side_of[x] >= 0) continue;  // a side stream
    int first = -1;
    for (int i = 0; i < static_cast<int>(p.steps.size()) && first < 0; ++i) {
      if (p.steps[i].stream == x) first = i;
    }
    bool follows = false;
    for (int c = 0; c < first && !follows; ++c) follows = p.steps[c].stream == 0 && hb[c][first];
    if (!follows) forks->push_back(x);
  }
}

}  // namespace graphward::testing
