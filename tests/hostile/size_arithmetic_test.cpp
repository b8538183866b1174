// Hostile input, by class: sizes, windows, dimensions and options near the ends of int64 (and
// negative, zero, one) fed to every public function that takes a size — creation, views, shape
// ops and their op-level backwards, convolution and pooling options. Each call either returns a
// consistent tensor or throws a graphward::Error; nothing else escapes, nothing wraps (the
// sanitizer build of scripts/test.sh turns any overflow or out-of-bounds access into a failure),
// and the library works afterwards.
#include <climits>
#include <functional>
#include <sstream>

#include "test_util.h"

namespace graphward {
namespace {

const std::vector<std::int64_t> kHostile = {INT64_MIN,
                                            INT64_MIN + 1,
                                            -(std::int64_t{1} << 32),
                                            -2,
                                            -1,
                                            0,
                                            1,
                                            2,
                                            3,
                                            (std::int64_t{1} << 31) - 1,
                                            std::int64_t{1} << 31,
                                            std::int64_t{1} << 32,
                                            std::int64_t{1} << 46,
                                            std::int64_t{1} << 62,
                                            INT64_MAX - 1,
                                            INT64_MAX};

// The host memory any one call may take during these tests: a size that passes every check but
// asks for gigabytes is refused as out of memory, quickly, instead of being allocated.
class SizeArithmetic : public ::testing::Test {
 protected:
  void SetUp() override {
    limit_ = host_memory_limit();
    set_host_memory_limit(host_bytes_in_use() + (std::size_t{64} << 20));
  }
  void TearDown() override {
    set_host_memory_limit(limit_);
    // Usable afterwards: an ordinary op and its backward.
    const Tensor x = ones({2, 3}).set_requires_grad(true);
    backward(sum(mul(x, 2.0)));
    EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(6, 2.f));
  }
  // Runs `call`, which returns the tensors it made (possibly none): it must either return
  // consistent tensors or throw a graphward::Error. Counts both outcomes.
  void attack(const std::string& what, const std::function<std::vector<Tensor>()>& call) {
    try {
      for (const Tensor& t : call()) {
        if (!t.defined()) continue;
        ASSERT_EQ(t.numel(), shape_numel(t.shape())) << what;
        ASSERT_GE(t.storage()->bytes(), t.nbytes()) << what;
        ASSERT_LE(t.nbytes(), std::size_t{64} << 20) << what;
      }
      ++accepted_;
    } catch (const Error& e) {
      ASSERT_FALSE(std::string(e.what()).empty()) << what;
      ++refused_;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": threw " << typeid(e).name() << " (" << e.what()
                    << "), not a graphward::Error";
    }
  }
  static std::string str(std::initializer_list<std::int64_t> v) {
    std::ostringstream os;
    for (std::int64_t x : v) os << x << ' ';
    return os.str();
  }
  std::size_t limit_ = 0;
  int accepted_ = 0, refused_ = 0;
};

// Every shape of one to three dimensions drawn from the hostile values.
std::vector<Shape> hostile_shapes() {
  std::vector<Shape> shapes;
  for (std::int64_t a : kHostile) {
    shapes.push_back({a});
    for (std::int64_t b : kHostile) {
      shapes.push_back({a, b});
      for (std::int64_t c : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, INT64_MAX,
                             std::int64_t{1} << 32, std::int64_t{-1}}) {
        shapes.push_back({a, b, c});
      }
    }
  }
  return shapes;
}

TEST_F(SizeArithmetic, CreationAndViewsRefuseShapesWhoseElementsOrBytesDoNotFit) {
  const Tensor x = ones({2, 6});
  for (const Shape& sh : hostile_shapes()) {
    const std::string s = shape_str(sh);
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32}) {
      attack("empty " + s, [&] { return std::vector<Tensor>{Tensor::empty(sh, {dt})}; });
      attack("zeros " + s, [&] { return std::vector<Tensor>{zeros(sh, {dt})}; });
    }
    attack("ones " + s, [&] { return std::vector<Tensor>{ones(sh)}; });
    attack("full " + s, [&] { return std::vector<Tensor>{full(sh, 2.0, {DType::kFloat64})}; });
    attack("randn " + s, [&] { return std::vector<Tensor>{randn(sh, 1, {DType::kBFloat16})}; });
    attack("uniform " + s, [&] { return std::vector<Tensor>{uniform(sh, 0, 1, 1)}; });
    attack("view " + s, [&] { return std::vector<Tensor>{x.view(sh)}; });
    attack("from_vector " + s,
           [&] { return std::vector<Tensor>{from_vector(std::vector<float>(12, 1.f), sh)}; });
    attack("from_storage " + s, [&] {
      return std::vector<Tensor>{Tensor::from_storage(x.storage(), sh, DType::kFloat32)};
    });
    attack("reshape " + s, [&] { return std::vector<Tensor>{reshape(x, sh)}; });
    attack("reshape_backward " + s, [&] {
      Tensor g;
      reshape_backward(x, sh, {&g});
      return std::vector<Tensor>{g};
    });
    attack("avg_pool2d_backward " + s, [&] {
      Tensor g;
      Shape four = sh;
      while (four.size() < 4) four.insert(four.begin(), 1);
      avg_pool2d_backward(ones({1, 1, 1, 1}), four, {.kernel = 1}, {&g});
      return std::vector<Tensor>{g};
    });
  }
  EXPECT_GT(accepted_, 0);
  EXPECT_GT(refused_, 0);
}

// Dimension indices: Tensor::size and the ops that take a dimension.
TEST_F(SizeArithmetic, DimensionIndicesNearTheEndsOfInt64AreRefused) {
  const Tensor x = ones({2, 3});
  for (std::int64_t d : kHostile) {
    attack("size " + str({d}), [&] {
      const std::int64_t n = x.size(d);
      EXPECT_TRUE(n == 2 || n == 3) << d;
      return std::vector<Tensor>{};
    });
  }
  EXPECT_EQ(accepted_, 4);  // -2, -1, 0, 1
}

// reshape with -1 beside every pair of hostile sizes (the inference divides by their product).
TEST_F(SizeArithmetic, ReshapeInfersNothingFromAProductThatDoesNotFit) {
  const Tensor x = ones({4, 4});
  for (std::int64_t a : kHostile) {
    for (std::int64_t b : kHostile) {
      for (const Shape& sh : {Shape{-1, a, b}, Shape{a, -1, b}, Shape{a, b, -1}, Shape{-1, a}}) {
        attack("reshape " + shape_str(sh), [&] { return std::vector<Tensor>{reshape(x, sh)}; });
      }
    }
  }
  EXPECT_GT(accepted_, 0);
}

// Every window [start, start + length) of narrow and narrow_backward, with every hostile start and
// length, on inputs whose last dimension is 1, 5 and 2^31 (only its shape: narrow_backward).
TEST_F(SizeArithmetic, NarrowAndItsBackwardRefuseEveryWindowOutsideTheLastDimension) {
  const Tensor x = randn({2, 5}, 3);
  for (std::int64_t start : kHostile) {
    for (std::int64_t length : kHostile) {
      const std::string s = str({start, length});
      attack("narrow " + s, [&] {
        const Tensor y = narrow(x, start, length);
        EXPECT_TRUE(start >= 0 && length >= 1 && start + length <= 5) << s;
        return std::vector<Tensor>{y};
      });
      for (const Shape& in : {Shape{2, 5}, Shape{2, 1}, Shape{1, std::int64_t{1} << 31},
                              Shape{INT64_MAX}, Shape{2, -5}, Shape{}}) {
        attack("narrow_backward " + s + shape_str(in), [&] {
          Tensor g;
          const Shape out_shape{in.size() == 2 ? in[0] : 1, length > 0 && length < 8 ? length : 1};
          narrow_backward(ones(out_shape), in, start, length, {&g});
          return std::vector<Tensor>{g};
        });
      }
    }
  }
  // The windows that fit are exact.
  EXPECT_EQ(narrow(x, 4, 1).to_vector<float>(),
            (std::vector<float>{x.to_vector<float>()[4], x.to_vector<float>()[9]}));
}

// split_heads and its backward with every hostile sequence length and head count, and every
// hostile window; the backward also with hostile input shapes (only its shape is told).
TEST_F(SizeArithmetic, SplitHeadsAndItsBackwardRefuseEveryLayoutThatIsNotWholeSequencesAndHeads) {
  const Tensor x = randn({6, 12}, 5);
  for (std::int64_t a : kHostile) {
    for (std::int64_t b : kHostile) {
      const std::string s = str({a, b});
      attack("split_heads seq, heads " + s, [&] {
        const Tensor y = split_heads(x, a, b, 4, 4);
        EXPECT_TRUE(a >= 1 && 6 % a == 0 && b >= 1 && 4 % b == 0) << s;
        return std::vector<Tensor>{y};
      });
      attack("split_heads window " + s, [&] {
        const Tensor y = split_heads(x, 3, 1, a, b);
        EXPECT_TRUE(a >= 0 && b >= 1 && a + b <= 12) << s;
        return std::vector<Tensor>{y};
      });
      for (const Shape& in :
           {Shape{6, 12}, Shape{1, std::int64_t{1} << 31}, Shape{INT64_MAX, 4},
            Shape{INT64_MAX, INT64_MAX}, Shape{-6, 12}, Shape{6, -12}, Shape{72}, Shape{}}) {
        attack("split_heads_backward seq, heads " + s + shape_str(in), [&] {
          Tensor g;
          split_heads_backward(ones({4, 3, 2}), in, a, b, 0, 4, {&g});
          return std::vector<Tensor>{g};
        });
      }
    }
  }
  // A layout that fits is exact: the window's first head of the first sequence.
  const std::vector<float> xv = x.to_vector<float>(),
                           y = split_heads(x, 3, 2, 4, 4).to_vector<float>();
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 2), (std::vector<float>{xv[4], xv[5]}));
}

// Dimensions of transpose and concat, and the shapes concat_backward is told.
TEST_F(SizeArithmetic, DimensionsAndConcatShapesNearTheEndsOfInt64AreRefused) {
  const Tensor x = randn({2, 3}, 4);
  for (std::int64_t d0 : kHostile) {
    for (std::int64_t d1 : {std::int64_t{0}, std::int64_t{-1}, INT64_MIN, INT64_MAX}) {
      attack("transpose " + str({d0, d1}),
             [&] { return std::vector<Tensor>{transpose(x, d0, d1)}; });
      attack("transpose_backward " + str({d0, d1}), [&] {
        Tensor g;
        transpose_backward(x, d0, d1, {&g});
        return std::vector<Tensor>{g};
      });
    }
    attack("concat " + str({d0}), [&] { return std::vector<Tensor>{concat({x, x}, d0)}; });
    for (std::int64_t size : kHostile) {
      attack("concat_backward " + str({d0, size}), [&] {
        Tensor g0, g1;
        std::vector<GradSlot> slots{{&g0}, {&g1}};
        // 6 - size, wrapped (defined in unsigned arithmetic): the sizes add up to 6 modulo 2^64.
        const auto rest = static_cast<std::int64_t>(6u - static_cast<std::uint64_t>(size));
        concat_backward(ones({2, 6}), {Shape{2, size}, Shape{2, rest}}, d0, slots);
        return std::vector<Tensor>{g0, g1};
      });
      attack("concat_backward sum " + str({d0, size}), [&] {
        Tensor g0, g1;
        std::vector<GradSlot> slots{{&g0}, {&g1}};
        concat_backward(ones({2, 6}), {Shape{2, size}, Shape{2, size}}, d0, slots);
        return std::vector<Tensor>{g0, g1};
      });
    }
  }
  EXPECT_GT(accepted_, 0);
}

// Convolution and pooling options: stride, padding and kernel from the hostile values.
TEST_F(SizeArithmetic, ConvolutionAndPoolingOptionsNearTheEndsOfInt64AreRefused) {
  const Tensor x = randn({1, 1, 4, 4}, 5), w = randn({1, 1, 3, 3}, 6);
  for (std::int64_t stride : kHostile) {
    for (std::int64_t padding : kHostile) {
      const std::string s = str({stride, padding});
      attack("conv2d " + s, [&] {
        return std::vector<Tensor>{conv2d(x, w, Tensor(), {.stride = stride, .padding = padding})};
      });
      attack("conv2d_backward " + s, [&] {
        Tensor gx;
        conv2d_backward(ones({1, 1, 2, 2}), x, w, {.stride = stride, .padding = padding}, {&gx},
                        {});
        return std::vector<Tensor>{gx};
      });
      for (std::int64_t kernel :
           {std::int64_t{1}, std::int64_t{2}, INT64_MAX, INT64_MIN, std::int64_t{1} << 62}) {
        const Pool2dOptions o{.kernel = kernel, .stride = stride, .padding = padding};
        attack("max_pool2d " + s, [&] { return std::vector<Tensor>{max_pool2d(x, o)}; });
        attack("avg_pool2d " + s, [&] { return std::vector<Tensor>{avg_pool2d(x, o)}; });
        attack("avg_pool2d_backward " + s, [&] {
          Tensor g;
          avg_pool2d_backward(ones({1, 1, 2, 2}), {1, 1, 4, 4}, o, {&g});
          return std::vector<Tensor>{g};
        });
      }
    }
  }
  EXPECT_GT(accepted_, 0);
}

// The examples the class was found with, each named.
TEST_F(SizeArithmetic, TheFoundCasesAreRefusedByName) {
  GW_EXPECT_ERROR(zeros({std::int64_t{1} << 62}), "float32[4611686018427387904]", "bytes");
  const Tensor x = ones({2, 3});
  GW_EXPECT_ERROR(narrow(x, INT64_MAX, 1), "narrow", "window", "start + length <= 3");
  GW_EXPECT_ERROR(narrow(x, 1, INT64_MAX), "narrow", "window");
  GW_EXPECT_ERROR(reshape(x, {-1, std::int64_t{1} << 32, std::int64_t{1} << 32}), "reshape",
                  "int64");
  Tensor g;
  GW_EXPECT_ERROR(narrow_backward(ones({2, 1}), {2, 3}, INT64_MAX, 1, {&g}), "narrow_backward",
                  "window");
  EXPECT_FALSE(g.defined());
}

}  // namespace
}  // namespace graphward
