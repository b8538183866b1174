// Properties of BackwardPlan on random multistream tapes (hand-built, nothing launched): every
// gradient contribution and every pair of writers of one leaf .grad is ordered by stream order and
// the plan's waits (happens-before), no wait is redundant, and forks/joins cover every stream used.
// Seeded and reproducible.
#include <random>

#include "test_util.h"

namespace graphward {
namespace {

cudaStream_t fake_stream(int id) {
  return reinterpret_cast<cudaStream_t>(std::uintptr_t(id + 1) * 0x1000);
}
constexpr Device kDev = Device::cuda(0);

struct RandomTape {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<Tensor> leaves;
  std::vector<PlanRoot> roots;
};

RandomTape make_tape(std::mt19937& rng, int num_nodes, int num_streams, int num_leaves) {
  RandomTape t;
  for (int i = 0; i < num_leaves; ++i) t.leaves.push_back(zeros({2}).set_requires_grad(true));
  std::uniform_int_distribution<int> stream_of(0, num_streams - 1);
  for (int i = 0; i < num_nodes; ++i) {
    std::vector<InputMeta> in;
    const int fan_in = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int j = 0; j < fan_in; ++j) {
      const int pick = std::uniform_int_distribution<int>(0, i + num_leaves)(rng);
      InputMeta m{{2}, DType::kFloat32, kDev, nullptr, {}};
      if (pick < i) {
        m.edge.node = t.nodes[pick];  // may repeat: the same input used twice
      } else if (pick < i + num_leaves) {
        m.edge.leaf = t.leaves[pick - i];
      }  // else: an input that does not require grad
      in.push_back(std::move(m));
    }
    t.nodes.push_back(make_node("n", kDev, fake_stream(stream_of(rng)), std::move(in), {2}));
  }
  // Roots: the last node, plus sometimes another one.
  t.roots.push_back({t.nodes.back(), {}});
  if (num_nodes > 3 && rng() % 2) t.roots.push_back({t.nodes[rng() % (num_nodes - 1)], {}});
  return t;
}

// happens_before[a][b]: step a is ordered before step b by stream order and waits.
std::vector<std::vector<bool>> happens_before(const BackwardPlan& p,
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
std::vector<std::pair<int, int>> required(const BackwardPlan& p) {
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

bool satisfied(const BackwardPlan& p, const std::vector<std::vector<bool>>& hb,
               const std::pair<int, int>& r) {
  return p.steps[r.first].stream == p.steps[r.second].stream ? r.first < r.second
                                                             : hb[r.first][r.second];
}

// Plans of 300 random tapes (1-30 nodes, 1-4 streams, a caller stream that may be unused,
// inputs used twice, leaves written from several streams).
std::vector<std::pair<RandomTape, BackwardPlan>> random_plans() {
  std::mt19937 rng(20261130);
  std::vector<std::pair<RandomTape, BackwardPlan>> out;
  for (int trial = 0; trial < 300; ++trial) {
    const int num_nodes = std::uniform_int_distribution<int>(1, 30)(rng);
    const int num_streams = std::uniform_int_distribution<int>(1, 4)(rng);
    const int caller = std::uniform_int_distribution<int>(0, num_streams)(rng);
    RandomTape t = make_tape(rng, num_nodes, num_streams, 3);
    BackwardPlan p = plan_backward(t.roots, fake_stream(caller), GradWrite::kOverwrite);
    out.emplace_back(std::move(t), std::move(p));
  }
  return out;
}

TEST(BackwardPlanProperties, RandomTapesAreOrderedAndJoined) {
  int total_waits = 0, trial = 0;
  for (const auto& [tape, p] : random_plans()) {
    SCOPED_TRACE("trial " + std::to_string(trial++) + "\n" + p.dump());
    // Every step's node runs on its own stream; the order is topological.
    for (const auto& s : p.steps) ASSERT_EQ(p.streams[s.stream], s.node->stream());
    for (const auto& r : required(p)) ASSERT_LT(r.first, r.second);
    // Happens-before holds for every required ordering.
    const auto hb = happens_before(p, std::vector<bool>(p.waits.size(), false));
    for (const auto& r : required(p)) {
      EXPECT_TRUE(satisfied(p, hb, r)) << "step " << r.first << " -> step " << r.second;
    }
    total_waits += static_cast<int>(p.waits.size());
    // Forks and joins: exactly the streams other than the caller's.
    EXPECT_EQ(p.forks.size(), p.streams.size() - 1);
    EXPECT_EQ(p.joins, p.forks);
    for (int f : p.forks) EXPECT_NE(f, 0);
    // Overwrite mode: the first write of each leaf overwrites, later ones add.
    for (std::size_t b = 0; b < p.buffers.size(); ++b) {
      if (p.buffers[b].kind != BackwardPlan::BufferKind::kLeaf) continue;
      int writes = 0;
      for (const auto& s : p.steps) {
        for (const auto& w : s.writes) {
          if (w.buffer == static_cast<int>(b)) {
            EXPECT_EQ(w.accumulate, writes++ > 0);
          }
        }
      }
    }
  }
  EXPECT_GT(total_waits, 100) << "the random tapes should exercise cross-stream waits";
}

// Minimality: dropping any single wait breaks some required ordering. (Found broken on 2026-11-30:
// a step's leaf-writer waits were placed after its contributor waits and could cover one of them;
// plan_backward now places all of a step's waits latest first.)
TEST(BackwardPlanProperties, NoWaitIsRedundant) {
  int trial = 0;
  for (const auto& [tape, p] : random_plans()) {
    SCOPED_TRACE("trial " + std::to_string(trial++) + "\n" + p.dump());
    for (std::size_t w = 0; w < p.waits.size(); ++w) {
      std::vector<bool> skip(p.waits.size(), false);
      skip[w] = true;
      const auto hb_without = happens_before(p, skip);
      bool needed = false;
      for (const auto& r : required(p)) needed = needed || !satisfied(p, hb_without, r);
      EXPECT_TRUE(needed) << "wait " << w << " is redundant";
    }
  }
}

}  // namespace
}  // namespace graphward
