// Properties of BackwardPlan on random multistream tapes (hand-built, nothing launched): every
// gradient contribution and every pair of writers of one leaf .grad is ordered by stream order and
// the plan's waits (happens-before), no wait is redundant, every stream used is joined, and forked
// unless a wait already orders it after the caller's stream; and the same of the program each plan
// is lowered to. Seeded and reproducible.
#include <algorithm>
#include <random>

#include "graphward/engine/backward/backward_program.h"
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

// ---- the plan's program (Note [The backward program]) -------------------------------------------
// The program run as the GPU orders it: a vector clock a stream (how many instructions of each
// stream it has seen), one tick an instruction on its stream, kRecord keeps its stream's clock in
// the event, kWait merges the event's into its stream's. The caller's stream starts at 1: the work
// enqueued before the backward (the seeds).
struct ProgramClocks {
  std::vector<std::vector<int>> at;  // per instruction: its stream's clock after it
  std::vector<std::vector<int>> end;  // per stream, after the whole program
  // Whether instruction a is ordered before instruction b.
  bool before(const BackwardProgram& prog, int a, int b) const {
    const int s = prog.instrs[a].stream;
    return at[b][s] >= at[a][s];
  }
};

ProgramClocks run_clocks(const BackwardPlan& p, const BackwardProgram& prog) {
  using Op = BackwardInstr::Op;
  const std::size_t streams = p.streams.size() + 1;  // and the reducer's
  std::vector<std::vector<int>> clock(streams, std::vector<int>(streams, 0));
  std::vector<std::vector<int>> event(static_cast<std::size_t>(prog.num_events));
  clock[0][0] = 1;
  ProgramClocks out;
  for (std::size_t i = 0; i < prog.instrs.size(); ++i) {
    const BackwardInstr& in = prog.instrs[i];
    EXPECT_GE(in.stream, 0) << "instruction " << i;
    EXPECT_LT(static_cast<std::size_t>(in.stream), streams) << "instruction " << i;
    std::vector<int>& c = clock[static_cast<std::size_t>(in.stream)];
    if (in.op == Op::kWait) {
      EXPECT_FALSE(event[in.event].empty()) << "instruction " << i << " waits on e" << in.event
                                            << " before any instruction records it";
      for (std::size_t k = 0; k < streams && !event[in.event].empty(); ++k) {
        c[k] = std::max(c[k], event[in.event][k]);
      }
    } else if (in.stream != 0) {
      EXPECT_GE(c[0], 1) << "instruction " << i << " runs on s" << in.stream
                         << " before that stream waited on the caller's (rule [fork and join])";
    }
    ++c[static_cast<std::size_t>(in.stream)];
    if (in.op == Op::kRecord) {
      EXPECT_LT(in.event, prog.num_events);
      event[in.event] = c;
    }
    out.at.push_back(c);
  }
  out.end = clock;
  return out;
}

// Every property of a plan's program that the executor relies on: each step's instructions in
// order on the right streams, every gradient contribution and leaf write ordered before its
// reader (or next writer), every bucket reduced once, in order, after its gradients' writers,
// every stream forked before it runs and joined into the caller's at the end.
void check_program(const BackwardPlan& p, const BackwardProgram& prog, std::size_t buckets) {
  using Op = BackwardInstr::Op;
  const int n = static_cast<int>(p.steps.size());
  std::vector<int> part(3 * static_cast<std::size_t>(n), -1);  // as happens_before_parts numbers
  std::vector<int> reduced;
  int last_step = -1;
  for (int i = 0; i < static_cast<int>(prog.instrs.size()); ++i) {
    const BackwardInstr& in = prog.instrs[i];
    if (i >= prog.join_begin) {
      EXPECT_TRUE(in.op == Op::kRecord || in.op == Op::kWait) << "instruction " << i;
    }
    if (in.op == Op::kReduce) reduced.push_back(in.index);
    if (in.step < 0) continue;
    ASSERT_LT(in.step, n);
    ASSERT_GE(in.step, last_step) << "instruction " << i << ": the steps in plan order";
    last_step = in.step;
    const auto& st = p.steps[static_cast<std::size_t>(in.step)];
    const std::size_t base = 3 * static_cast<std::size_t>(in.step);
    switch (in.op) {
      case Op::kGather:
        EXPECT_EQ(part[base], -1);
        part[base] = i;
        break;
      case Op::kRun:
        EXPECT_EQ(part[base + 1], -1);
        EXPECT_EQ(st.side_stream >= 0, part[base + 2] >= 0) << "the side part before the rest";
        part[base + 1] = i;
        break;
      case Op::kRunSide:
        EXPECT_EQ(in.stream, st.side_stream);
        EXPECT_EQ(part[base + 2], -1);
        part[base + 2] = i;
        break;
      case Op::kRelease:
      case Op::kDrop:
        EXPECT_GE(part[base + 1], 0) << "instruction " << i << " before the step's kRun";
        break;
      default: break;
    }
    if (in.op == Op::kGather || in.op == Op::kRun || in.op == Op::kRelease || in.op == Op::kDrop) {
      EXPECT_EQ(in.stream, st.stream) << "instruction " << i;
    }
  }
  for (int k = 0; k < n; ++k) {
    EXPECT_GE(part[3 * k], 0) << "step " << k << " gathered";
    EXPECT_GE(part[3 * k + 1], 0) << "step " << k << " run";
    if (p.steps[k].side_stream < 0) part[3 * k + 2] = part[3 * k + 1];  // one part
  }
  std::vector<int> all(buckets);
  for (std::size_t b = 0; b < buckets; ++b) all[b] = static_cast<int>(b);
  EXPECT_EQ(reduced, all) << "every bucket reduced once, in order";
  const ProgramClocks clocks = run_clocks(p, prog);
  for (const auto& [a, b] : required_parts(p)) {
    EXPECT_TRUE(clocks.before(prog, part[a], part[b])) << "part " << a << " -> part " << b;
  }
  for (int i = 0; i < static_cast<int>(prog.instrs.size()); ++i) {
    if (prog.instrs[i].op != Op::kReduce) continue;
    for (int buf : prog.buckets[prog.instrs[i].index].buffers) {
      for (int c : p.buffers[buf].contributors) {
        if (c < 0) continue;
        EXPECT_TRUE(clocks.before(prog, part[3 * c + 2], i))
            << "bucket " << prog.instrs[i].index << " reduced before step " << c << " wrote b"
            << buf;
      }
    }
  }
  for (std::size_t s = 0; s < clocks.end.size(); ++s) {
    EXPECT_EQ(clocks.end[0][s], clocks.end[s][s]) << "s" << s << " not joined into the caller's";
  }
}

TEST(BackwardProgram, RandomPlansLowerToProgramsThatOrderGradientsBucketsForksAndJoins) {
  std::mt19937 rng(20261203);
  int reductions = 0, side_parts = 0, waits = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int num_nodes = std::uniform_int_distribution<int>(1, 30)(rng);
    const int num_streams = std::uniform_int_distribution<int>(1, 4)(rng);
    const int caller = std::uniform_int_distribution<int>(0, num_streams)(rng);
    RandomTape t = make_tape(rng, num_nodes, num_streams, 3);
    const bool split = trial % 2 == 1;
    const BackwardPlan p = plan_backward(t.roots, fake_stream(caller), GradWrite::kOverwrite,
                                         {.split_weight_grads = split});
    // No reducer, or buckets of one to three 8-byte gradients.
    std::vector<GradBucket> buckets;
    if (trial % 3 != 0) buckets = plan_grad_buckets(p, 8 * (1 + trial % 3), 8);
    const std::size_t count = buckets.size();
    const BackwardProgram prog = lower_plan(p, std::move(buckets));
    SCOPED_TRACE("trial " + std::to_string(trial) + "\n" + p.dump() + prog.dump(p));
    check_program(p, prog, count);
    reductions += static_cast<int>(count);
    for (const auto& in : prog.instrs) {
      side_parts += in.op == BackwardInstr::Op::kRunSide;
      waits += in.op == BackwardInstr::Op::kWait;
    }
  }
  EXPECT_GT(reductions, 100) << "the random plans should reduce buckets";
  EXPECT_GT(side_parts, 100) << "and split steps";
  EXPECT_GT(waits, 300) << "and wait across streams";
}

// A CPU plan's program (events off) is the same program without its events: the executor runs the
// same steps, side parts and reductions in the same order.
TEST(BackwardProgram, WithoutEventsTheProgramIsTheSameLessItsRecordsAndWaits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    RandomTape t = make_tape(rng, 20, 3, 3);
    const BackwardPlan p = plan_backward(t.roots, fake_stream(0), GradWrite::kOverwrite,
                                         {.split_weight_grads = trial % 2 == 1});
    const BackwardProgram with = lower_plan(p, plan_grad_buckets(p, 16)),
                          without = lower_plan(p, plan_grad_buckets(p, 16), false);
    std::vector<std::pair<BackwardInstr::Op, int>> a, b;
    for (const auto& in : with.instrs) {
      if (in.op != BackwardInstr::Op::kRecord && in.op != BackwardInstr::Op::kWait)
        a.push_back({in.op, in.step});
    }
    for (const auto& in : without.instrs) {
      EXPECT_NE(in.op, BackwardInstr::Op::kRecord);
      EXPECT_NE(in.op, BackwardInstr::Op::kWait);
      b.push_back({in.op, in.step});
    }
    EXPECT_EQ(a, b) << "trial " << trial;
  }
}

}  // namespace
}  // namespace graphward
