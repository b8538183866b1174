// reshape, transpose, concat, split_heads and bmm on the CPU backend: values against hand-written
// results, gradients against finite differences, slot semantics (share, accumulate) and the errors.
#include <limits>

#include "graphward/engine/tape/autograd.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::gradcheck_error;
using testing::Inputs;
using testing::values;

Tensor iota(const Shape& shape) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return from_vector(v, shape);
}

TEST(ShapesCpu, ReshapeIsAViewThatInfersOneDimension) {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = reshape(x, {-1, 4});
  EXPECT_EQ(y.shape(), Shape({6, 4}));
  EXPECT_EQ(y.raw_data(), x.raw_data());  // no copy
  EXPECT_EQ(values(y), values(x));
  EXPECT_EQ(reshape(x, {24}).shape(), Shape({24}));
  GW_EXPECT_ERROR(reshape(x, {5, -1}), "reshape", "cannot infer", "[5, -1]");
  GW_EXPECT_ERROR(reshape(x, {-1, -1}), "reshape", "at most one -1");
  GW_EXPECT_ERROR(reshape(x, {4, 4}), "reshape", "24", "16", "same number of elements");
  GW_EXPECT_ERROR(x.view({-2, -12}), "Tensor::view", "negative");
}

TEST(ShapesCpu, ReshapesGradientIsGradOutInTheInputsShapeSharedOnlyWhereAllowed) {
  const Tensor g = iota({6, 4});
  Tensor shared;
  reshape_backward(g, {2, 3, 4}, {&shared, false, true});
  EXPECT_EQ(shared.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(shared.raw_data(), g.raw_data());
  Tensor copied;
  reshape_backward(g, {2, 3, 4}, {&copied});
  EXPECT_NE(copied.raw_data(), g.raw_data());
  EXPECT_EQ(values(copied), values(g));
  reshape_backward(g, {2, 3, 4}, {&copied, true});
  EXPECT_EQ(values(copied), values(mul(g, 2.0)));
  // Through the tape: x -> reshape -> sum(y * w).
  const Tensor x = randn({2, 6}, 7, f64()).set_requires_grad(true);
  const Tensor w = randn({3, 4}, 8, f64());
  backward(sum(mul(reshape(x, {3, 4}), w)));
  EXPECT_EQ(x.grad().shape(), Shape({2, 6}));
  EXPECT_EQ(values(x.grad()), values(w));
}

TEST(ShapesCpu, TransposeSwapsTwoDimensions) {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = transpose(x, 1, 2);
  ASSERT_EQ(y.shape(), Shape({2, 4, 3}));
  const std::vector<double> xv = values(x), yv = values(y);
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 4; ++j) EXPECT_EQ(yv[b * 12 + j * 3 + i], xv[b * 12 + i * 4 + j]);
    }
  }
  EXPECT_EQ(transpose(x, 0, -1).shape(), Shape({4, 3, 2}));
  EXPECT_EQ(values(transpose(transpose(x, 0, 2), 0, 2)), xv);
  GW_EXPECT_ERROR(transpose(x, 0, 3), "transpose", "dimension 3", "[-3, 2]");
  EXPECT_EQ(values(transpose(x, 1, 1)), xv);  // the same dimension twice: a copy
  // Non-adjacent dimensions of a 4-d tensor, against the definition.
  const Tensor z = iota({2, 3, 4, 5});
  const std::vector<double> zv = values(z), tv = values(transpose(z, 3, 1));
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 5; ++d) {
          EXPECT_EQ(tv[((a * 5 + d) * 4 + c) * 3 + b], zv[((a * 3 + b) * 4 + c) * 5 + d]);
        }
}

TEST(ShapesCpu, ConcatJoinsAlongAnyDimension) {
  const Tensor a = iota({2, 2}), b = add(iota({2, 3}), 10.0);
  EXPECT_EQ(values(concat({a, b}, 1)), (std::vector<double>{0, 1, 10, 11, 12, 2, 3, 13, 14, 15}));
  const Tensor c = add(iota({1, 2}), 20.0);
  EXPECT_EQ(values(concat({a, c}, 0)), (std::vector<double>{0, 1, 2, 3, 20, 21}));
  EXPECT_EQ(concat({iota({2, 3, 4}), iota({2, 1, 4})}, -2).shape(), Shape({2, 4, 4}));
  GW_EXPECT_ERROR(concat({a, b}, 0), "concat", "tensor 1", "[2, 3]", "[2, 2]");
  GW_EXPECT_ERROR(concat({}, 0), "concat", "at least one");
  GW_EXPECT_ERROR(concat({a, iota({2, 2}).to(Device::cpu())}, 2), "concat", "dimension 2");
}

TEST(ShapesCpu, BmmIsAProductPerMatrixWithOptionalTransposes) {
  const Tensor a = randn({3, 4, 5}, 1, f64()), b = randn({3, 5, 2}, 2, f64());
  const Tensor c = bmm(a, b);
  ASSERT_EQ(c.shape(), Shape({3, 4, 2}));
  const std::vector<double> av = values(a), bv = values(b), cv = values(c);
  for (int i = 0; i < 3; ++i) {
    for (int r = 0; r < 4; ++r) {
      for (int col = 0; col < 2; ++col) {
        double s = 0;
        for (int p = 0; p < 5; ++p) s += av[i * 20 + r * 5 + p] * bv[i * 10 + p * 2 + col];
        EXPECT_NEAR(cv[i * 8 + r * 2 + col], s, 1e-12);
      }
    }
  }
  const Tensor at = transpose(a, 1, 2), bt = transpose(b, 1, 2);
  for (auto [ta, tb] : {std::pair{true, false}, {false, true}, {true, true}}) {
    EXPECT_LT(testing::rel_error(values(bmm(ta ? at : a, tb ? bt : b, ta, tb)), cv), 1e-12)
        << ta << tb;
  }
  // The scale, in the product: alpha · op(a) · op(b) for every transpose.
  for (auto [ta, tb] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    const std::vector<double> scaled = values(bmm(ta ? at : a, tb ? bt : b, ta, tb, -0.375));
    ASSERT_EQ(scaled.size(), cv.size());
    for (std::size_t i = 0; i < cv.size(); ++i) EXPECT_NEAR(scaled[i], -0.375 * cv[i], 1e-12);
  }
  GW_EXPECT_ERROR(bmm(a, a), "bmm", "inner dimensions differ", "op(b) is [4, 5]");
  GW_EXPECT_ERROR(bmm(a, randn({2, 5, 2}, 3, f64())), "bmm", "one batch size");
  GW_EXPECT_ERROR(bmm(a, randn({5, 2}, 3, f64())), "bmm", "3-d");
  // A scale that is not a finite number in the op's type: refused, nothing recorded.
  const Tensor af = randn({3, 4, 5}, 4).set_requires_grad(true), bf = randn({3, 5, 2}, 5);
  for (const double bad :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN(), 1e39}) {
    GW_EXPECT_ERROR(bmm(af, bf, false, false, bad), "bmm", "the scalar is");
    Tensor ga, gb;
    GW_EXPECT_ERROR(bmm_backward(randn({3, 4, 2}, 6), af, bf, false, false, {&ga}, {&gb}, bad),
                    "bmm_backward", "the scalar is");
    EXPECT_FALSE(ga.defined());
    EXPECT_FALSE(gb.defined());
  }
}

TEST(ShapesGradcheckCpu, TransposeConcatSplitHeadsAndBmm) {
  const double h = gradcheck_error([](const Inputs& in) { return split_heads(in[0], 2, 3, 3, 6); },
                                   [](const Tensor& g, const Inputs& in) {
                                     Tensor gx;
                                     split_heads_backward(g, in[0].shape(), 2, 3, 3, 6, {&gx});
                                     return Inputs{gx};
                                   },
                                   {randn({4, 10}, 10, f64())});
  EXPECT_LT(h, 1e-7);
  const double t = gradcheck_error([](const Inputs& in) { return transpose(in[0], 0, 2); },
                                   [](const Tensor& g, const Inputs&) {
                                     Tensor gx;
                                     transpose_backward(g, 0, 2, {&gx});
                                     return Inputs{gx};
                                   },
                                   {randn({2, 3, 4}, 11, f64())});
  EXPECT_LT(t, 1e-7);
  const double c = gradcheck_error(
      [](const Inputs& in) {
        return concat({in[0], in[1], in[2]}, 1);
      },
      [](const Tensor& g, const Inputs& in) {
        Inputs gs(3);
        GradSlot slots[3] = {{&gs[0]}, {&gs[1]}, {&gs[2]}};
        concat_backward(g, {in[0].shape(), in[1].shape(), in[2].shape()}, 1, slots);
        return gs;
      },
      {randn({2, 1, 3}, 12, f64()), randn({2, 2, 3}, 13, f64()), randn({2, 3, 3}, 14, f64())});
  EXPECT_LT(c, 1e-7);
  for (auto [ta, tb] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    for (const double alpha : {1.0, -0.375}) {
      const double e = gradcheck_error(
          [ta, tb, alpha](const Inputs& in) { return bmm(in[0], in[1], ta, tb, alpha); },
          [ta, tb, alpha](const Tensor& g, const Inputs& in) {
            Tensor ga, gb;
            bmm_backward(g, in[0], in[1], ta, tb, {&ga}, {&gb}, alpha);
            return Inputs{ga, gb};
          },
          {randn(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, 15, f64()),
           randn(tb ? Shape{2, 5, 4} : Shape{2, 4, 5}, 16, f64())});
      EXPECT_LT(e, 1e-7) << "trans_a " << ta << " trans_b " << tb << " alpha " << alpha;
    }
  }
}

// split_heads against what it stands for (narrow, reshape, transpose, reshape), bitwise, forward
// and backward in both slot modes, over layouts: one head, one sequence, a window at either end
// and in the middle, the whole row.
TEST(ShapesCpu, SplitHeadsIsNarrowReshapeTransposeReshapeInOneCopy) {
  struct Layout {
    std::int64_t batch, seq, cols, heads, start, length;
  };
  for (const Layout l :
       {Layout{2, 3, 12, 2, 4, 4}, Layout{1, 5, 6, 3, 0, 6}, Layout{3, 1, 9, 1, 8, 1},
        Layout{2, 4, 24, 4, 16, 8}, Layout{4, 2, 10, 2, 0, 4}}) {
    const std::string where = "batch " + std::to_string(l.batch) + " seq " + std::to_string(l.seq) +
                              " cols " + std::to_string(l.cols) + " heads " +
                              std::to_string(l.heads) + " window [" + std::to_string(l.start) +
                              ", +" + std::to_string(l.length) + ")";
    const std::int64_t dh = l.length / l.heads, rows = l.batch * l.seq;
    const Tensor x = randn({rows, l.cols}, 21, f64());
    const Tensor want = reshape(
        transpose(reshape(narrow(x, l.start, l.length), {l.batch, l.seq, l.heads, dh}), 1, 2),
        {l.batch * l.heads, l.seq, dh});
    const Tensor y = split_heads(x, l.seq, l.heads, l.start, l.length);
    EXPECT_EQ(y.shape(), want.shape()) << where;
    EXPECT_EQ(values(y), values(want)) << where;
    // Backward: the composition's (transpose_backward then narrow_backward), written and added.
    const Tensor g = randn(want.shape(), 22, f64());
    Tensor through;
    transpose_backward(reshape(g, {l.batch, l.heads, l.seq, dh}), 1, 2, {&through});
    Tensor want_gx;
    narrow_backward(reshape(through, {rows, l.length}), x.shape(), l.start, l.length, {&want_gx});
    Tensor gx;
    split_heads_backward(g, x.shape(), l.seq, l.heads, l.start, l.length, {&gx});
    EXPECT_EQ(values(gx), values(want_gx)) << where;
    Tensor acc = randn(x.shape(), 23, f64()), want_acc = acc.clone();
    split_heads_backward(g, x.shape(), l.seq, l.heads, l.start, l.length, {&acc, true});
    narrow_backward(reshape(through, {rows, l.length}), x.shape(), l.start, l.length,
                    {&want_acc, true});
    EXPECT_EQ(values(acc), values(want_acc)) << where;
  }
  // Through the tape: Q, K and V of one matrix, each its own window; the gradient of their sum.
  const Tensor x = randn({6, 12}, 24, f64()).set_requires_grad(true);
  const Tensor w = randn({4, 3, 2}, 25, f64());
  backward(sum(mul(
      add(add(split_heads(x, 3, 2, 0, 4), split_heads(x, 3, 2, 4, 4)), split_heads(x, 3, 2, 8, 4)),
      w)));
  const Tensor wcols = reshape(transpose(reshape(w, {2, 2, 3, 2}), 1, 2), {6, 4});
  EXPECT_EQ(values(x.grad()), values(concat({wcols, wcols, wcols}, 1)));
}

// Every way the layout can be wrong is refused by name, with nothing written.
TEST(ShapesCpu, SplitHeadsRefusesALayoutThatIsNotWholeSequencesAndWholeHeads) {
  const Tensor x = randn({6, 12}, 26, f64());
  GW_EXPECT_ERROR(split_heads(randn({2, 3, 12}, 1, f64()), 3, 2, 0, 4), "split_heads", "[2, 3, 12]",
                  "2 dimensions");
  GW_EXPECT_ERROR(split_heads(x, 4, 2, 0, 4), "split_heads", "seq is 4", "6 rows");
  GW_EXPECT_ERROR(split_heads(x, 0, 2, 0, 4), "split_heads", "seq is 0");
  GW_EXPECT_ERROR(split_heads(x, -3, 2, 0, 4), "split_heads", "seq is -3");
  GW_EXPECT_ERROR(split_heads(x, 3, 3, 0, 4), "split_heads", "heads is 3", "4 columns");
  GW_EXPECT_ERROR(split_heads(x, 3, 0, 0, 4), "split_heads", "heads is 0");
  GW_EXPECT_ERROR(split_heads(x, 3, -2, 0, 4), "split_heads", "heads is -2");
  GW_EXPECT_ERROR(split_heads(x, 3, 2, 10, 4), "split_heads", "window", "[10, 14)");
  GW_EXPECT_ERROR(split_heads(x, 3, 2, -1, 4), "split_heads", "window");
  GW_EXPECT_ERROR(split_heads(x, 3, 2, 0, 0), "split_heads", "window");
  GW_EXPECT_ERROR(split_heads(x, 3, 2, std::numeric_limits<std::int64_t>::max(), 2), "split_heads",
                  "window");
  GW_EXPECT_ERROR(split_heads(x, std::numeric_limits<std::int64_t>::max(), 2, 0, 4), "split_heads",
                  "seq is");
  Tensor gx = ones({6, 12}, f64());
  GW_EXPECT_ERROR(split_heads_backward(randn({4, 3, 2}, 2, f64()), {6, 12}, 3, 2, 0, 6, {&gx}),
                  "split_heads_backward", "grad_out", "[4, 3, 3]");
  GW_EXPECT_ERROR(split_heads_backward(randn({4, 3, 2}, 2, f64()), {6, 12}, 3, 5, 0, 4, {&gx}),
                  "split_heads_backward", "heads is 5");
  EXPECT_EQ(values(gx), values(ones({6, 12}, f64())));  // nothing written
}

TEST(ShapesCpu, ConcatBackwardAccumulatesIntoEachWindow) {
  const Tensor g = iota({2, 3});
  Tensor a = ones({2, 1}, f64()), b;
  GradSlot slots[2] = {{&a, true}, {&b}};
  concat_backward(g, {{2, 1}, {2, 2}}, 1, slots);
  EXPECT_EQ(values(a), (std::vector<double>{1, 4}));
  EXPECT_EQ(values(b), (std::vector<double>{1, 2, 4, 5}));
}

}  // namespace
}  // namespace graphward
