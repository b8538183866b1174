// The built-in timeline (Note [Timeline]) on the CPU: Chrome-trace JSON from step timings — valid
// JSON, one named track per stream, one event per step and per side part; bad input refused; the
// JSON checker itself refuses broken JSON; NVTX built in wherever the CUDA backend is.
#include <fstream>
#include <sstream>

#include "graphward/graphward.h"
#include "json_check.h"
#include "graphward/engine/runtime/nvtx.h"
#include "test_util.h"

namespace graphward {
namespace {

std::vector<StepTiming> three_streams() {
  // step 0 on the caller's stream; steps 1, 2 on forward streams 1 and 2, step 2 with a side part
  // on stream 3 (the side stream of stream 2).
  std::vector<StepTiming> t = {{0, 0, "mse_loss#9", 0.0f, 0.01f},
                               {1, 1, "linear#4", 0.01f, 0.05f, 3.5},
                               {2, 2, "linear \"quoted\"\n#5", 0.012f, 0.04f}};
  t[2].side_stream = 3;
  t[2].side_start_ms = 0.02f;
  t[2].side_end_ms = 0.06f;
  return t;
}

TEST(Timeline, AChromeTraceIsValidJsonWithATrackPerStreamAndAnEventPerPart) {
  const std::vector<std::string> names = {"stream 0 (caller)", "stream 1 (forward)",
                                          "stream 2 (forward)", "stream 3 (side of stream 2)"};
  const std::string json = chrome_trace(three_streams(), names, "backward");
  EXPECT_TRUE(testing::json_valid(json)) << json;
  EXPECT_EQ(testing::trace_track_names(json), names);
  EXPECT_EQ(testing::trace_events_on(json, 0), 1u);
  EXPECT_EQ(testing::trace_events_on(json, 1), 1u);
  EXPECT_EQ(testing::trace_events_on(json, 2), 1u);
  EXPECT_EQ(testing::trace_events_on(json, 3), 1u);  // the side part
  EXPECT_NE(json.find("\"ts\": 10.000, \"dur\": 40.000"), std::string::npos) << json;  // µs
  EXPECT_NE(json.find("linear \\\"quoted\\\"\\n#5 (weight grads)"), std::string::npos) << json;
}

TEST(Timeline, WritesTheFileAndRefusesAStepOnAnUnnamedStream) {
  const std::string path = ::testing::TempDir() + "timeline_test.json";
  write_chrome_trace(path, three_streams(), {"a", "b", "c", "d"}, "t");
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_TRUE(testing::json_valid(text.str()));
  GW_EXPECT_ERROR((void)chrome_trace(three_streams(), {"a", "b", "c"}, "t"),
                  "side part is on stream 3; expected one of the 3 named streams");
  GW_EXPECT_ERROR((void)chrome_trace(three_streams(), {"a"}, "t"),
                  "step 1 is on stream 1; expected one of the 1 named streams");
  GW_EXPECT_ERROR(write_chrome_trace("/nonexistent-dir/x.json", {}, {}, "t"),
                  "cannot open /nonexistent-dir/x.json");
}

TEST(Timeline, StreamsAreNamedByRole) {
  BackwardPlan plan;
  plan.streams = {nullptr, nullptr, nullptr};
  plan.side_of = {-1, -1, 1};
  EXPECT_EQ(stream_names(plan), (std::vector<std::string>{"stream 0 (caller)", "stream 1 (forward)",
                                                          "stream 2 (side of stream 1)"}));
  // A data-parallel backward's reductions get a track past the plan's streams.
  const std::vector<std::string> with = stream_names(plan, true);
  ASSERT_EQ(with.size(), 4u);
  EXPECT_EQ(with[3], "reductions (all-reduce of gradient buckets)");
}

TEST(Timeline, TheJsonCheckRefusesBrokenJson) {
  EXPECT_TRUE(testing::json_valid(R"({"a": [1, -2.5e3, "x\u00e9", true, null, {}]})"));
  for (const char* bad : {"", "{", R"({"a": 1,})", R"({"a" 1})", "[1 2]", R"(["\x"])", "01",
                          R"({"a": 1} x)", "[tru]", "\"a\nb\""}) {
    EXPECT_FALSE(testing::json_valid(bad)) << bad;
  }
}

TEST(Timeline, NvtxRangesAreBuiltInWithTheCudaBackend) {
  EXPECT_EQ(detail::nvtx_enabled(), GRAPHWARD_HAS_CUDA == 1);
  detail::NvtxRange range("a range with no profiler attached");  // a no-op, must not throw
}

}  // namespace
}  // namespace graphward
