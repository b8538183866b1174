// Hostile misuse, by class: enum values outside their names at every entry point that takes an
// enum; recurrent cells given a state of another batch; a grad_fn of another shape; every file the
// library writes, for any labels, numbers and paths; an optimizer stepped inside a backward that
// accumulates.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "json_check.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::values;

// Every entry point that takes an enum refuses a value that is none of its names, naming it (a
// dtype of 17 was printed "float32": "the tensor holds float32, not float32").
TEST(EnumsOutOfRange, EveryEntryPointRefusesAValueThatIsNoneOfItsNames) {
  const auto bad_dtype = static_cast<DType>(17);
  EXPECT_STREQ(dtype_name(bad_dtype), "DType(17)");
  GW_EXPECT_ERROR(Tensor::empty({2}, {bad_dtype}), "Tensor::empty", "DType(17)");
  GW_EXPECT_ERROR(zeros({2}, {bad_dtype}), "DType(17)");
  GW_EXPECT_ERROR(ones({2}, {bad_dtype}), "DType(17)");
  GW_EXPECT_ERROR((void)dtype_size(bad_dtype), "DType(17)");
  GW_EXPECT_ERROR(cast(ones({2}), bad_dtype), "DType(17)");
  const Tensor x = randn({3, 4}, 1), w = randn({2, 4}, 2).set_requires_grad(true);
  GW_EXPECT_ERROR(linear(x, w, Tensor(), static_cast<Activation>(9)), "linear", "Activation(9)");
  GW_EXPECT_ERROR(conv2d(randn({1, 1, 4, 4}, 3), randn({1, 1, 3, 3}, 4), Tensor(),
                         {.activation = static_cast<Activation>(9)}),
                  "conv2d", "out of range");
  const Tensor loss = sum(linear(x, w));
  GW_EXPECT_ERROR(backward(loss, {.grad_write = static_cast<GradWrite>(5)}), "GradWrite(5)");
  GW_EXPECT_ERROR(backward(loss, {.streams = static_cast<EagerStreams>(3)}), "EagerStreams(3)");
  GW_EXPECT_ERROR((void)plan_for({loss}, static_cast<GradWrite>(5)), "GradWrite(5)");
  BackwardGraph bw(Device::cpu());
  GW_EXPECT_ERROR(bw.backward(loss, static_cast<GradWrite>(5)), "GradWrite(5)");
  EXPECT_FALSE(w.grad().defined()) << "a refused backward wrote nothing";
  backward(loss);  // the tape is whole
  EXPECT_TRUE(w.grad().defined());
}

// lstm_cell and gru_cell refuse a state of another batch than x's (it was broadcast silently)
// and a cell state of another shape than h's, by name; the right state runs.
TEST(RecurrentCells, AStateOfAnotherBatchOrShapeIsRefusedNotBroadcast) {
  const std::int64_t B = 3, in = 5, H = 4;
  const Tensor x = randn({B, in}, 1);
  const Tensor w_ih4 = randn({4 * H, in}, 2), w_hh4 = randn({4 * H, H}, 3), b4 = randn({4 * H}, 4);
  const Tensor w_ih3 = randn({3 * H, in}, 5), w_hh3 = randn({3 * H, H}, 6), b3 = randn({3 * H}, 7);
  for (const Shape& bad : std::vector<Shape>{{1, H}, {B + 1, H}, {H}, {1, B, H}}) {
    GW_EXPECT_ERROR(lstm_cell(x, {zeros(bad), zeros(bad)}, w_ih4, w_hh4, b4, b4), "lstm_cell",
                    "same batch");
    GW_EXPECT_ERROR(gru_cell(x, zeros(bad), w_ih3, w_hh3, b3, b3), "gru_cell", "same batch");
  }
  GW_EXPECT_ERROR(lstm_cell(x, {zeros({B, H}), zeros({1, H})}, w_ih4, w_hh4, b4, b4), "lstm_cell");
  GW_EXPECT_ERROR(lstm_cell(x, {zeros({B, H}), Tensor()}, w_ih4, w_hh4, b4, b4), "lstm_cell",
                  "undefined");
  GW_EXPECT_ERROR(gru_cell(randn({B}, 8), zeros({B, H}), w_ih3, w_hh3, b3, b3), "gru_cell");
  const LstmState s = lstm_cell(x, {zeros({B, H}), zeros({B, H})}, w_ih4, w_hh4, b4, b4);
  EXPECT_EQ(s.h.shape(), (Shape{B, H}));
  EXPECT_EQ(gru_cell(x, zeros({B, H}), w_ih3, w_hh3, b3, b3).shape(), (Shape{B, H}));
}

// A grad_fn of another shape than its tensor's (set by hand) is refused by the backward before
// anything is written, as a root and as an input (it left a [1000] .grad on a [3] leaf).
TEST(GradFnOfAnotherShape, IsRefusedAsARootAndAsAnInputBeforeAnythingIsWritten) {
  const Tensor leaf = ones({3}).set_requires_grad(true);
  auto node_of = [&](const Shape& out) {
    return make_node(
        "by_hand", Device::cpu(), nullptr,
        {InputMeta{leaf.shape(), leaf.dtype(), leaf.device(), nullptr, {nullptr, leaf}}}, out,
        [](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> s) {
          *s[0].tensor = g;  // hands its gradient on as it is: of its own shape
        });
  };
  const Tensor root = zeros({3});
  root.set_grad_fn(node_of({1000}));
  GW_EXPECT_ERROR(backward(root, {}), "backward", "root", "[1000]");
  GW_EXPECT_ERROR(backward({root}, {ones({3})}), "backward", "[1000]", "[3]");
  const Tensor mid = zeros({3});
  mid.set_grad_fn(node_of({1000}));
  const Tensor loss = sum(mid);
  GW_EXPECT_ERROR(backward(loss), "backward", "sum", "[1000]", "set_grad_fn");
  EXPECT_FALSE(leaf.grad().defined());
  // Of its own shape, it runs.
  const Tensor fine = zeros({3});
  fine.set_grad_fn(node_of({3}));
  backward(sum(fine));
  EXPECT_EQ(values(leaf.grad()), std::vector<double>(3, 1.0));
}

// Whether `s` is well-formed UTF-8 (RFC 3629), as JSON text must be (RFC 8259, section 8.1).
bool utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3F);
    }
    const std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<std::size_t>(n);
  }
  return true;
}

// The timeline's JSON is valid for any label and any number: NaN and infinities become null
// (they were written as nan/inf), numbers of any size are whole (cut at 32 bytes), labels with
// bytes that are not UTF-8 get U+FFFD (copied raw) — and every path the library writes a file at
// is checked (an embedded NUL wrote the prefix's file).
TEST(FilesTheLibraryWrites, TheTimelineIsValidJsonForAnyInputAndPathsAreChecked) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  const std::vector<std::string> labels = {"plain",
                                           "quote \" and \\ and \n\t",
                                           std::string("nul \0 inside", 13),
                                           "\xff\xfe bad",
                                           "\xc3\x28 bad 2-byte",
                                           "\xe0\x80\x80 overlong",
                                           "\xed\xa0\x80 surrogate",
                                           "\xf4\x90\x80\x80 past U+10FFFF",
                                           "\xf0\x9f\x98\x80 fine 4-byte",
                                           "cut \xe2\x82"};
  std::vector<StepTiming> steps;
  const float times[] = {0.f, nan, inf, -inf, 3.4e38f, -3.4e38f, 1e-30f, 123456.789f};
  for (std::size_t i = 0; i < labels.size(); ++i) {
    StepTiming t{static_cast<int>(i),         0, labels[i], times[i % 8], times[(i + 3) % 8],
                 i % 2 ? 1e300 : std::nan("")};
    t.side_stream = i % 3 == 0 ? 1 : -1;
    t.side_start_ms = times[(i + 5) % 8];
    t.side_end_ms = times[(i + 1) % 8];
    steps.push_back(t);
  }
  const std::string json = chrome_trace(steps, {"a \xff", "b"}, "title \xc0\xaf");
  EXPECT_TRUE(testing::JsonCheck(json).valid()) << json;
  EXPECT_TRUE(utf8(json)) << "the JSON text is not UTF-8";
  EXPECT_EQ(json.find("nan"), std::string::npos);
  EXPECT_EQ(json.find("inf"), std::string::npos);
  EXPECT_NE(json.find("null"), std::string::npos);
  EXPECT_NE(json.find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_NE(json.find("\xf0\x9f\x98\x80"), std::string::npos) << "a good sequence is kept";
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "timeline_misuse.json";
  write_chrome_trace(path, steps, {"a", "b"}, "t");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(testing::JsonCheck(text.str()).valid());
  const std::string with_nul = dir + std::string("prefix\0.json", 12);
  std::filesystem::remove(dir + "prefix");  // left by an earlier run
  GW_EXPECT_ERROR(write_chrome_trace(with_nul, steps, {"a", "b"}, "t"), "write_chrome_trace",
                  "NUL");
  EXPECT_FALSE(std::ifstream(dir + "prefix").good()) << "the prefix's file was written";
  GW_EXPECT_ERROR(write_chrome_trace("", steps, {"a", "b"}, "t"), "write_chrome_trace", "empty");
  GW_EXPECT_ERROR(write_chrome_trace(dir, steps, {"a", "b"}, "t"), "write_chrome_trace");
}

// StepInBackward steps each bucket's parameters with that backward's gradients: a backward that
// accumulates into earlier ones is refused before anything is written (its Note excludes it; it
// was accepted and stepped with the sums).
TEST(StepInBackwardMisuse, ABackwardThatAccumulatesIsRefusedAndWritesNothing) {
  const Tensor w = randn({4, 4}, 1).set_requires_grad(true);
  Sgd opt({w}, {.lr = 0.1});
  StepInBackward in_backward(opt);
  const Tensor x = randn({2, 4}, 2);
  backward(sum(linear(x, w)),
           {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &in_backward});
  const std::vector<double> w_before = values(w), g_before = values(w.grad());
  GW_EXPECT_ERROR(backward(sum(linear(x, w)), {.reduce_gradients = &in_backward}), "StepInBackward",
                  "kAccumulate", "kOverwrite");
  EXPECT_EQ(values(w), w_before);
  EXPECT_EQ(values(w.grad()), g_before);
  EXPECT_EQ(opt.steps(), 1);
}

}  // namespace
}  // namespace graphward
