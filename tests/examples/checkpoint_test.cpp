// Checkpoints (examples/checkpoint.h): tensors of every dtype and integers round-trip bitwise and
// in place; every way a file can be damaged or foreign is refused by name before anything is
// written; a save that cannot complete leaves the earlier checkpoint as it was.
#include "examples/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace graphward::examples {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }
  static std::vector<std::pair<std::string, Tensor>> tensors() {
    return {{"w", randn({3, 4}, 1)},
            {"d", randn({5}, 2, {DType::kFloat64, Device::cpu()})},
            {"i", from_vector(std::vector<std::int32_t>{7, -8, 9}, {3})},
            {"h", cast(randn({2, 2}, 3), DType::kBFloat16)},
            {"s", full({}, 2.5)}};
  }
  static std::string read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  static void write(const std::string& p, const std::string& bytes) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // Fresh destinations of the same names, dtypes and shapes, filled with a marker.
  static std::vector<std::pair<std::string, Tensor>> blanks() {
    std::vector<std::pair<std::string, Tensor>> b;
    for (const auto& [name, t] : tensors()) {
      Tensor z = Tensor::empty(t.shape(), {t.dtype(), Device::cpu()});
      std::memset(z.raw_data(), 0x5a, z.nbytes());
      b.emplace_back(name, z);
    }
    return b;
  }
  static std::vector<std::string> bytes_of(const std::vector<std::pair<std::string, Tensor>>& ts) {
    std::vector<std::string> out;
    for (const auto& [_, t] : ts) {
      out.emplace_back(static_cast<const char*>(t.raw_data()), t.nbytes());
    }
    return out;
  }
  testing::ScratchDir scratch_{"graphward_ckpt_"};
};

TEST_F(CheckpointTest, TensorsOfEveryDtypeAndIntegersComeBackBitwiseAndInPlace) {
  const auto src = tensors();
  save_checkpoint(path("a.ckpt"), src, {{"step", 41}, {"neg", -5}});
  EXPECT_FALSE(fs::exists(path("a.ckpt.partial")));
  const auto dst = blanks();
  std::vector<const void*> addresses;
  for (const auto& [_, t] : dst) addresses.push_back(t.raw_data());
  const auto v = load_checkpoint(path("a.ckpt"), dst, {"step", "neg"});
  EXPECT_EQ(v.at("step"), 41);
  EXPECT_EQ(v.at("neg"), -5);
  EXPECT_EQ(bytes_of(dst), bytes_of(src));
  for (std::size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(dst[i].second.raw_data(), addresses[i]);
  // Asked in another order: by name.
  auto reversed = blanks();
  std::reverse(reversed.begin(), reversed.end());
  (void)load_checkpoint(path("a.ckpt"), reversed, {"neg", "step"});
  auto expected = src;
  std::reverse(expected.begin(), expected.end());
  EXPECT_EQ(bytes_of(reversed), bytes_of(expected));
}

// Every cut of the file, and a flipped bit anywhere in it: refused, nothing written.
TEST_F(CheckpointTest, EveryTruncationAndEveryAlteredByteIsRefusedAndNothingIsWritten) {
  save_checkpoint(path("a.ckpt"), tensors(), {{"step", 3}});
  const std::string good = read(path("a.ckpt"));
  const auto before = blanks();
  const std::vector<std::string> marker = bytes_of(before);
  for (std::size_t n = 0; n < good.size(); ++n) {
    write(path("cut.ckpt"), good.substr(0, n));
    const auto dst = blanks();
    EXPECT_THROW((void)load_checkpoint(path("cut.ckpt"), dst, {"step"}), Error) << n << " bytes";
    EXPECT_EQ(bytes_of(dst), marker) << n << " bytes";
  }
  for (std::size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    write(path("bad.ckpt"), bad);
    const auto dst = blanks();
    EXPECT_THROW((void)load_checkpoint(path("bad.ckpt"), dst, {"step"}), Error) << "byte " << at;
    EXPECT_EQ(bytes_of(dst), marker) << "byte " << at;
  }
  write(path("cut.ckpt"), good.substr(0, good.size() - 1));
  GW_EXPECT_ERROR((void)load_checkpoint(path("cut.ckpt"), blanks(), {"step"}), "cut.ckpt",
                  "checksum does not match", "cut short or altered");
}

TEST_F(CheckpointTest, AForeignFileOrAnotherModelsCheckpointIsRefusedByName) {
  GW_EXPECT_ERROR((void)load_checkpoint(path("none.ckpt"), blanks(), {}), "none.ckpt",
                  "cannot open");
  write(path("text.ckpt"), "hello, I am not a checkpoint at all, but long enough to be read");
  GW_EXPECT_ERROR((void)load_checkpoint(path("text.ckpt"), blanks(), {}), "text.ckpt",
                  "no checkpoint's magic");
  write(path("empty.ckpt"), "");
  GW_EXPECT_ERROR((void)load_checkpoint(path("empty.ckpt"), blanks(), {}), "empty.ckpt",
                  "no checkpoint's magic");
  save_checkpoint(path("a.ckpt"), tensors(), {{"step", 3}});
  // A tensor of another shape, another dtype, a name missing, a name not asked for, an integer
  // missing or extra.
  auto other = blanks();
  other[0].second = Tensor::empty({4, 3});
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), other, {"step"}), "a.ckpt", "tensor 'w'",
                  "float32 [3, 4]", "expected float32 [4, 3]");
  other = blanks();
  other[1].second = Tensor::empty({5});
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), other, {"step"}), "tensor 'd'",
                  "float64 [5]", "expected float32 [5]");
  other = blanks();
  other.pop_back();
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), other, {"step"}), "holds tensor 's'",
                  "not asked for");
  other = blanks();
  other.emplace_back("extra", Tensor::empty({1}));
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), other, {"step"}), "no tensor 'extra'");
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), blanks(), {"step", "epoch"}),
                  "no integer 'epoch'");
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), blanks(), {}), "1 integers",
                  "expected 0");
  other = blanks();
  other.push_back(other.front());
  GW_EXPECT_ERROR((void)load_checkpoint(path("a.ckpt"), other, {"step"}), "'w' asked for twice");
}

TEST_F(CheckpointTest, ASaveThatCannotCompleteLeavesTheEarlierCheckpointAsItWas) {
  save_checkpoint(path("a.ckpt"), tensors(), {{"step", 1}});
  const std::string before = read(path("a.ckpt"));
  fs::create_directories(path("a.ckpt.partial"));  // the temporary file's place is taken
  GW_EXPECT_ERROR(save_checkpoint(path("a.ckpt"), tensors(), {{"step", 2}}), "save_checkpoint",
                  "a.ckpt.partial", "left as it was");
  EXPECT_EQ(read(path("a.ckpt")), before);
  GW_EXPECT_ERROR(save_checkpoint(path("a.ckpt"), {{"u", Tensor()}}, {}), "tensor 'u'",
                  "undefined");
  EXPECT_EQ(read(path("a.ckpt")), before);
}

}  // namespace
}  // namespace graphward::examples
