// llm.c's token shards (examples/token_shards.h): written and read back, windows for one rank and
// for several, the move to the next shard, a position restored; and every way a shard can be bad
// refused by name, the reader left usable.
#include "examples/token_shards.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace graphward::examples {
namespace {

namespace fs = std::filesystem;

class TokenShardsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }
  // A shard of tokens 0, 1, 2, ... (mod vocab) from `first`.
  std::string counting(const std::string& name, std::int64_t n, std::int64_t first = 0,
                       std::int64_t vocab = 50257) {
    std::vector<std::uint16_t> t(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] =
        static_cast<std::uint16_t>((first + i) % vocab);
    write_token_shard(path(name), t);
    return path(name);
  }
  // Raw bytes: a header of these ints, then these tokens, then `extra` bytes.
  std::string raw(const std::string& name, std::vector<std::int32_t> header,
                  const std::vector<std::uint16_t>& tokens, std::size_t extra = 0) {
    header.resize(256, 0);
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 2));
    for (std::size_t i = 0; i < extra; ++i) out.put('\0');
    return path(name);
  }
  testing::ScratchDir scratch_{"graphward_shards_"};
};

TEST_F(TokenShardsTest, AWrittenShardReadsBackAndItsWindowsAreInputsAndTargetsShiftedByOne) {
  const std::vector<std::uint16_t> t = synthetic_tokens(5000, 50257, 3);
  for (std::uint16_t x : t) ASSERT_LT(x, 50257);
  write_token_shard(path("a.bin"), t);
  EXPECT_EQ(TokenShards::read(path("a.bin"), 50257), t);
  EXPECT_EQ(fs::file_size(path("a.bin")), 1024u + 2 * t.size());
  EXPECT_FALSE(fs::exists(path("a.bin.partial")));

  TokenShards r({path("a.bin")}, 4, 16, 50257);
  std::vector<std::int32_t> x, y;
  for (int step = 0; step < 3; ++step) {
    r.next(x, y);
    ASSERT_EQ(x.size(), 64u);
    for (std::size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(x[i], t[static_cast<std::size_t>(step) * 64 + i]);
      EXPECT_EQ(y[i], t[static_cast<std::size_t>(step) * 64 + i + 1]);
    }
  }
  // The synthetic tokens carry structure: most follow their predecessor by one.
  int successors = 0;
  for (std::size_t i = 1; i < t.size(); ++i) successors += t[i] == (t[i - 1] + 1) % 50257;
  EXPECT_GT(successors, 3000);
  EXPECT_LT(successors, 4500);
  // Runs start below kSyntheticJumpIds, whatever the vocabulary: few enough ids for a model of
  // GPT-2's vocabulary to see each of them early (runs are a few tokens long).
  int past = 0;
  for (std::uint16_t x : t) past += x >= 2 * kSyntheticJumpIds;
  EXPECT_EQ(past, 0);
  EXPECT_LT(static_cast<std::size_t>(std::count_if(t.begin(), t.end(),
                                                   [](std::uint16_t x) { return x >= kSyntheticJumpIds; })),
            t.size() / 20);
}

TEST_F(TokenShardsTest, RanksTakeConsecutiveWindowsOfEachStepAndTogetherReadWhatOneRankReads) {
  const std::string a = counting("a.bin", 1000);
  TokenShards one({a}, 2, 8, 50257, 0, 1);
  TokenShards r0({a}, 1, 8, 50257, 0, 2), r1({a}, 1, 8, 50257, 1, 2);
  std::vector<std::int32_t> x, y, x0, y0, x1, y1;
  for (int step = 0; step < 5; ++step) {
    one.next(x, y);
    r0.next(x0, y0);
    r1.next(x1, y1);
    x0.insert(x0.end(), x1.begin(), x1.end());
    y0.insert(y0.end(), y1.begin(), y1.end());
    EXPECT_EQ(x0, x) << "step " << step;
    EXPECT_EQ(y0, y) << "step " << step;
  }
}

TEST_F(TokenShardsTest, AShardWithNoRoomForTheNextWindowGivesWayToTheNextAndTheLastToTheFirst) {
  // 40 tokens: windows of 16 (+1) fit twice (offsets 0 and 16; 32 + 17 > 40).
  const std::string a = counting("a.bin", 40, 0), b = counting("b.bin", 40, 1000);
  TokenShards r({a, b}, 1, 16, 50257);
  std::vector<std::int32_t> x, y;
  std::vector<std::int32_t> firsts;
  for (int step = 0; step < 6; ++step) {
    r.next(x, y);
    firsts.push_back(x[0]);
  }
  EXPECT_EQ(firsts, (std::vector<std::int32_t>{0, 16, 1000, 1016, 0, 16}));
  // One shard: back to its own start.
  TokenShards s({a}, 1, 16, 50257);
  firsts.clear();
  for (int step = 0; step < 4; ++step) {
    s.next(x, y);
    firsts.push_back(x[0]);
  }
  EXPECT_EQ(firsts, (std::vector<std::int32_t>{0, 16, 0, 16}));
}

TEST_F(TokenShardsTest, ARestoredPositionGivesTheSameBatchesAsTheReaderItWasReadFrom) {
  const std::string a = counting("a.bin", 100, 0), b = counting("b.bin", 100, 500);
  TokenShards r({a, b}, 2, 10, 50257);
  std::vector<std::int32_t> x, y, x2, y2;
  for (int step = 0; step < 7; ++step) r.next(x, y);
  const ShardPosition p = r.position();
  EXPECT_EQ(p.shard, 1);
  TokenShards again({a, b}, 2, 10, 50257);
  again.seek(p);
  EXPECT_EQ(again.position(), p);
  for (int step = 0; step < 9; ++step) {
    r.next(x, y);
    again.next(x2, y2);
    EXPECT_EQ(x2, x) << "step " << step;
    EXPECT_EQ(y2, y) << "step " << step;
  }
  GW_EXPECT_ERROR(again.seek({2, 0}), "TokenShards::seek", "shard 2 of 2");
  GW_EXPECT_ERROR(again.seek({-1, 0}), "TokenShards::seek", "shard -1");
  GW_EXPECT_ERROR(again.seek({0, 101}), "TokenShards::seek", "offset 101", "100 tokens");
  GW_EXPECT_ERROR(again.seek({0, -1}), "TokenShards::seek", "offset -1");
}

// Every way a shard's file can be wrong, each refused with the file's name and what was wrong.
TEST_F(TokenShardsTest, EveryBadShardIsRefusedByNameWithWhatWasWrong) {
  const std::vector<std::uint16_t> ok(100, 7);
  struct Case {
    std::string file;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases{
      {path("missing.bin"), {"cannot open"}},
      {path("empty.bin"), {"0 bytes, shorter than the header's 1024"}},
      {raw("zeros.bin", {}, {}, 0), {"magic number 0"}},
      {path("short_header.bin"), {"bytes, shorter than the header's 1024"}},
      {raw("magic.bin", {20240521, 1, 100}, ok), {"magic number 20240521", "expected 20240520"}},
      {raw("version.bin", {20240520, 2, 100}, ok), {"version 2", "expected 1"}},
      {raw("negative.bin", {20240520, 1, -5}, ok), {"token count of -5"}},
      {raw("cut.bin", {20240520, 1, 101}, ok), {"header says 101 tokens", "cut short"}},
      {raw("extra.bin", {20240520, 1, 100}, ok, 1), {"bytes after the last token"}},
      {raw("odd.bin", {20240520, 1, 99}, ok), {"header says 99 tokens", "bytes after"}},
  };
  {  // 100 bytes: not even a header; and an empty file
    std::ofstream out(path("short_header.bin"), std::ios::binary);
    for (int i = 0; i < 100; ++i) out.put('\1');
    std::ofstream empty(path("empty.bin"), std::ios::binary);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string name = fs::path(c.file).filename().string();
    try {
      TokenShards r({c.file}, 1, 8, 50257);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(name), std::string::npos) << m;
      for (const std::string& w : c.words) EXPECT_NE(m.find(w), std::string::npos) << m;
    }
    EXPECT_THROW((void)TokenShards::read(c.file, 50257), Error);
  }
}

TEST_F(TokenShardsTest, ATokenPastTheVocabularyIsRefusedWithItsIndexAndTheReaderStaysWhereItWas) {
  for (std::uint16_t bad : {std::uint16_t{50257}, std::uint16_t{65535}}) {
    std::vector<std::uint16_t> t(100, 3);
    t[57] = bad;
    const std::string b = raw("bad.bin", {20240520, 1, 100}, t);
    GW_EXPECT_ERROR(TokenShards({b}, 1, 8, 50257), "bad.bin", "token 57 is " + std::to_string(bad),
                    "below the vocabulary's 50257");
    // Second in the list: its header passes; its tokens are refused when it is opened, and the
    // reader stays on the good shard.
    const std::string a = counting("a.bin", 20, 0);
    TokenShards r({a, b}, 1, 8, 50257);
    std::vector<std::int32_t> x, y;
    r.next(x, y);
    r.next(x, y);  // offsets 0 and 8; 16 + 9 > 20: the next step opens bad.bin
    const std::vector<std::int32_t> kept = x;
    GW_EXPECT_ERROR(r.next(x, y), "bad.bin", "token 57");
    EXPECT_EQ(x, kept) << "nothing written on a refused step";
    EXPECT_EQ(r.position(), (ShardPosition{0, 16}));
    r.seek({0, 0});
    r.next(x, y);
    EXPECT_EQ(x[0], 0) << "the reader is still usable";
  }
}

TEST_F(TokenShardsTest, AShardTooSmallForOneStepAndBadShapesAreRefusedByName) {
  const std::string a = counting("a.bin", 64);
  GW_EXPECT_ERROR(TokenShards({a}, 4, 16, 50257), "a.bin", "64 tokens, fewer than one step's 65",
                  "batch 4 x seq 16");
  GW_EXPECT_ERROR(TokenShards({a}, 2, 16, 50257, 1, 2), "a.bin", "fewer than one step's 65",
                  "2 ranks");
  EXPECT_NO_THROW(TokenShards({a}, 3, 21, 50257));  // 63 + 1 tokens: just fits
  GW_EXPECT_ERROR(TokenShards({}, 1, 8, 50257), "no shard given");
  GW_EXPECT_ERROR(TokenShards({a}, 0, 8, 50257), "batch 0");
  GW_EXPECT_ERROR(TokenShards({a}, 1, -1, 50257), "seq -1");
  GW_EXPECT_ERROR(TokenShards({a}, 1, 8, 0), "vocab is 0");
  GW_EXPECT_ERROR(TokenShards({a}, 1, 8, 65537), "vocab is 65537");
  GW_EXPECT_ERROR(TokenShards({a}, 1, 8, 50257, 2, 2), "rank 2 of 2");
  GW_EXPECT_ERROR(TokenShards({a}, 1, 8, 50257, -1, 2), "rank -1 of 2");
  GW_EXPECT_ERROR(TokenShards({a}, 1, 8, 50257, 0, 0), "rank 0 of 0");
  GW_EXPECT_ERROR(TokenShards({a}, std::int64_t{1} << 40, 1 << 20, 50257), "expected at most 2^40");
  GW_EXPECT_ERROR((void)synthetic_tokens(0, 100, 1), "count is 0");
  GW_EXPECT_ERROR((void)synthetic_tokens(10, 1, 1), "vocab is 1");
  GW_EXPECT_ERROR((void)synthetic_tokens(10, 65537, 1), "vocab is 65537");
}

TEST_F(TokenShardsTest, AWriteThatCannotCompleteLeavesTheEarlierFileAsItWas) {
  const std::string a = counting("a.bin", 50);
  const std::vector<std::uint16_t> before = TokenShards::read(a, 50257);
  // The temporary file's place is a directory: the write cannot open it.
  fs::create_directories(a + ".partial");
  GW_EXPECT_ERROR(write_token_shard(a, std::vector<std::uint16_t>(10, 1)), "write_token_shard",
                  "a.bin.partial");
  EXPECT_EQ(TokenShards::read(a, 50257), before);
  GW_EXPECT_ERROR(write_token_shard(path("no_such_dir/x.bin"), {1, 2}), "write_token_shard",
                  "cannot open");
}

}  // namespace
}  // namespace graphward::examples
