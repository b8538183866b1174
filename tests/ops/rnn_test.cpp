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

}  // namespace
}  // namespace graphward
