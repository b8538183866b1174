// Random programs on the GPU (tests/fuzz/random_program.h): for every program, the float32
// gradients on one stream agree with the float64 CPU program; run with each op on its own stream
// (streams reused across branches) they agree with the one-stream run, and the backward as shipped
// (moved onto the caller's stream where it is short) equals the one on the streams bitwise; and
// the backward replayed
// from a BackwardGraph (captured once, then replayed) agrees with the eager one. GW_FUZZ_PROGRAMS
// (default 25 here: the suite also runs under compute-sanitizer) and GW_FUZZ_SEED choose the
// programs; scripts/gpu_check.sh runs 1000.
#include "fuzz/random_program.h"
#include "test_util.h"

namespace graphward {
namespace {

constexpr double kVsFloat64 = 5e-3;  // as the CPU fuzz test (fuzz_test.cpp)
// The same float32 arithmetic: only the order in which contributions from several streams are
// added differs.
constexpr double kSameArithmetic = 1e-5;

TEST(FuzzCuda, RandomProgramsAgreeOnOneStreamOnTheirStreamsAndReplayed) {
  GW_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const int n = fuzz::programs_to_run(25);
  const std::uint64_t first = fuzz::first_seed();
  for (std::uint64_t seed = first; seed < first + static_cast<std::uint64_t>(n); ++seed) {
    const fuzz::Program p = fuzz::generate(seed);
    fuzz::Outcome ref, one, streams, as_shipped, replayed;
    try {
      ref = fuzz::run(p, Device::cpu(), DType::kFloat64, fuzz::RunMode::kEagerOneStream);
      one = fuzz::run(p, gpu, DType::kFloat32, fuzz::RunMode::kEagerOneStream);
      streams = fuzz::run(p, gpu, DType::kFloat32, fuzz::RunMode::kEagerStreams);
      as_shipped = fuzz::run(p, gpu, DType::kFloat32, fuzz::RunMode::kEagerAuto);
      replayed = fuzz::run(p, gpu, DType::kFloat32, fuzz::RunMode::kReplayed);
    } catch (const std::exception& e) {
      FAIL() << e.what() << "\n" << p.str();
    }
    std::string what;
    ASSERT_LT(fuzz::max_difference(one, ref, &what), kVsFloat64)
        << "one stream against float64: " << what << "\n" << p.str();
    ASSERT_LT(fuzz::max_difference(streams, one, &what), kSameArithmetic)
        << "streams against one stream: " << what << "\n" << p.str();
    ASSERT_EQ(fuzz::max_difference(as_shipped, streams, &what), 0.0)
        << "as shipped against the streams: " << what << "\n"
        << p.str();
    ASSERT_LT(fuzz::max_difference(replayed, streams, &what), kSameArithmetic)
        << "replayed against eager: " << what << "\n" << p.str();
    ASSERT_EQ(replayed.captures, 1u) << p.str();
    ASSERT_EQ(replayed.replays, 2u) << "expected the capture's launch and one replay\n" << p.str();
  }
}

}  // namespace
}  // namespace graphward
