// narrow and the recurrent cells on the CPU backend: narrow's window and gradient; LSTMCell and
// GRUCell against their definitions written out here, and their gradients (through the tape)
// against finite differences.
#include <cmath>
#include <functional>

#include "test_util.h"

namespace graphward {
namespace {
using testing::f64;
using testing::values;

TEST(ShapesCpu, NarrowTakesAWindowOfTheLastDimensionAndPutsTheGradientBack) {
  const Tensor x = from_vector(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}, {2, 4});
  EXPECT_EQ(values(narrow(x, 1, 2)), (std::vector<double>{1, 2, 5, 6}));
  EXPECT_EQ(narrow(x, 3, 1).shape(), Shape({2, 1}));
  Tensor g;
  narrow_backward(from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}), x.shape(), 1, 2, {&g});
  EXPECT_EQ(values(g), (std::vector<double>{0, 1, 2, 0, 0, 3, 4, 0}));
  narrow_backward(from_vector(std::vector<double>{1, 1, 1, 1}, {2, 2}), x.shape(), 2, 2,
                  {&g, /*accumulate=*/true});
  EXPECT_EQ(values(g), (std::vector<double>{0, 1, 3, 1, 0, 3, 5, 1}));
  GW_EXPECT_ERROR(narrow(x, 3, 2), "narrow", "[3, 5)", "[2, 4]");
  GW_EXPECT_ERROR(narrow(x, 0, 0), "narrow", "length >= 1");
}

double sig(double v) {
  return 1 / (1 + std::exp(-v));
}

struct Cell {
  Tensor x, h, c, w_ih, w_hh, b_ih, b_hh;
};
Cell make_cell(int gates, std::uint64_t seed) {
  const std::int64_t b = 3, in = 4, hid = 5;
  auto p = [&](const Shape& s) {
    return mul(randn(s, seed++, f64()), 0.5).detach().set_requires_grad(true);
  };
  return {randn({b, in}, seed + 100, f64()),
          randn({b, hid}, seed + 101, f64()),
          randn({b, hid}, seed + 102, f64()),
          p({gates * hid, in}),
          p({gates * hid, hid}),
          p({gates * hid}),
          p({gates * hid})};
}

// x·Wᵀ + b for row r, gate unit k (double, from the tensors' values).
double proj(const Tensor& x, const Tensor& w, const Tensor& b, std::int64_t r, std::int64_t k) {
  const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
  const std::int64_t in = x.size(1);
  double s = bv[k];
  for (std::int64_t j = 0; j < in; ++j) s += xv[r * in + j] * wv[k * in + j];
  return s;
}

TEST(RnnCpu, LstmAndGruCellsFollowTheirDefinitions) {
  const Cell l = make_cell(4, 1);
  const LstmState s = lstm_cell(l.x, {l.h, l.c}, l.w_ih, l.w_hh, l.b_ih, l.b_hh);
  const std::vector<double> hv = values(s.h), cv = values(s.c), c0 = values(l.c);
  const std::int64_t H = 5;
  for (std::int64_t r = 0; r < 3; ++r) {
    for (std::int64_t j = 0; j < H; ++j) {
      auto gate = [&](int k) {
        return proj(l.x, l.w_ih, l.b_ih, r, k * H + j) + proj(l.h, l.w_hh, l.b_hh, r, k * H + j);
      };
      const double c = sig(gate(1)) * c0[r * H + j] + sig(gate(0)) * std::tanh(gate(2));
      EXPECT_NEAR(cv[r * H + j], c, 1e-12);
      EXPECT_NEAR(hv[r * H + j], sig(gate(3)) * std::tanh(c), 1e-12);
    }
  }
  const Cell g = make_cell(3, 20);
  const std::vector<double> gh = values(gru_cell(g.x, g.h, g.w_ih, g.w_hh, g.b_ih, g.b_hh));
  const std::vector<double> h0 = values(g.h);
  for (std::int64_t r = 0; r < 3; ++r) {
    for (std::int64_t j = 0; j < H; ++j) {
      auto xi = [&](int k) { return proj(g.x, g.w_ih, g.b_ih, r, k * H + j); };
      auto hh = [&](int k) { return proj(g.h, g.w_hh, g.b_hh, r, k * H + j); };
      const double rr = sig(xi(0) + hh(0)), z = sig(xi(1) + hh(1));
      const double n = std::tanh(xi(2) + rr * hh(2));
      EXPECT_NEAR(gh[r * H + j], (1 - z) * n + z * h0[r * H + j], 1e-12);
    }
  }
}

// The gradient of f with respect to every element of p, by central differences.
std::vector<double> numeric(const std::function<double()>& f, const Tensor& p) {
  std::vector<double> g(static_cast<std::size_t>(p.numel()));
  for (std::size_t j = 0; j < g.size(); ++j) {
    double* v = p.data<double>() + j;
    const double saved = *v;
    *v = saved + 1e-6;
    const double fp = f();
    *v = saved - 1e-6;
    const double fm = f();
    *v = saved;
    g[j] = (fp - fm) / 2e-6;
  }
  return g;
}

TEST(RnnCpu, TwoStepsOfEachCellHaveTheGradientsOfFiniteDifferences) {
  const Cell l = make_cell(4, 40), g = make_cell(3, 60);
  auto lstm_loss = [&] {
    LstmState s{l.h, l.c};
    for (int t = 0; t < 2; ++t) s = lstm_cell(l.x, s, l.w_ih, l.w_hh, l.b_ih, l.b_hh);
    return add(sum(mul(s.h, s.h)), sum(s.c));
  };
  auto gru_loss = [&] {
    Tensor h = g.h;
    for (int t = 0; t < 2; ++t) h = gru_cell(g.x, h, g.w_ih, g.w_hh, g.b_ih, g.b_hh);
    return sum(mul(h, h));
  };
  backward(lstm_loss());
  backward(gru_loss());
  for (const Tensor& p : {l.w_ih, l.w_hh, l.b_ih, l.b_hh}) {
    EXPECT_LT(testing::rel_error(values(p.grad()), numeric(
                                                       [&] {
                                                         NoGradGuard n;
                                                         return lstm_loss().item();
                                                       },
                                                       p)),
              1e-7);
  }
  for (const Tensor& p : {g.w_ih, g.w_hh, g.b_ih, g.b_hh}) {
    EXPECT_LT(testing::rel_error(values(p.grad()), numeric(
                                                       [&] {
                                                         NoGradGuard n;
                                                         return gru_loss().item();
                                                       },
                                                       p)),
              1e-7);
  }
}

// A two-layer, two-step stack of LSTM cells, composed or fused (the upper layer reading the lower
// layer's state in place), and its loss; the leaves' gradients after a backward of that loss.
struct Stack {
  Tensor x, h0, c0, w_ih[2], w_hh[2], b_ih[2], b_hh[2];
};
Stack make_stack(bool bias, std::uint64_t seed) {
  const std::int64_t b = 3, in = 4, hid = 5;
  auto p = [&](const Shape& s) {
    return mul(randn(s, seed++, f64()), 0.5).detach().set_requires_grad(true);
  };
  Stack st;
  st.x = p({b, in});
  st.h0 = p({b, hid});
  st.c0 = p({b, hid});
  for (int l = 0; l < 2; ++l) {
    st.w_ih[l] = p({4 * hid, l == 0 ? in : hid});
    st.w_hh[l] = p({4 * hid, hid});
    if (bias) {
      st.b_ih[l] = p({4 * hid});
      st.b_hh[l] = p({4 * hid});
    }
  }
  return st;
}
Tensor stack_loss(const Stack& st, bool fused) {
  if (fused) {
    Tensor s[2] = {lstm_state(st.h0, st.c0), lstm_state(st.h0, st.c0)};
    for (int t = 0; t < 2; ++t) {
      s[0] = fused_lstm_cell(st.x, s[0], st.w_ih[0], st.w_hh[0], st.b_ih[0], st.b_hh[0]);
      s[1] = fused_lstm_cell(s[0], s[1], st.w_ih[1], st.w_hh[1], st.b_ih[1], st.b_hh[1]);
    }
    const Tensor h = lstm_hidden(s[1]);
    const Tensor c = reshape(narrow(reshape(s[1], {1, s[1].numel()}), h.numel(), h.numel()),
                             h.shape());
    return add(sum(mul(h, h)), sum(mul(c, c)));
  }
  LstmState s[2] = {{st.h0, st.c0}, {st.h0, st.c0}};
  const Tensor zero_b = zeros({st.w_hh[0].size(0)}, f64());
  auto bias = [&](const Tensor& b) { return b.defined() ? b : zero_b; };
  for (int t = 0; t < 2; ++t) {
    s[0] = lstm_cell(st.x, s[0], st.w_ih[0], st.w_hh[0], bias(st.b_ih[0]), bias(st.b_hh[0]));
    s[1] = lstm_cell(s[0].h, s[1], st.w_ih[1], st.w_hh[1], bias(st.b_ih[1]), bias(st.b_hh[1]));
  }
  return add(sum(mul(s[1].h, s[1].h)), sum(mul(s[1].c, s[1].c)));
}
std::vector<Tensor> stack_leaves(const Stack& st) {
  std::vector<Tensor> v{st.x, st.h0, st.c0};
  for (int l = 0; l < 2; ++l) {
    for (const Tensor* t : {&st.w_ih[l], &st.w_hh[l], &st.b_ih[l], &st.b_hh[l]}) {
      if (t->defined()) v.push_back(*t);
    }
  }
  return v;
}

TEST(RnnCpu, TheFusedLstmCellIsTheComposedOneForwardAndBackward) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    const Stack st = make_stack(bias, bias ? 200 : 300);
    const Tensor composed = stack_loss(st, false);
    backward(composed);
    std::vector<std::vector<double>> want;
    for (const Tensor& p : stack_leaves(st)) {
      want.push_back(values(p.grad()));
      p.grad() = Tensor();
    }
    const Tensor fused = stack_loss(st, true);
    EXPECT_NEAR(fused.item(), composed.item(), 1e-12 * std::abs(composed.item()));
    backward(fused);
    const std::vector<Tensor> leaves = stack_leaves(st);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      SCOPED_TRACE("leaf " + std::to_string(i));
      EXPECT_LT(testing::rel_error(values(leaves[i].grad()), want[i]), 1e-12);
    }
    // Accumulated: a second backward adds the same gradients.
    backward(stack_loss(st, true));
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      std::vector<double> twice = want[i];
      for (double& v : twice) v *= 2;
      EXPECT_LT(testing::rel_error(values(leaves[i].grad()), twice), 1e-12);
    }
  }
}

// Two stacked layers over T steps as fused_lstm_layer ops (the upper reading the lower's output in
// place), against the same stack of fused cells step by step: every step's h and c, and every
// leaf's gradient, written and accumulated.
TEST(RnnCpu, TheFusedLstmLayerIsItsCellsStepByStep) {
  const std::int64_t T = 4, B = 3, in = 4, H = 5;
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    Stack st = make_stack(bias, bias ? 800 : 900);
    const Tensor xs = mul(randn({T * B, in}, 77, f64()), 0.5).detach().set_requires_grad(true);
    const Tensor weight = randn({2, T * B, H}, 78, f64());
    auto layers = [&] {
      const Tensor s0 = lstm_state(st.h0, st.c0);
      const Tensor l0 = fused_lstm_layer(xs, s0, st.w_ih[0], st.w_hh[0], st.b_ih[0], st.b_hh[0]);
      return fused_lstm_layer(l0, s0, st.w_ih[1], st.w_hh[1], st.b_ih[1], st.b_hh[1]);
    };
    auto cells = [&] {  // the same, a cell at a time; the top layer's states packed as layers'
      Tensor s[2] = {lstm_state(st.h0, st.c0), lstm_state(st.h0, st.c0)};
      std::vector<Tensor> hs, cs;
      for (std::int64_t t = 0; t < T; ++t) {
        const Tensor x_t =
            reshape(narrow(reshape(xs, {1, T * B * in}), t * B * in, B * in), {B, in});
        s[0] = fused_lstm_cell(x_t, s[0], st.w_ih[0], st.w_hh[0], st.b_ih[0], st.b_hh[0]);
        s[1] = fused_lstm_cell(s[0], s[1], st.w_ih[1], st.w_hh[1], st.b_ih[1], st.b_hh[1]);
        const Tensor flat = reshape(s[1], {1, 2 * B * H});
        hs.push_back(reshape(narrow(flat, 0, B * H), {1, B * H}));
        cs.push_back(reshape(narrow(flat, B * H, B * H), {1, B * H}));
      }
      hs.insert(hs.end(), cs.begin(), cs.end());
      return reshape(concat(hs, 0), {2, T * B, H});
    };
    std::vector<Tensor> leaves = stack_leaves(st);
    leaves.front() = xs;  // the stack's own x is not read here
    const Tensor by_cells = cells();
    backward(sum(mul(by_cells, weight)));
    std::vector<std::vector<double>> want;
    for (const Tensor& p : leaves) {
      want.push_back(values(p.grad()));
      p.grad() = Tensor();
    }
    const Tensor by_layers = layers();
    EXPECT_EQ(by_layers.shape(), Shape({2, T * B, H}));
    EXPECT_LT(testing::rel_error(values(by_layers), values(by_cells)), 1e-13);
    for (int pass = 1; pass <= 2; ++pass) {  // written, then accumulated
      backward(sum(mul(pass == 1 ? by_layers : layers(), weight)));
      for (std::size_t i = 0; i < leaves.size(); ++i) {
        SCOPED_TRACE("pass " + std::to_string(pass) + ", leaf " + std::to_string(i));
        std::vector<double> w = want[i];
        for (double& v : w) v *= pass;
        EXPECT_LT(testing::rel_error(values(leaves[i].grad()), w), 1e-12);
      }
    }
  }
  // One step is a cell; rows that are not whole steps are refused by name.
  const Stack st = make_stack(true, 1000);
  const Tensor s0 = lstm_state(st.h0, st.c0);
  EXPECT_LT(testing::rel_error(
                values(fused_lstm_layer(st.x, s0, st.w_ih[0], st.w_hh[0], st.b_ih[0], st.b_hh[0])),
                values(fused_lstm_cell(st.x, s0, st.w_ih[0], st.w_hh[0], st.b_ih[0], st.b_hh[0]))),
            1e-15);
  GW_EXPECT_ERROR((void)fused_lstm_layer(randn({7, 4}, 1, f64()), s0, st.w_ih[0], st.w_hh[0],
                                         st.b_ih[0], st.b_hh[0]),
                  "fused_lstm_layer", "x is float64[7, 4]", "[T·B, in]", "B = 3");
}

TEST(RnnCpu, TheFusedGruCellIsTheComposedOneForwardAndBackward) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    std::uint64_t seed = bias ? 600 : 700;
    auto p = [&](const Shape& s) {
      return mul(randn(s, seed++, f64()), 0.5).detach().set_requires_grad(true);
    };
    const std::int64_t b = 3, in = 4, hid = 5;
    const Tensor x = p({b, in}), h0 = p({b, hid});
    Tensor w_ih[2], w_hh[2], b_ih[2], b_hh[2];
    for (int l = 0; l < 2; ++l) {
      w_ih[l] = p({3 * hid, l == 0 ? in : hid});
      w_hh[l] = p({3 * hid, hid});
      if (bias) {
        b_ih[l] = p({3 * hid});
        b_hh[l] = p({3 * hid});
      }
    }
    const Tensor zero_b = zeros({3 * hid}, f64());
    auto loss = [&](bool fused) {
      Tensor h[2] = {h0, h0};
      for (int t = 0; t < 2; ++t) {
        for (int l = 0; l < 2; ++l) {
          const Tensor& in_l = l == 0 ? x : h[0];
          h[l] = fused ? fused_gru_cell(in_l, h[l], w_ih[l], w_hh[l], b_ih[l], b_hh[l])
                       : gru_cell(in_l, h[l], w_ih[l], w_hh[l], bias ? b_ih[l] : zero_b,
                                  bias ? b_hh[l] : zero_b);
        }
      }
      return sum(mul(h[1], h[1]));
    };
    std::vector<Tensor> leaves{x, h0};
    for (int l = 0; l < 2; ++l) {
      for (const Tensor* t : {&w_ih[l], &w_hh[l], &b_ih[l], &b_hh[l]}) {
        if (t->defined()) leaves.push_back(*t);
      }
    }
    const Tensor composed = loss(false);
    backward(composed);
    std::vector<std::vector<double>> want;
    for (const Tensor& t : leaves) {
      want.push_back(values(t.grad()));
      t.grad() = Tensor();
    }
    const Tensor fused = loss(true);
    EXPECT_NEAR(fused.item(), composed.item(), 1e-12 * std::abs(composed.item()));
    backward(fused);
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      SCOPED_TRACE("leaf " + std::to_string(i));
      EXPECT_LT(testing::rel_error(values(leaves[i].grad()), want[i]), 1e-12);
    }
    backward(loss(true));  // accumulated: twice the gradients
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      std::vector<double> twice = want[i];
      for (double& v : twice) v *= 2;
      EXPECT_LT(testing::rel_error(values(leaves[i].grad()), twice), 1e-12);
    }
  }
  // Its refusals, each naming what was wrong.
  const Tensor x = randn({3, 4}, 1, f64()), h = randn({3, 5}, 2, f64());
  const Tensor wi = randn({15, 4}, 3, f64()), wh = randn({15, 5}, 4, f64());
  const Tensor bi = randn({15}, 5, f64()), bh = randn({15}, 6, f64());
  GW_EXPECT_ERROR((void)fused_gru_cell(x, randn({2, 5}, 7, f64()), wi, wh, bi, bh),
                  "fused_gru_cell", "same batch");
  GW_EXPECT_ERROR((void)fused_gru_cell(x, h, wh, wh, bi, bh), "fused_gru_cell",
                  "W_ih is [15, 5]", "[15, 4]");
  GW_EXPECT_ERROR((void)fused_gru_cell(x, h, wi, wi, bi, bh), "fused_gru_cell", "W_hh is [15, 4]");
  GW_EXPECT_ERROR((void)fused_gru_cell(x, h, wi, wh, Tensor(), bh), "fused_gru_cell",
                  "both biases or neither");
  GW_EXPECT_ERROR((void)fused_gru_cell(x, h, wi, wh, randn({12}, 8, f64()), randn({12}, 9, f64())),
                  "fused_gru_cell", "[3·H] = [15]");
  EXPECT_EQ(fused_gru_cell(x, h, wi, wh, bi, bh).shape(), Shape({3, 5}));
}

TEST(RnnCpu, TheFusedLstmCellRefusesWhatItCannotComputeAndStaysUsable) {
  const Stack st = make_stack(true, 400);
  const Tensor s = lstm_state(st.h0, st.c0);
  const Tensor& w_ih = st.w_ih[0];
  const Tensor& w_hh = st.w_hh[0];
  const Tensor& bi = st.b_ih[0];
  const Tensor& bh = st.b_hh[0];
  GW_EXPECT_ERROR((void)fused_lstm_cell(st.x, st.h0, w_ih, w_hh, bi, bh), "fused_lstm_cell",
                  "expected [2, B, H]");
  GW_EXPECT_ERROR((void)fused_lstm_cell(st.x, reshape(s, {1, 6, 5}), w_ih, w_hh, bi, bh),
                  "fused_lstm_cell", "expected [2, B, H]");
  GW_EXPECT_ERROR((void)fused_lstm_cell(narrow(st.x, 0, 3), s, w_ih, w_hh, bi, bh),
                  "fused_lstm_cell", "W_ih is [20, 4]", "[20, 3]");
  GW_EXPECT_ERROR((void)fused_lstm_cell(reshape(st.x, {1, 3, 4}), s, w_ih, w_hh, bi, bh),
                  "fused_lstm_cell", "x is", "[2, B, in]");
  GW_EXPECT_ERROR((void)fused_lstm_cell(reshape(st.x, {4, 3}), s, w_ih, w_hh, bi, bh),
                  "fused_lstm_cell", "x is", "B = 3");
  GW_EXPECT_ERROR((void)fused_lstm_cell(st.x, s, w_ih, w_ih, bi, bh), "fused_lstm_cell",
                  "W_hh is [20, 4]", "[20, 5]");
  GW_EXPECT_ERROR((void)fused_lstm_cell(st.x, s, w_ih, w_hh, bi, Tensor()), "fused_lstm_cell",
                  "both biases or neither");
  GW_EXPECT_ERROR((void)fused_lstm_cell(st.x, s, w_ih, w_hh, narrow(reshape(bi, {1, 20}), 0, 19),
                                        bh),
                  "fused_lstm_cell", "biases");
  GW_EXPECT_ERROR((void)fused_lstm_cell(cast(st.x, DType::kFloat32), s, w_ih, w_hh, bi, bh),
                  "fused_lstm_cell");
  GW_EXPECT_ERROR((void)lstm_state(st.h0, st.x), "lstm_state", "one shape");
  GW_EXPECT_ERROR((void)lstm_hidden(st.h0), "lstm_hidden", "[2, B, H]");
  // Nothing was recorded or written by the refusals: the cell still trains.
  const Tensor out = fused_lstm_cell(st.x, s, w_ih, w_hh, bi, bh);
  backward(sum(out));
  EXPECT_TRUE(w_ih.grad().defined());
}

}  // namespace
}  // namespace graphward
