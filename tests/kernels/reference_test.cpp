// The CPU references themselves (the oracle of every GPU test), and the random number generator.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "graphward/engine/runtime/random.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/gemm.h"
#include "graphward/kernels/reduce.h"

namespace graphward::kernels::cpu {
namespace {

TEST(GemmReference, AllFourTransposeCombinations) {
  // A = [[1,2,3],[4,5,6]] (2x3), B = [[1,0],[0,1],[1,1]] (3x2); A·B = [[4,5],[10,11]].
  const std::vector<double> a{1, 2, 3, 4, 5, 6}, at{1, 4, 2, 5, 3, 6};
  const std::vector<double> b{1, 0, 0, 1, 1, 1}, bt{1, 0, 1, 0, 1, 1};
  const std::vector<double> expected{4, 5, 10, 11};
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<double> c(4, NAN);  // beta = 0 must ignore NaN in C
      gemm<double>(ta, tb, 2, 2, 3, 1.0, ta ? at.data() : a.data(), tb ? bt.data() : b.data(), 0.0,
                   c.data());
      EXPECT_EQ(c, expected) << "trans_a=" << ta << " trans_b=" << tb;
    }
  }
  std::vector<double> c{1, 1, 1, 1};
  gemm<double>(false, false, 2, 2, 3, 2.0, a.data(), b.data(), 1.0, c.data());
  EXPECT_EQ(c, (std::vector<double>{9, 11, 21, 23}));
}

TEST(ReduceReference, ColumnSumWithAndWithoutWeights) {
  const std::vector<float> src{1, 2, 3, 4, 5, 6};  // 2 x 3
  const std::vector<float> w{1, 1, 1, 2, 2, 2};
  std::vector<float> out(3, NAN);
  column_sum<float>(out.data(), src.data(), nullptr, 1.f, 2, 3, false);
  EXPECT_EQ(out, (std::vector<float>{5, 7, 9}));
  column_sum<float>(out.data(), src.data(), w.data(), -1.f, 2, 3, true);
  EXPECT_EQ(out, (std::vector<float>{5 - 9, 7 - 12, 9 - 15}));
}

TEST(ElementwiseReference, BroadcastPeriods) {
  const std::vector<float> a{1, 2, 3, 4}, row{10, 20}, one{5};
  std::vector<float> y(4);
  binary_forward<float>(BinaryOp::kAdd, y.data(), a.data(), 4, row.data(), 2, 4);
  EXPECT_EQ(y, (std::vector<float>{11, 22, 13, 24}));
  binary_forward<float>(BinaryOp::kMul, y.data(), one.data(), 1, a.data(), 4, 4);
  EXPECT_EQ(y, (std::vector<float>{5, 10, 15, 20}));
}

}  // namespace
}  // namespace graphward::kernels::cpu

namespace graphward {
namespace {

TEST(Philox, MatchesTheRandom123KnownAnswer) {
  // Random123's kat_vectors: philox4x32 10, counter 0, key 0.
  const auto w = philox4x32(0, 0);
  EXPECT_EQ(w[0], 0x6627e8d5u);
  EXPECT_EQ(w[1], 0xe169c58du);
  EXPECT_EQ(w[2], 0xbc57ac4cu);
  EXPECT_EQ(w[3], 0x9b00dbd8u);
}

TEST(Philox, UniformAndNormalAreFiniteAndInRange) {
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const double u = philox_uniform(99, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_TRUE(std::isfinite(philox_normal(99, i)));
  }
}

}  // namespace
}  // namespace graphward
