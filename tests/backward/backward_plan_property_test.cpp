// Properties of BackwardPlan on random multistream tapes (hand-built, nothing launched): every
// gradient contribution and every pair of writers of one leaf .grad is ordered by stream order and
// the plan's waits (happens-before), no wait is redundant, every stream used is joined, and forked
// unless a wait already orders it after the caller's stream.
// Seeded and reproducible.
#include <random>

#include "backward/plan_checks.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::expect_forks_and_joins;
using testing::happens_before;
using testing::required;
using testing::satisfied;

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
  int total_waits = 0, trial = 0, forked = 0, unforked = 0;
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
    // Joins: exactly the streams other than the caller's; forks: those of them whose first step
    // the waits do not already order after a step of the caller's stream.
    std::vector<int> forks, joins;
    expect_forks_and_joins(p, hb, &forks, &joins);
    EXPECT_EQ(p.forks, forks);
    EXPECT_EQ(p.joins, joins);
    forked += static_cast<int>(p.forks.size());
    unforked += static_cast<int>(p.joins.size() - p.forks.size());
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
  EXPECT_GT(forked, 10) << "the random tapes should fork streams";
  EXPECT_GT(unforked, 10) << "the random tapes should have streams ordered by a wait alone";
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

// ---- the same with weight-gradient parallelism (PlanOptions::split_weight_grads) ----------------
// A step is three parts: its start on its stream (waits, then the gradient is assembled and the
// side stream forked), its main part on its stream, and its side part (leaf gradients) on the side
// stream. Part p of step s is node 3s + p.

std::vector<std::vector<bool>> happens_before_parts(const BackwardPlan& p,
                                                    const std::vector<bool>& skip_wait) {
  const int n = 3 * static_cast<int>(p.steps.size());
  std::vector<std::vector<int>> next(n);
  std::vector<int> last_on_stream(p.streams.size(), -1);
  auto on_stream = [&](int stream, int part) {
    int& last = last_on_stream[stream];
    if (last >= 0) next[last].push_back(part);
    last = part;
  };
  for (int s = 0; s < static_cast<int>(p.steps.size()); ++s) {
    const auto& st = p.steps[s];
    on_stream(st.stream, 3 * s);
    on_stream(st.stream, 3 * s + 1);
    if (st.side_stream >= 0) {
      next[3 * s].push_back(3 * s + 2);  // the fork, after the start
      on_stream(st.side_stream, 3 * s + 2);
    }
  }
  for (std::size_t w = 0; w < p.waits.size(); ++w) {
    if (skip_wait[w]) continue;
    const auto& wt = p.waits[w];
    const int from = 3 * wt.producer + (wt.producer_side ? 2 : 1);
    const int to = 3 * wt.consumer + (wt.consumer_side ? 2 : 0);
    next[from].push_back(to);
  }
  std::vector<std::vector<bool>> hb(n, std::vector<bool>(n, false));
  for (int i = n - 1; i >= 0; --i) {
    for (int j : next[i]) {
      hb[i][j] = true;
      for (int k = 0; k < n; ++k) {
        if (hb[j][k]) hb[i][k] = true;
      }
    }
  }
  return hb;
}

// (earlier part, later part): a contribution before its consumer's start; consecutive writers
// of a leaf, each from the part that writes it.
std::vector<std::pair<int, int>> required_parts(const BackwardPlan& p) {
  auto leaf_writer = [&](int s) { return 3 * s + (p.steps[s].side_stream >= 0 ? 2 : 1); };
  std::vector<std::pair<int, int>> req;
  for (const auto& b : p.buffers) {
    if (b.kind == BackwardPlan::BufferKind::kGrad) {
      for (int c : b.contributors) {
        if (c >= 0) req.push_back({3 * c + 1, 3 * b.owner});
      }
    } else if (b.kind == BackwardPlan::BufferKind::kLeaf) {
      for (std::size_t i = 1; i < b.contributors.size(); ++i) {
        const int a = b.contributors[i - 1], c = b.contributors[i];
        if (a >= 0 && a != c) req.push_back({leaf_writer(a), leaf_writer(c)});
      }
    }
  }
  return req;
}

TEST(BackwardPlanProperties, SplitPlansOfRandomTapesAreOrderedJoinedAndMinimal) {
  std::mt19937 rng(20261201);
  int split_steps = 0, side_waits = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int num_nodes = std::uniform_int_distribution<int>(1, 30)(rng);
    const int num_streams = std::uniform_int_distribution<int>(1, 4)(rng);
    const int caller = std::uniform_int_distribution<int>(0, num_streams)(rng);
    RandomTape t = make_tape(rng, num_nodes, num_streams, 3);
    const BackwardPlan p = plan_backward(t.roots, fake_stream(caller), GradWrite::kOverwrite,
                                         {.split_weight_grads = true});
    SCOPED_TRACE("trial " + std::to_string(trial) + "\n" + p.dump());
    const auto hb = happens_before_parts(p, std::vector<bool>(p.waits.size(), false));
    for (const auto& [a, b] : required_parts(p)) {
      EXPECT_TRUE(hb[a][b]) << "part " << a << " -> part " << b;
    }
    for (const auto& st : p.steps) {
      split_steps += st.side_stream >= 0;
      side_waits += static_cast<int>(st.side_waits.size());
      if (st.side_stream >= 0) {
        ASSERT_LT(static_cast<std::size_t>(st.side_stream), p.side_of.size());
        EXPECT_EQ(p.side_of[st.side_stream], st.stream);
        EXPECT_EQ(p.streams[st.side_stream], nullptr);
      }
    }
    // Every stream but the caller's is joined; side streams are not forked.
    EXPECT_EQ(p.joins.size(), p.streams.size() - 1);
    for (int f : p.forks) EXPECT_EQ(p.side_of[f], -1);
    // Minimal: dropping any wait breaks a required ordering.
    for (std::size_t w = 0; w < p.waits.size(); ++w) {
      std::vector<bool> skip(p.waits.size(), false);
      skip[w] = true;
      const auto without = happens_before_parts(p, skip);
      bool needed = false;
      for (const auto& [a, b] : required_parts(p)) needed = needed || !without[a][b];
      EXPECT_TRUE(needed) << "wait " << w << " is redundant";
    }
  }
  EXPECT_GT(split_steps, 100) << "the random tapes should exercise split steps";
  EXPECT_GT(side_waits, 5) << "and leaf writers across side streams";
}

}  // namespace
}  // namespace graphward
