#pragma once
#include <chrono>
#include <thread>
// Helpers shared by the tests: GPU skips, error measures, finite-difference gradient checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "graphward/graphward.h"

#define GW_REQUIRE_GPU()                                                                   \
  do {                                                                                     \
    if (!::graphward::cuda_available()) {                                                  \
      GTEST_SKIP() << "no usable CUDA device: " << ::graphward::cuda_unavailable_reason(); \
    }                                                                                      \
  } while (0)

// Expects `stmt` to throw graphward::Error whose message contains every one of `parts`.
#define GW_EXPECT_ERROR(stmt, ...)                                            \
  do {                                                                        \
    try {                                                                     \
      stmt;                                                                   \
      ADD_FAILURE() << "expected graphward::Error from: " #stmt;              \
    } catch (const ::graphward::Error& e) {                                   \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__}) { \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)        \
            << "message lacks \"" << part << "\": " << e.what();              \
      }                                                                       \
    }                                                                         \
  } while (0)

namespace graphward::testing {

// A fresh directory for the running test's files, under the system's temporary directory and
// named by `prefix` and the test; removed with this object.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix)
      : dir_(std::filesystem::temp_directory_path() /
             (prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

// The tensor's values as doubles (any floating dtype, any device; bfloat16 widened exactly).
inline std::vector<double> values(const Tensor& t) {
  if (t.dtype() == DType::kFloat64) return t.to_vector<double>();
  if (t.dtype() == DType::kBFloat16) {
    const std::vector<bf16> h = t.to_vector<bf16>();
    std::vector<double> out(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) out[i] = h[i].to_float();
    return out;
  }
  const std::vector<float> f = t.to_vector<float>();
  return std::vector<double>(f.begin(), f.end());
}
// The tensor's values rounded to bfloat16 (as a cast rounds them), as doubles.
inline std::vector<double> bf16_values(const Tensor& t) {
  NoGradGuard no_grad;
  return values(cast(t.detach(), DType::kBFloat16));
}

// Rows [start, start + n) of an int32 tensor's leading dimension (ids or targets), as a new tensor
// of [n, the rest] on its device.
inline Tensor narrow_rows(const Tensor& ids, std::int64_t start, std::int64_t n) {
  const std::vector<std::int32_t> v = ids.to_vector<std::int32_t>();
  const std::int64_t cols = ids.numel() / ids.size(0);
  return from_vector(std::vector<std::int32_t>(v.begin() + start * cols,
                                               v.begin() + (start + n) * cols),
                     {n, cols}, ids.device());
}

// ‖out − ref‖ / ‖ref‖ (absolute norm when ref is 0); infinity on NaN or a size mismatch.
inline double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double rel_error(const Tensor& out, const Tensor& ref) {
  if (out.shape() != ref.shape()) return INFINITY;
  return rel_error(values(out), values(ref));
}

// Keeps the current stream of cuda:0 busy for several milliseconds (a chain of 2048³ GEMMs): the
// other side of every race test, so that a missing wait reads scribbled or NaN memory.
// A GPU test fixture: the test is skipped, with the reason, where no CUDA device is usable.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override { GW_REQUIRE_GPU(); }
};

// ... and every new allocation is filled with NaN for the test (debug::set_poison_new_memory), so
// an element a kernel forgot to write, or memory reused too early, fails the comparison.
class PoisonedCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GW_REQUIRE_GPU();
    debug::set_poison_new_memory(true);
  }
  void TearDown() override { debug::set_poison_new_memory(false); }
};

#if GRAPHWARD_HAS_CUDA
// Holds `stream` for `ms` milliseconds with a host function: later work on it starts only after,
// while every other stream runs freely (no GPU resources are held, unlike busy_work()).
inline void stall(cudaStream_t stream, int ms) {
  auto* wait = new int(ms);
  GW_CUDA_CHECK(cudaLaunchHostFunc(
      stream,
      [](void* p) {
        std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(p)));
        delete static_cast<int*>(p);
      },
      wait));
}

// The bytes of the CUDA pool of `device` in use once everything is done and graphward's block
// cache is empty (the cache keeps freed blocks allocated: Note [Block cache]).
inline std::uint64_t pool_bytes_in_use(Device device = Device::cuda(0)) {
  DeviceGuard guard(device);
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  empty_cache(device);
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  cudaMemPool_t pool = nullptr;
  GW_CUDA_CHECK(cudaDeviceGetMemPool(&pool, device.index));
  std::uint64_t used = 0;
  GW_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  return used;
}
#endif

inline Tensor busy_work(int gemms = 6) {
  const TensorOptions f32{DType::kFloat32, Device::cuda(0)};
  Tensor x = mul(randn({2048, 2048}, 77, f32), 1.0 / 45.0);
  Tensor y = x;
  for (int i = 0; i < gemms; ++i) y = matmul(y, x);
  return y;
}

using Inputs = std::vector<Tensor>;
using ForwardFn = std::function<Tensor(const Inputs&)>;
// Returns the gradient of each input for the given grad_out (undefined where not computed).
using BackwardFn = std::function<Inputs(const Tensor& grad_out, const Inputs&)>;

// Checks an op's backward against central finite differences of L = Σ forward(x) ⊙ R for a random
// R, on float64 CPU inputs. Returns the worst relative error over the inputs.
inline double gradcheck_error(const ForwardFn& forward, const BackwardFn& backward, Inputs inputs,
                              std::uint64_t seed = 1234) {
  const Tensor out = forward(inputs);
  const Tensor r = randn(out.shape(), seed, {DType::kFloat64});
  const std::vector<double> rv = r.to_vector<double>();
  auto loss = [&](const Inputs& in) {
    const std::vector<double> o = forward(in).to_vector<double>();
    double l = 0;
    for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * rv[i];
    return l;
  };
  const Inputs grads = backward(r, inputs);
  double worst = 0;
  const double h = 1e-6;
  for (std::size_t which = 0; which < inputs.size(); ++which) {
    if (!grads[which].defined()) continue;
    std::vector<double> numeric(static_cast<std::size_t>(inputs[which].numel()));
    for (std::size_t j = 0; j < numeric.size(); ++j) {
      double* p = inputs[which].data<double>() + j;
      const double saved = *p;
      *p = saved + h;
      const double lp = loss(inputs);
      *p = saved - h;
      const double lm = loss(inputs);
      *p = saved;
      numeric[j] = (lp - lm) / (2 * h);
    }
    worst = std::max(worst, rel_error(grads[which].to_vector<double>(), numeric));
  }
  return worst;
}

inline TensorOptions f64() {
  return {DType::kFloat64, Device::cpu()};
}

// Autocast(parameters) (engine/ops/autocast.h) on `device`: the parameters cast at the scope's start —
// each once, a repeated one and what is not a float32 parameter skipped — and no cast after; the
// loss and the gradients bitwise those of the same model cast lazily, at first use.
inline void expect_upfront_casts_as_lazy_ones(Device device) {
  const TensorOptions o{DType::kFloat32, device};
  auto param = [&](const Shape& shape, std::uint64_t seed) {
    return mul(randn(shape, seed, o), 0.3).detach().set_requires_grad(true);
  };
  struct Model {
    Tensor w1, b1, w2, frozen;
  };
  const Model lazy{param({16, 8}, 1), param({16}, 2), param({4, 16}, 3), randn({4, 4}, 4, o)};
  const Model upfront{param({16, 8}, 1), param({16}, 2), param({4, 16}, 3), randn({4, 4}, 4, o)};
  const Tensor x = randn({6, 8}, 5, o);
  auto forward = [&](const Model& m) {
    const Tensor h = linear(linear(x, m.w1, m.b1, Activation::kGelu), m.w2);
    return sum(matmul(h, m.frozen));
  };
  {  // a first forward of these shapes (its GEMMs' algorithms chosen), then the two compared
    NoGradGuard no_grad;
    Autocast scope;
    (void)forward(lazy);
  }
  Tensor lazy_loss, upfront_loss;
  {
    Autocast scope;
    lazy_loss = forward(lazy);
    EXPECT_EQ(scope.parameter_casts(), 3u);
  }
  {
    Autocast scope({upfront.w1, upfront.b1, upfront.w2, upfront.w1, upfront.frozen, x});
    EXPECT_EQ(scope.parameter_casts(), 3u) << "w1, b1, w2 at once; w1 again and the rest skipped";
    upfront_loss = forward(upfront);
    EXPECT_EQ(scope.parameter_casts(), 3u) << "no cast after";
  }
  backward(lazy_loss);
  backward(upfront_loss);
  EXPECT_EQ(values(upfront_loss), values(lazy_loss));
  const Tensor* got[] = {&upfront.w1, &upfront.b1, &upfront.w2};
  const Tensor* want[] = {&lazy.w1, &lazy.b1, &lazy.w2};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(got[i]->grad().dtype(), DType::kFloat32);
    EXPECT_EQ(values(got[i]->grad()), values(want[i]->grad())) << "parameter " << i;
  }
}

// Note [Autocast]: a linear layer's float32 parameters get float32 gradients straight from its
// bfloat16 GEMM and column sum — the node's edges are the parameters themselves (no cast between),
// and the sums are not rounded to bfloat16: within float32 rounding of the exact sums of the
// bfloat16 operands' products.
// cross_entropy over the first `classes` columns (a padded vocabulary): bitwise the loss and the
// gradient of cross_entropy of those columns copied out (narrow), the padding columns' gradient
// 0, and left as it was where a second backward accumulates — rows of a warp (40 columns) and of
// a block (3000), in `dtype`.
inline void expect_cross_entropy_over_classes_as_over_their_copy(Device device, DType dtype) {
  for (const auto& [cols, classes] :
       {std::pair<std::int64_t, std::int64_t>{40, 33}, {40, 40}, {3000, 2900}}) {
    const Tensor x0 = cast(mul(randn({6, cols}, 31, {DType::kFloat32, device}), 3.0), dtype);
    std::vector<std::int32_t> t(6);
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = static_cast<std::int32_t>((i * 7919 + 3) % static_cast<std::size_t>(classes));
    }
    const Tensor targets = from_vector(t, {6}, device);
    const Tensor x = x0.detach().set_requires_grad(true), xn = x0.detach().set_requires_grad(true);
    const Tensor loss = cross_entropy(x, targets, classes);
    const Tensor ref = cross_entropy(narrow(xn, 0, classes), targets);
    EXPECT_EQ(loss.to_vector<float>(), cast(ref, DType::kFloat32).to_vector<float>())
        << cols << " columns, " << classes << " classes";
    backward(loss);
    backward(ref);
    const std::vector<float> g = cast(x.grad(), DType::kFloat32).to_vector<float>();
    const std::vector<float> gn = cast(xn.grad(), DType::kFloat32).to_vector<float>();
    for (std::int64_t r = 0; r < 6; ++r) {
      for (std::int64_t j = 0; j < cols; ++j) {
        const auto at = static_cast<std::size_t>(r * cols + j);
        ASSERT_EQ(g[at], gn[at]) << cols << " columns, " << classes << " classes: [" << r << ", "
                                 << j << "]";
        if (j >= classes) {
          ASSERT_EQ(g[at], 0.f);
        }
      }
    }
    // A second backward accumulates: the classes' gradient doubles, the padding's stays 0.
    backward(cross_entropy(x, targets, classes));
    const std::vector<float> g2 = cast(x.grad(), DType::kFloat32).to_vector<float>();
    for (std::size_t at = 0; at < g2.size(); ++at) {
      ASSERT_EQ(g2[at], cast(cast(from_vector(std::vector<float>{2 * g[at]}, {1}), dtype),
                             DType::kFloat32).to_vector<float>()[0]) << at;
    }
  }
  const Tensor x = randn({2, 5}, 3, {DType::kFloat32, device});
  const Tensor t = from_vector(std::vector<std::int32_t>{1, 2}, {2}, device);
  GW_EXPECT_ERROR((void)cross_entropy(x, t, 0), "cross_entropy", "classes is 0",
                  "expected 1 to 5");
  GW_EXPECT_ERROR((void)cross_entropy(x, t, 6), "cross_entropy", "classes is 6");
}

inline void expect_linear_parameter_gradients_float32(Device device) {
  const TensorOptions o{DType::kFloat32, device};
  const Tensor w = mul(randn({24, 40}, 21, o), 0.3).detach().set_requires_grad(true);
  const Tensor b = mul(randn({24}, 22, o), 0.3).detach().set_requires_grad(true);
  const Tensor x = randn({64, 40}, 23, o), r = randn({64, 24}, 24, o);
  Tensor y, loss;
  {
    Autocast scope;
    y = linear(x, w, b);
    loss = sum(mul(y, r));  // float32 math: y's gradient is r rounded to bfloat16
  }
  ASSERT_EQ(y.dtype(), DType::kBFloat16);
  const std::vector<InputMeta>& in = y.grad_fn()->inputs();
  ASSERT_EQ(in.size(), 3u);
  for (int i : {1, 2}) {
    EXPECT_TRUE(in[i].edge.leaf.defined() && !in[i].edge.node)
        << "input " << i << ": an edge to the parameter itself";
    EXPECT_EQ(in[i].dtype, DType::kFloat32) << "input " << i;
  }
  backward(loss);
  ASSERT_EQ(w.grad().dtype(), DType::kFloat32);
  ASSERT_EQ(b.grad().dtype(), DType::kFloat32);
  const std::vector<double> xs = bf16_values(x), gs = bf16_values(r);
  std::vector<double> dw(24 * 40, 0.0), db(24, 0.0);
  for (int row = 0; row < 64; ++row) {
    for (int i = 0; i < 24; ++i) {
      const double g = gs[static_cast<std::size_t>(row * 24 + i)];
      db[static_cast<std::size_t>(i)] += g;
      for (int j = 0; j < 40; ++j) {
        dw[static_cast<std::size_t>(i * 40 + j)] += g * xs[static_cast<std::size_t>(row * 40 + j)];
      }
    }
  }
  EXPECT_LT(rel_error(values(w.grad()), dw), 1e-6);
  EXPECT_LT(rel_error(values(b.grad()), db), 1e-6);
  EXPECT_GT(rel_error(bf16_values(w.grad()), values(w.grad())), 1e-4)
      << "the weight's gradient is not rounded to bfloat16";
}

// Note [Autocast]: under the scope a layer norm of float32 operands returns its normalized output
// in bfloat16 — bitwise the float32 op's output cast — and its backward takes that output's
// bfloat16 gradient: bitwise the float32 op's backward of the gradient widened. Rows of a warp
// (48 columns) and of a block (1100), one slice of rows for the parameters' sums and several.
inline void expect_autocast_layer_norm_output_bf16(Device device) {
  const TensorOptions o{DType::kFloat32, device};
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{6, 48}, {300, 48},
                                   {5, 1100}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    auto leaf = [&](const Shape& shape, std::uint64_t seed) {
      return randn(shape, seed, o).set_requires_grad(true);
    };
    const Tensor x = leaf({rows, cols}, 31), r = leaf({cols}, 32), w = leaf({cols}, 33),
                 b = leaf({cols}, 34);
    const Tensor x2 = x.detach().set_requires_grad(true), r2 = r.detach().set_requires_grad(true),
                 w2 = w.detach().set_requires_grad(true), b2 = b.detach().set_requires_grad(true);
    const Tensor g = cast(randn({rows, cols}, 35, o), DType::kBFloat16);
    AddLayerNorm mixed;
    Tensor alone;
    {
      Autocast scope;
      mixed = add_layer_norm(x, r, w, b);
      alone = layer_norm(mixed.sum, w, b);
    }
    ASSERT_EQ(mixed.sum.dtype(), DType::kFloat32);
    ASSERT_EQ(mixed.normed.dtype(), DType::kBFloat16);
    ASSERT_EQ(alone.dtype(), DType::kBFloat16);
    const AddLayerNorm ref = add_layer_norm(x2, r2, w2, b2);
    const Tensor ref_alone = layer_norm(ref.sum, w2, b2);
    EXPECT_EQ(values(mixed.sum), values(ref.sum));
    EXPECT_EQ(values(mixed.normed), bf16_values(ref.normed)) << "add_layer_norm's output";
    EXPECT_EQ(values(alone), bf16_values(ref_alone)) << "layer_norm's output";
    backward({mixed.normed, alone}, {g, g});
    const Tensor g32 = cast(g, DType::kFloat32);
    backward({ref.normed, ref_alone}, {g32, g32});
    const Tensor* got[] = {&x, &r, &w, &b};
    const Tensor* want[] = {&x2, &r2, &w2, &b2};
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(got[i]->grad().dtype(), DType::kFloat32) << "operand " << i;
      EXPECT_EQ(values(got[i]->grad()), values(want[i]->grad())) << "operand " << i;
    }
  }
}

// Note [Autocast]: add_layer_norm of float32 x and a bfloat16 residual (a matrix product's output)
// widens the residual as it reads it — one add node whose second input is the bfloat16 tensor
// itself, no cast node between — with the bits of the residual cast to float32 first, and gives
// the residual the gradient that cast's backward would (the float32 one rounded to bfloat16).
// Rows of a warp (48 columns) and of a block (1100: the add a kernel of its own), a residual of
// x's shape and one repeated over the rows.
inline void expect_autocast_residual_widened_as_read(Device device) {
  const TensorOptions o{DType::kFloat32, device};
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{6, 48}, {300, 48},
                                   {5, 1100}}) {
    for (const bool repeated : {false, true}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) +
                   (repeated ? ", residual repeated" : ""));
      const Shape r_shape = repeated ? Shape{cols} : Shape{rows, cols};
      auto leaf = [&](const Shape& shape, std::uint64_t seed) {
        return randn(shape, seed, o).set_requires_grad(true);
      };
      const Tensor x = leaf({rows, cols}, 41), h = leaf(r_shape, 42), w = leaf({cols}, 43),
                   b = leaf({cols}, 44);
      const Tensor x2 = x.detach().set_requires_grad(true),
                   h2 = h.detach().set_requires_grad(true),
                   w2 = w.detach().set_requires_grad(true),
                   b2 = b.detach().set_requires_grad(true);
      const Tensor g = cast(randn({rows, cols}, 45, o), DType::kBFloat16);
      const Tensor g_sum = randn({rows, cols}, 46, o);
      AddLayerNorm mixed, ref;
      Tensor hb;
      {
        Autocast scope;
        hb = cast(h, DType::kBFloat16);  // a bfloat16 residual with a producer
        mixed = add_layer_norm(x, hb, w, b);
        ref = add_layer_norm(x2, cast(cast(h2, DType::kBFloat16), DType::kFloat32), w2, b2);
      }
      ASSERT_EQ(mixed.sum.dtype(), DType::kFloat32);
      ASSERT_EQ(mixed.normed.dtype(), DType::kBFloat16);
      ASSERT_TRUE(mixed.sum.grad_fn());
      EXPECT_EQ(mixed.sum.grad_fn()->name(), "add");
      const std::vector<InputMeta>& in = mixed.sum.grad_fn()->inputs();
      ASSERT_EQ(in.size(), 2u);
      EXPECT_EQ(in[1].dtype, DType::kBFloat16) << "the residual read as it is, not widened first";
      EXPECT_EQ(in[1].edge.node, hb.grad_fn()) << "no cast node between the residual and the add";
      EXPECT_EQ(values(mixed.sum), values(ref.sum));
      EXPECT_EQ(values(mixed.normed), values(ref.normed));
      backward({mixed.normed, mixed.sum}, {g, g_sum});
      backward({ref.normed, ref.sum}, {g, g_sum});
      const Tensor* got[] = {&x, &h, &w, &b};
      const Tensor* want[] = {&x2, &h2, &w2, &b2};
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(got[i]->grad().defined()) << "operand " << i;
        EXPECT_EQ(values(got[i]->grad()), values(want[i]->grad())) << "operand " << i;
      }
      EXPECT_EQ(values(h.grad()), bf16_values(h.grad())) << "the residual's gradient is rounded";
    }
  }
}

// One model trained twice over the same batches: the `graphed` side's backward through a
// BackwardGraph inside a StepArena's steps, the other side's the plain backward. Each of `steps`
// steps writes its batch into the static inputs (set_batch(s), gradients off), then asserts the
// two sides' gradients (grads(graphed)) bitwise equal; one capture, every later step a replay.
inline void expect_replayed_grads_equal_eager(
    Device device, int steps, const std::function<void(int)>& set_batch,
    const std::function<Tensor(bool graphed)>& loss,
    const std::function<std::vector<std::vector<float>>(bool graphed)>& grads) {
  StepArena arena(device);
  BackwardGraph bw(device);
  for (int s = 0; s < steps; ++s) {
    {
      NoGradGuard no_grad;
      set_batch(s);
    }
    {
      StepScope step(arena);
      bw.backward(loss(true), GradWrite::kOverwrite);
      arena.record_step_end(current_stream(device));
    }
    backward(loss(false), {.grad_write = GradWrite::kOverwrite});
    ASSERT_EQ(grads(true), grads(false)) << "step " << s << "; " << bw.stats().reason;
  }
  EXPECT_EQ(bw.stats().counters.captures, 1u) << bw.stats().reason;
  EXPECT_EQ(bw.stats().counters.replays, static_cast<std::uint64_t>(steps - 1));
}

}  // namespace graphward::testing
