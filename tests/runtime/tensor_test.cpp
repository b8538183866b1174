// Tensors on the CPU: creation, shapes, dtypes, copies, seeded random numbers, versions.
#include <algorithm>
#include <random>
#include <set>

#include "test_util.h"

namespace graphward {
namespace {
using testing::values;

TEST(TensorCpu, CreationFillsValues) {
  EXPECT_EQ(values(zeros({2, 3})), std::vector<double>(6, 0.0));
  EXPECT_EQ(values(ones({4})), std::vector<double>(4, 1.0));
  EXPECT_EQ(values(full({2, 2}, -3.5, {DType::kFloat64})), std::vector<double>(4, -3.5));
  const Tensor t = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_EQ(t.shape(), Shape({3, 2}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(-1), 2);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.str(), "float32[3, 2] on cpu");
}

// Note [Small shapes]: Shape keeps up to kInline dimensions inside itself and the rest on the heap;
// either way it behaves as std::vector<std::int64_t>. Random edits — push, pop, insert (one,
// several, a range of its own dimensions), erase, resize, copies and moves both ways, across the
// inline limit in both directions — applied to a Shape and to a vector side by side leave them
// equal.
TEST(TensorCpu, AShapeBehavesAsAVectorOfItsDimensionsInlineAndOnTheHeap) {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 200; ++trial) {
    Shape s;
    std::vector<std::int64_t> v;
    for (int step = 0; step < 60; ++step) {
      const auto pick = [&](std::size_t n) {
        return n == 0 ? 0 : static_cast<std::size_t>(rng() % (n + 1));
      };
      const std::int64_t x = static_cast<std::int64_t>(rng() % 1000) - 500;
      switch (rng() % 10) {
        case 0:
        case 1:
          s.push_back(x);
          v.push_back(x);
          break;
        case 2:
          if (!v.empty()) {
            s.pop_back();
            v.pop_back();
          }
          break;
        case 3: {
          const std::size_t at = pick(v.size());
          EXPECT_EQ(*s.insert(s.begin() + at, x), x);
          v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), x);
          break;
        }
        case 4: {
          const std::size_t at = pick(v.size()), n = rng() % 4;
          s.insert(s.begin() + at, n, x);
          v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), n, x);
          break;
        }
        case 5: {  // a range of its own dimensions, which the insertion may move
          const std::size_t at = pick(v.size()), from = pick(v.size()),
                            to = from + pick(v.size() - from);
          const std::vector<std::int64_t> range(v.begin() + static_cast<std::ptrdiff_t>(from),
                                                v.begin() + static_cast<std::ptrdiff_t>(to));
          s.insert(s.begin() + at, s.begin() + from, s.begin() + to);
          v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), range.begin(), range.end());
          break;
        }
        case 6:
          if (!v.empty()) {
            const std::size_t from = pick(v.size() - 1), to = from + pick(v.size() - from);
            s.erase(s.begin() + from, s.begin() + to);
            v.erase(v.begin() + static_cast<std::ptrdiff_t>(from),
                    v.begin() + static_cast<std::ptrdiff_t>(to));
          }
          break;
        case 7: {
          const std::size_t n = rng() % 10;
          s.resize(n, x);
          v.resize(n, x);
          break;
        }
        case 8: {  // copies and moves, each way
          Shape copy = s;
          Shape moved = std::move(copy);
          EXPECT_TRUE(copy.empty());
          s = Shape{};
          s = moved;
          Shape other{1, 2, 3, 4, 5, 6, 7, 8};
          other = std::move(moved);
          s = std::move(other);
          break;
        }
        default: {
          Shape from_vector = v;  // the conversions
          const std::vector<std::int64_t> back = s;
          EXPECT_EQ(back, v);
          EXPECT_EQ(from_vector, s);
          break;
        }
      }
      ASSERT_EQ(s.size(), v.size()) << "trial " << trial << " step " << step;
      ASSERT_TRUE(std::equal(s.begin(), s.end(), v.begin(), v.end()))
          << "trial " << trial << " step " << step << ": " << shape_str(s);
      ASSERT_EQ(s == v, true);
      ASSERT_GE(s.capacity(), std::max<std::size_t>(s.size(), Shape::kInline));
    }
  }
  // Ordered as vectors are; shape_str and the numel checks take it.
  EXPECT_LT(Shape({2, 3}), Shape({2, 4}));
  EXPECT_LT(Shape({2}), Shape({2, 0}));
  EXPECT_EQ(shape_str(Shape{1, 2, 3, 4, 5, 6, 7}), "[1, 2, 3, 4, 5, 6, 7]");
  EXPECT_EQ(shape_numel(Shape{2, 3, 1, 1, 1, 1, 1, 2}), 12);
  EXPECT_THROW((void)Shape({1}).at(1), std::out_of_range);
}

TEST(TensorCpu, ScalarTensorHasOneElement) {
  const Tensor s = full({}, 2.5);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 2.5);
}

TEST(TensorCpu, EmptyShapesAreAllowedForCreation) {
  const Tensor e = zeros({0, 5});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0u);
  EXPECT_TRUE(e.to_vector<float>().empty());
}

TEST(TensorCpu, CopiesAreIndependentAndHandlesShare) {
  const Tensor a = from_vector(std::vector<float>{1, 2, 3}, {3});
  const Tensor copy = a.clone();
  const Tensor handle = a;
  a.data<float>()[0] = 9;
  EXPECT_EQ(values(copy)[0], 1.0);
  EXPECT_EQ(values(handle)[0], 9.0);
  EXPECT_TRUE(handle.is_same(a));
  EXPECT_FALSE(copy.is_same(a));
}

TEST(TensorCpu, VersionCounterIsSharedByHandles) {
  const Tensor a = zeros({2});
  const Tensor b = a;
  const auto v = a.version();
  b.bump_version();
  EXPECT_EQ(a.version(), v + 1);
}

TEST(TensorCpu, RandnIsSeededReproducibleAndStandardNormal) {
  const Tensor a = randn({100000}, 42), b = randn({100000}, 42), c = randn({100000}, 43);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  const std::vector<double> v = values(a);
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= v.size();
  for (double x : v) sq += (x - mean) * (x - mean);
  const double std = std::sqrt(sq / v.size());
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std, 1.0, 0.02);
  // The value of element i depends only on (seed, i), not on the shape or the dtype.
  EXPECT_EQ(values(randn({10, 10}, 42))[37], static_cast<double>(a.to_vector<float>()[37]));
  EXPECT_EQ(static_cast<float>(values(randn({50}, 42, {DType::kFloat64}))[3]),
            a.to_vector<float>()[3]);
}

TEST(TensorCpu, UniformStaysInItsHalfOpenInterval) {
  const std::vector<float> v = uniform({200000}, -1.0, 1.0, 7).to_vector<float>();
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  EXPECT_GE(*lo, -1.0f);
  EXPECT_LT(*hi, 1.0f);
  EXPECT_LT(*lo, -0.99f);
  EXPECT_GT(*hi, 0.99f);
  // A tiny interval where float rounding would otherwise land on `high`.
  for (float x : uniform({10000}, 1.0, 1.0 + 1e-9, 3).to_vector<float>())
    EXPECT_LT(x, 1.0f + 1e-6f);
  GW_EXPECT_ERROR(uniform({2}, 1.0, 1.0, 1), "uniform", "low < high");
}

TEST(TensorCpu, FromVectorChecksTheElementCount) {
  GW_EXPECT_ERROR(from_vector(std::vector<float>{1, 2, 3}, {2, 2}), "from_vector", "3 values",
                  "[2, 2]", "4");
}

TEST(TensorCpu, TypedAccessChecksTheDtype) {
  const Tensor t = zeros({2});
  GW_EXPECT_ERROR(t.data<double>(), "float32", "float64");
  GW_EXPECT_ERROR(t.to_vector<double>(), "to_vector", "float32");
}

TEST(TensorCpu, ShapeErrors) {
  GW_EXPECT_ERROR(zeros({2, -1}), "[2, -1]", "negative");
  GW_EXPECT_ERROR(zeros({2}).size(3), "dimension 3", "[2]");
  GW_EXPECT_ERROR(from_vector(std::vector<float>{1, 2}, {2}).item(), "item", "one element");
  GW_EXPECT_ERROR(Tensor().shape(), "undefined Tensor");
}

TEST(TensorCpu, PoisonedAllocationsAreNaN) {
  debug::set_poison_new_memory(true);
  const Tensor t = Tensor::empty({4});
  debug::set_poison_new_memory(false);
  for (double v : values(t)) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace graphward
