// Random programs on the CPU backend (tests/fuzz/random_program.h): every program's roots and leaf
// gradients in float32 agree with the same program in float64; the backward plan of every
// program's tape on its streams orders every gradient contribution and leaf write with no
// redundant wait; and the generator is reproducible. GW_FUZZ_PROGRAMS / GW_FUZZ_SEED choose how
// many programs and from which seed.
#include "engine/plan_checks.h"
#include "fuzz/random_program.h"
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

}  // namespace
}  // namespace graphward
