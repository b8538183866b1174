// Random programs on the CPU backend (tests/fuzz/random_program.h): every program's roots and leaf
// gradients in float32 agree with the same program in float64, and the generator is
// reproducible. GW_FUZZ_PROGRAMS / GW_FUZZ_SEED choose how many programs and from which seed.
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

}  // namespace
}  // namespace graphward
