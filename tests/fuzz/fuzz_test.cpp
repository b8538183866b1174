// Random programs on the CPU backend (tests/fuzz/random_program.h): every program's roots and leaf
// gradients in float32 agree with the same program in float64; the backward plan of every
// program's tape on its streams orders every gradient contribution and leaf write with no
// redundant wait; the tape log's signatures and the walk's agree on which tapes are one graph;
// and the generator is reproducible. GW_FUZZ_PROGRAMS / GW_FUZZ_SEED choose how many programs and
// from which seed.
#include <cstdio>

#include "backward/plan_checks.h"
#include "graphward/capture/signature.h"
#include "fuzz/random_program.h"
#include "graphward/engine/tape/tape_log.h"
#include "test_util.h"

namespace graphward {
namespace {

// float32 against float64: a structural bug (a lost or doubled contribution, a wrong stream
// order) is an error of the gradient's own size; float32 rounding through up to 16 ops stays
// under this (seeds 1-30000 on the CPU, none over; the largest seen before layer_norm's eps was
// raised to 0.01 in the generator were gradients that are zero in exact arithmetic).
constexpr double kTolerance = 5e-3;

TEST(FuzzCpu, TheSameSeedMakesTheSameProgramAndSeedsDiffer) {
  EXPECT_EQ(fuzz::generate(7).str(), fuzz::generate(7).str());
  EXPECT_NE(fuzz::generate(7).str(), fuzz::generate(8).str());
}

TEST(FuzzCpu, ProgramsCoverEveryOpFanOutSeveralStreamsAndRoots) {
  std::vector<int> seen(static_cast<int>(fuzz::OpKind::kCount), 0);
  int fan_out = 0, multistream = 0, multiroot = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    const fuzz::Program p = fuzz::generate(seed);
    std::vector<int> reads(static_cast<std::size_t>(p.num_values()), 0);
    for (const fuzz::Op& o : p.ops) {
      ++seen[static_cast<int>(o.kind)];
      ++reads[static_cast<std::size_t>(o.a)];
      if (o.b >= 0) ++reads[static_cast<std::size_t>(o.b)];
      EXPECT_LT(o.stream, p.num_streams);
    }
    fan_out += *std::max_element(reads.begin(), reads.end()) > 1;
    multistream += p.num_streams > 1;
    multiroot += p.roots.size() > 1;
  }
  for (int k = 0; k < static_cast<int>(fuzz::OpKind::kCount); ++k) {
    EXPECT_GT(seen[k], 0) << fuzz::op_name(static_cast<fuzz::OpKind>(k));
  }
  EXPECT_GT(fan_out, 150);
  EXPECT_GT(multistream, 150);
  EXPECT_GT(multiroot, 100);
}

TEST(FuzzCpu, Float32GradientsOfRandomProgramsMatchTheFloat64Program) {
  const int n = fuzz::programs_to_run(300);
  const std::uint64_t first = fuzz::first_seed();
  for (std::uint64_t seed = first; seed < first + static_cast<std::uint64_t>(n); ++seed) {
    const fuzz::Program p = fuzz::generate(seed);
    fuzz::Outcome ref, got;
    try {
      ref = fuzz::run(p, Device::cpu(), DType::kFloat64, fuzz::RunMode::kEagerOneStream);
      got = fuzz::run(p, Device::cpu(), DType::kFloat32, fuzz::RunMode::kEagerOneStream);
    } catch (const std::exception& e) {
      FAIL() << e.what() << "\n" << p.str();
    }
    std::string what;
    const double d = fuzz::max_difference(got, ref, &what);
    ASSERT_LT(d, kTolerance) << what << "\n" << p.str();
  }
}

// The plans of the programs' tapes on their (fake) streams, with the caller's stream one of them or
// another: every contribution reaches its consumer and every pair of writers of a leaf's .grad is
// ordered (stream order or a wait), no wait can be dropped, every stream other than the caller's is
// joined, and forked unless its first wait already orders it after the caller's stream. Nothing runs: these are the plans the GPU would run.
TEST(FuzzCpu, ThePlansOfRandomProgramsOnTheirStreamsAreOrderedAndMinimal) {
  const int n = fuzz::programs_to_run(300);
  const std::uint64_t first = fuzz::first_seed();
  int total_waits = 0;
  for (std::uint64_t seed = first; seed < first + static_cast<std::uint64_t>(n); ++seed) {
    const fuzz::Program p = fuzz::generate(seed);
    const int caller = static_cast<int>(seed % static_cast<std::uint64_t>(p.num_streams + 1));
    // The roots keep the tape alive: a plan's steps point into it.
    const std::vector<PlanRoot> roots = fuzz::tape_on_fake_streams(p, fuzz::fake_stream(caller));
    const BackwardPlan plan = plan_backward(roots, fuzz::fake_stream(caller), GradWrite::kOverwrite);
    SCOPED_TRACE(p.str() + plan.dump());
    const auto hb = testing::happens_before(plan, std::vector<bool>(plan.waits.size(), false));
    for (const auto& r : testing::required(plan)) {
      ASSERT_TRUE(testing::satisfied(plan, hb, r)) << "step " << r.first << " -> " << r.second;
    }
    for (std::size_t w = 0; w < plan.waits.size(); ++w) {
      std::vector<bool> skip(plan.waits.size(), false);
      skip[w] = true;
      const auto without = testing::happens_before(plan, skip);
      bool needed = false;
      for (const auto& r : testing::required(plan)) needed = needed || !testing::satisfied(plan, without, r);
      ASSERT_TRUE(needed) << "wait " << w << " is redundant";
    }
    std::vector<int> forks, joins;
    testing::expect_forks_and_joins(plan, hb, &forks, &joins);
    ASSERT_EQ(plan.forks, forks);
    ASSERT_EQ(plan.joins, joins);
    total_waits += static_cast<int>(plan.waits.size());
  }
  if (n >= 300) {
    EXPECT_GT(total_waits, 100) << "the programs should exercise cross-stream waits";
  }
}

// The two ways to make a tape signature (capture/signature.h: from the step's tape log, by a walk
// of the tape) never compare equal to each other, but they must agree on which tapes are one
// graph: for random programs — the same program again, on other leaves, with one attribute of an
// op changed (Note [Node attributes]), another program — the log's signatures are equal in
// structure (and in addresses) exactly where the walk's are, but where a step has nodes the loss
// does not reach: the log holds every node of the step, the walk only those the backward runs, so
// there the log may tell two steps apart that the walk finds equal — never the other way round.
bool change_one_attribute(fuzz::Program& p) {
  for (fuzz::Op& o : p.ops) {
    if (o.kind == fuzz::OpKind::kScale) {
      o.scalar += 0.5;
      return true;
    }
    if (o.kind == fuzz::OpKind::kNarrow) {
      if (o.start + o.length < p.shape_of(o.a)[1]) {
        ++o.start;
        return true;
      }
      if (o.start > 0) {
        --o.start;
        return true;
      }
    }
  }
  return false;
}

TEST(FuzzCpu, TheTapeLogAndTheWalkAgreeOnWhichRandomTapesAreTheSame) {
  struct Step {
    std::vector<Tensor> roots;  // kept: every step's tape alive until all are compared
    capture::TapeSignature logged, walked;
  };
  auto leaves_of = [](const fuzz::Program& p, std::uint64_t seed) {
    std::vector<Tensor> leaves;
    for (std::size_t i = 0; i < p.leaves.size(); ++i) {
      leaves.push_back(randn(p.leaves[i], seed * 131 + i).set_requires_grad(true));
    }
    return leaves;
  };
  detail::tape_log_arm();
  const int n = fuzz::programs_to_run(200);
  const std::uint64_t first = fuzz::first_seed();
  int changed = 0, walked_instead = 0, unreached_apart = 0;
  for (std::uint64_t seed = first; seed < first + static_cast<std::uint64_t>(n); ++seed) {
    const fuzz::Program p = fuzz::generate(seed), other = fuzz::generate(seed + 1000003);
    fuzz::Program altered = p;
    const bool attribute_changed = change_one_attribute(altered);
    changed += attribute_changed;
    const std::vector<Tensor> leaves = leaves_of(p, seed), more = leaves_of(p, seed + 7);
    auto step = [&](const fuzz::Program& q, const std::vector<Tensor>& l) {
      Step s;
      detail::tape_log_reset();
      s.roots = fuzz::detail::forward(q, l, nullptr, Device::cpu(), DType::kFloat32);
      Tensor loss = s.roots[0];
      for (std::size_t r = 1; r < s.roots.size(); ++r) loss = add(loss, s.roots[r]);
      s.roots.push_back(loss);
      s.logged = capture::tape_signature({loss}, {}, nullptr, GradWrite::kAccumulate);
      capture::tape_signature_walk(s.walked, {loss}, {}, nullptr, GradWrite::kAccumulate);
      walked_instead += s.logged.source != capture::TapeSignature::Source::kLog;
      return s;
    };
    const std::vector<Step> steps = {step(p, leaves), step(p, leaves), step(p, more),
                                     step(altered, leaves), step(other, leaves_of(other, seed))};
    const char* const names[] = {"the program", "the program again", "on other leaves",
                                 "with an attribute changed", "another program"};
    for (std::size_t i = 0; i < steps.size(); ++i) {
      for (std::size_t j = i + 1; j < steps.size(); ++j) {
        const Step &a = steps[i], &b = steps[j];
        const bool log_same = a.logged.same_structure(b.logged);
        const bool walk_same = a.walked.same_structure(b.walked);
        const bool all_reached = a.logged.num_nodes() == a.walked.num_nodes() &&
                                 b.logged.num_nodes() == b.walked.num_nodes();
        unreached_apart += !log_same && walk_same;
        ASSERT_TRUE(log_same == walk_same || (!log_same && !all_reached))
            << names[i] << " / " << names[j] << ": the log says " << (log_same ? "" : "not ")
            << "one structure, the walk " << (walk_same ? "" : "not ") << "one\n"
            << p.str();
        if (log_same && all_reached) {
          ASSERT_EQ(a.logged.same_addresses(b.logged), a.walked.same_addresses(b.walked))
              << names[i] << " / " << names[j] << "\n"
              << p.str();
        }
      }
    }
    // What must hold whatever the signatures agree on.
    ASSERT_TRUE(steps[0].logged.same_structure(steps[1].logged)) << p.str();
    ASSERT_TRUE(steps[0].logged.same_structure(steps[2].logged)) << p.str();
    ASSERT_FALSE(steps[0].logged.same_addresses(steps[2].logged)) << p.str();
    if (attribute_changed) {
      ASSERT_FALSE(steps[0].logged.same_structure(steps[3].logged))
          << "an op's attribute changed and the structure did not\n"
          << altered.str();
    }
  }
  detail::tape_log_disarm();
  EXPECT_EQ(walked_instead, 0) << "steps whose signature could not come from the tape log";
  EXPECT_GT(changed, n / 4) << "programs with an attribute to change";
  std::printf(
      "[          ] %d programs; %d with an attribute changed; %d pairs told apart by the "
      "log alone (nodes the loss does not reach)\n",
      n, changed, unreached_apart);
}

}  // namespace
}  // namespace graphward
