// causal_softmax and scaled_dot_product_attention on the CPU backend: values against their
// definitions computed here, gradients against finite differences (float64), and the errors.
#include <cmath>
#include <vector>

#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::gradcheck_error;
using testing::Inputs;
using testing::values;

// The definition: row i of each [tq, tk] matrix is the softmax of its columns j <= i, 0 after.
std::vector<double> causal_softmax_reference(const std::vector<double>& x, std::int64_t n,
                                             std::int64_t tq, std::int64_t tk) {
  std::vector<double> y(x.size(), 0.0);
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t i = 0; i < tq; ++i) {
      const std::int64_t kept = std::min(tk, i + 1), row = (b * tq + i) * tk;
      double m = x[row];
      for (std::int64_t j = 1; j < kept; ++j) m = std::max(m, x[row + j]);
      double s = 0;
      for (std::int64_t j = 0; j < kept; ++j) s += std::exp(x[row + j] - m);
      for (std::int64_t j = 0; j < kept; ++j) y[row + j] = std::exp(x[row + j] - m) / s;
    }
  }
  return y;
}

TEST(AttentionCpu, CausalSoftmaxIsTheSoftmaxOfEachRowsPrefixAndZeroAfter) {
  // As many queries as keys, fewer (each row keeps up to its own position) and more (the rows
  // past the last key keep every key); a huge score stays finite.
  for (const Shape& s :
       std::vector<Shape>{{1, 1, 1}, {2, 4, 4}, {3, 3, 7}, {2, 6, 4}, {2, 2, 3, 5}}) {
    Tensor x = mul(randn(s, 11, f64()), 3.0);
    std::vector<double> xv = values(x);
    xv[0] = 1000.0;
    x = from_vector(xv, s);
    const std::int64_t tq = s[s.size() - 2], tk = s.back(), n = x.numel() / (tq * tk);
    const std::vector<double> want = causal_softmax_reference(xv, n, tq, tk);
    const std::vector<double> got = values(causal_softmax(x));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t e = 0; e < got.size(); ++e) {
      EXPECT_NEAR(got[e], want[e], 1e-14) << shape_str(s) << " element " << e;
      if (want[e] == 0.0) {
        EXPECT_EQ(got[e], 0.0) << shape_str(s) << " element " << e;  // exactly 0, not tiny
      }
    }
  }
  // Its first row is one key: weight 1; a square causal softmax's last row is the plain softmax.
  const Tensor x = randn({1, 5, 5}, 12, f64());
  const std::vector<double> y = values(causal_softmax(x)), full = values(softmax(x));
  EXPECT_EQ(y[0], 1.0);
  for (int j = 0; j < 5; ++j) EXPECT_NEAR(y[20 + j], full[20 + j], 1e-15);
}

TEST(AttentionCpu, CausalSoftmaxGradientThroughTheTapeMatchesFiniteDifferences) {
  for (const Shape& s : std::vector<Shape>{{2, 4, 4}, {1, 3, 6}, {2, 5, 3}}) {
    const double err = gradcheck_error([](const Inputs& in) { return causal_softmax(in[0]); },
                                       [](const Tensor& g, const Inputs& in) {
                                         const Tensor x = in[0].detach().set_requires_grad(true);
                                         backward(sum(mul(causal_softmax(x), g)));
                                         return Inputs{x.grad()};
                                       },
                                       {randn(s, 13, f64())});
    EXPECT_LT(err, 1e-7) << shape_str(s);
  }
}

// The definition, loop by loop: softmax(q·kᵀ·scale [causal]) · v per leading index.
std::vector<double> attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                        bool causal, double scale) {
  const std::int64_t tq = q.size(-2), d = q.size(-1), tk = k.size(-2), dv = v.size(-1);
  const std::int64_t n = q.numel() / (tq * d);
  const std::vector<double> qv = values(q), kv = values(k), vv = values(v);
  std::vector<double> out(static_cast<std::size_t>(n * tq * dv), 0.0);
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t i = 0; i < tq; ++i) {
      const std::int64_t kept = causal ? std::min(tk, i + 1) : tk;
      std::vector<double> w(static_cast<std::size_t>(kept));
      double m = -INFINITY;
      for (std::int64_t j = 0; j < kept; ++j) {
        double dot = 0;
        for (std::int64_t e = 0; e < d; ++e)
          dot += qv[(b * tq + i) * d + e] * kv[(b * tk + j) * d + e];
        w[j] = dot * scale;
        m = std::max(m, w[j]);
      }
      double s = 0;
      for (double& x : w) s += (x = std::exp(x - m));
      for (std::int64_t j = 0; j < kept; ++j) {
        for (std::int64_t e = 0; e < dv; ++e) {
          out[(b * tq + i) * dv + e] += w[j] / s * vv[(b * tk + j) * dv + e];
        }
      }
    }
  }
  return out;
}

TEST(AttentionCpu, ScaledDotProductAttentionIsItsDefinition) {
  struct Case {
    Shape q, k, v;
  };
  const Case cases[] = {{{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}},  // batch, heads, T, d
                        {{3, 4, 6}, {3, 7, 6}, {3, 7, 2}},           // fewer queries than keys
                        {{2, 6, 3}, {2, 4, 3}, {2, 4, 5}},           // more queries than keys
                        {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}}};
  for (const Case& c : cases) {
    const Tensor q = randn(c.q, 21, f64()), k = randn(c.k, 22, f64()), v = randn(c.v, 23, f64());
    for (bool causal : {false, true}) {
      for (double scale : {0.0, 0.3}) {  // 0: the default, 1/√d
        AttentionOptions o{.causal = causal};
        if (scale != 0.0) o.scale = scale;
        const Tensor out = scaled_dot_product_attention(q, k, v, o);
        Shape want_shape = c.q;
        want_shape.back() = c.v.back();
        EXPECT_EQ(out.shape(), want_shape);
        const std::vector<double> got = values(out),
                                  want = attention_reference(
                                      q, k, v, causal,
                                      scale != 0.0 ? scale : 1.0 / std::sqrt(double(c.q.back())));
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t e = 0; e < got.size(); ++e) {
          EXPECT_NEAR(got[e], want[e], 1e-12)
              << shape_str(c.q) << " causal=" << causal << " scale=" << scale << " element " << e;
        }
      }
    }
  }
}

TEST(AttentionCpu, ScaledDotProductAttentionGradientsMatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    const double err = gradcheck_error(
        [causal](const Inputs& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], {.causal = causal});
        },
        [causal](const Tensor& g, const Inputs& in) {
          Inputs leaves;
          for (const Tensor& t : in) leaves.push_back(t.detach().set_requires_grad(true));
          backward(sum(
              mul(scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], {.causal = causal}),
                  g)));
          return Inputs{leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
        },
        {randn({2, 2, 5, 4}, 31, f64()), randn({2, 2, 6, 4}, 32, f64()),
         randn({2, 2, 6, 3}, 33, f64())});
    EXPECT_LT(err, 1e-7) << "causal=" << causal;
  }
}

TEST(AttentionCpu, DropoutDrawsFromItsGeneratorAndMatchesTheComposedOps) {
  const Tensor q = randn({2, 8, 4}, 41, f64()), k = randn({2, 8, 4}, 42, f64()),
               v = randn({2, 8, 4}, 43, f64());
  Generator a(Device::cpu(), 99), b(Device::cpu(), 99);
  const Tensor out =
      scaled_dot_product_attention(q, k, v, {.causal = true, .dropout = 0.25, .generator = &a});
  // The same ops by hand, from a generator of the same seed: the same draws, the same values.
  const Tensor p = dropout(causal_softmax(bmm(q, k, false, true, 0.5)), 0.25, b);
  EXPECT_EQ(values(out), values(bmm(p, v)));
  EXPECT_EQ(a.offset(), b.offset());
  EXPECT_NE(values(out), values(scaled_dot_product_attention(q, k, v, {.causal = true})));
}

TEST(AttentionCpu, BadShapesAndOptionsAreRefusedByName) {
  const Tensor q = randn({2, 5, 4}, 51).set_requires_grad(true), k = randn({2, 6, 4}, 52),
               v = randn({2, 6, 3}, 53);
  const char* op = "scaled_dot_product_attention";
  GW_EXPECT_ERROR(
      scaled_dot_product_attention(randn({5, 4}, 1), randn({6, 4}, 2), randn({6, 3}, 3)), op,
      "[5, 4]", "at least one leading dimension");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, randn({1, 2, 6, 4}, 4), v), op,
                  "the same number of dimensions");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, randn({3, 6, 4}, 4), randn({3, 6, 3}, 5)), op,
                  "the same leading dimensions");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, randn({2, 6, 5}, 4), v), op,
                  "the head dimension");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, randn({2, 7, 3}, 4)), op,
                  "a value for each key");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, v, {.scale = NAN}), op, "finite");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, v, {.scale = INFINITY}), op, "finite");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, v, {.dropout = 1.0}), op, "[0, 1)");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, v, {.dropout = -0.5}), op, "[0, 1)");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, v, {.dropout = NAN}), op, "[0, 1)");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, v, {.dropout = 0.1}), op,
                  "no generator is given");
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, Tensor()), op);
  GW_EXPECT_ERROR(scaled_dot_product_attention(q, k, randn({2, 6, 3}, 6, f64())), op);
  GW_EXPECT_ERROR(causal_softmax(randn({5}, 7)), "causal_softmax", "[5]", "at least 2-d");
  GW_EXPECT_ERROR(causal_softmax(Tensor()), "causal_softmax");
  // The library stays usable: the same q, k and v run and train after the refusals.
  EXPECT_FALSE(q.grad().defined());
  const Tensor out = scaled_dot_product_attention(q, k, v);
  backward(sum(out));
  EXPECT_TRUE(q.grad().defined());
}

// self_attention is split_heads of qkv's three windows, scaled_dot_product_attention and the
// heads merged: the same values (float64, bitwise) and gradients, causal and not, one head and
// several, with dropout from generators of one seed; its path on the CPU says composed.
TEST(AttentionCpu, SelfAttentionIsItsHeadsSplitAttendedAndMerged) {
  struct Case {
    std::int64_t batch, seq, heads, head;
  };
  for (const Case& c : {Case{2, 5, 3, 4}, Case{1, 7, 1, 6}, Case{3, 1, 2, 2}}) {
    const std::int64_t dim = c.heads * c.head;
    for (bool causal : {false, true}) {
      for (double p : {0.0, 0.3}) {
        SCOPED_TRACE(::testing::Message() << "batch " << c.batch << " seq " << c.seq << " heads "
                                        << c.heads << " causal " << causal << " dropout " << p);
        const Tensor x = randn({c.batch * c.seq, 3 * dim}, 61, f64());
        const Tensor a = x.detach().set_requires_grad(true), b = x.detach().set_requires_grad(true);
        Generator ga(Device::cpu(), 7), gb(Device::cpu(), 7);
        const Tensor got = self_attention(
            a, c.seq, c.heads, {.causal = causal, .dropout = p, .generator = p > 0 ? &ga : nullptr});
        const Tensor att = scaled_dot_product_attention(
            split_heads(b, c.seq, c.heads, 0, dim), split_heads(b, c.seq, c.heads, dim, dim),
            split_heads(b, c.seq, c.heads, 2 * dim, dim),
            {.causal = causal, .dropout = p, .generator = p > 0 ? &gb : nullptr});
        const Tensor want =
            reshape(transpose(reshape(att, {c.batch, c.heads, c.seq, c.head}), 1, 2),
                    {c.batch * c.seq, dim});
        EXPECT_EQ(got.shape(), Shape({c.batch * c.seq, dim}));
        EXPECT_EQ(values(got), values(want));
        const Tensor g = randn({c.batch * c.seq, dim}, 62, f64());
        backward({got}, {g});
        backward({want}, {g});
        EXPECT_EQ(values(a.grad()), values(b.grad()));
      }
    }
  }
  const AttentionPath path = self_attention_path(randn({4, 12}, 1), 2, 2);
  EXPECT_FALSE(path.fused);
  EXPECT_NE(path.reason.find("CPU"), std::string::npos) << path.reason;
}

// Every malformed qkv, seq, heads or option is refused by name before anything runs, and the
// library stays usable.
TEST(AttentionCpu, SelfAttentionRefusesBadShapesAndOptionsByName) {
  const Tensor qkv = randn({6, 12}, 71).set_requires_grad(true);
  const char* op = "self_attention";
  GW_EXPECT_ERROR(self_attention(randn({12}, 1), 2, 2), op, "[12]", "[batch · seq, 3 · dim]");
  GW_EXPECT_ERROR(self_attention(randn({2, 3, 12}, 1), 3, 2), op, "[2, 3, 12]");
  GW_EXPECT_ERROR(self_attention(qkv, 4, 2), op, "6 rows", "seq is 4");
  GW_EXPECT_ERROR(self_attention(qkv, 3, 3), op, "12 columns", "heads is 3");
  GW_EXPECT_ERROR(self_attention(randn({6, 13}, 1), 3, 1), op, "13 columns");
  for (std::int64_t bad : {0, -1}) {
    GW_EXPECT_ERROR(self_attention(qkv, bad, 2), op, "at least 1");
    GW_EXPECT_ERROR(self_attention(qkv, 3, bad), op, "at least 1");
  }
  GW_EXPECT_ERROR(self_attention(qkv, 3, 2, {.scale = NAN}), op, "finite");
  GW_EXPECT_ERROR(self_attention(qkv, 3, 2, {.dropout = 1.0}), op, "[0, 1)");
  GW_EXPECT_ERROR(self_attention(qkv, 3, 2, {.dropout = 0.1}), op, "no generator is given");
  GW_EXPECT_ERROR(self_attention(Tensor(), 3, 2), op, "qkv");
  GW_EXPECT_ERROR(self_attention(from_vector(std::vector<std::int32_t>(72, 0), {6, 12}), 3, 2), op,
                  "floating-point");
  GW_EXPECT_ERROR(self_attention_path(qkv, 4, 2), "self_attention_path", "seq is 4");
  EXPECT_FALSE(qkv.grad().defined());
  backward(sum(self_attention(qkv, 3, 2, {.causal = true})));
  EXPECT_TRUE(qkv.grad().defined());
}

}  // namespace
}  // namespace graphward
