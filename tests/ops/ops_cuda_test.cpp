// Every CUDA op, forward and backward, against the CPU reference on fresh random inputs of several
// shapes (non-multiples of 32 included). New memory is poisoned with NaN, so an element a kernel
// forgot to write fails the comparison. Tolerances (‖out − ref‖ / ‖ref‖, fp32, TF32 off): 1e-5
// for elementwise ops and reductions, 1e-4 for GEMMs.
#include <tuple>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <thread>

#include "graphward/capture/stream_capture.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/engine/runtime/dnn.h"
#include "graphward/kernels/conv.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/gemm.h"
#include "graphward/kernels/reduce.h"
#include "graphward/kernels/shape.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::rel_error;

constexpr double kElementwiseTol = 1e-5;
constexpr double kGemmTol = 1e-4;
constexpr Device kGpu = Device::cuda(0);

class CudaOps : public testing::PoisonedCudaTest {
 protected:
  std::uint64_t seed_ = 1000;
  // A fresh random CPU tensor; its CUDA copy has the same values.
  Tensor rand(const Shape& s) { return randn(s, seed_++); }
};

Tensor gpu(const Tensor& t) {
  return t.to(kGpu);
}

// n floats of device memory and one more, so that a pointer one float in is 4 bytes off a
// 16-byte boundary with n floats after it (the float4 paths' misaligned runs).
std::unique_ptr<float, void (*)(float*)> device_array(std::size_t n) {
  float* p = nullptr;
  GW_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), (n + 1) * sizeof(float)));
  return {p, [](float* q) { GW_CUDA_CHECK_NOTHROW(cudaFree(q)); }};
}

// Backward on both devices in both slot modes: overwrite into a fresh (poisoned) tensor, and
// accumulate into a random tensor. `run(slots...)` calls the backward with the given slots.
template <int N, class RunCpu, class RunGpu>
void expect_backward_matches(const char* what, const std::array<Shape, N>& grad_shapes, double tol,
                             RunCpu run_cpu, RunGpu run_gpu) {
  for (bool accumulate : {false, true}) {
    std::array<Tensor, N> cpu_g, gpu_g;
    for (int i = 0; i < N; ++i) {
      if (accumulate) {
        cpu_g[i] = randn(grad_shapes[i], 500 + i);
        gpu_g[i] = gpu(cpu_g[i]);
      }
    }
    run_cpu(cpu_g, accumulate);
    run_gpu(gpu_g, accumulate);
    for (int i = 0; i < N; ++i) {
      ASSERT_TRUE(gpu_g[i].defined()) << what;
      EXPECT_TRUE(gpu_g[i].is_cuda());
      EXPECT_LT(rel_error(gpu_g[i], cpu_g[i]), tol)
          << what << ": gradient " << i << " (accumulate=" << accumulate << ")";
    }
  }
}

struct GemmShape {
  std::int64_t m, k, n;
};
const GemmShape kGemmShapes[] = {
    {1, 1, 1}, {7, 13, 5}, {33, 65, 31}, {128, 257, 96}, {300, 129, 513}};
// The cuDNN plan of a convolution, for failure messages.
std::string dnn_plan_for_test(const Shape& x, const Shape& w, const Conv2dOptions& o) {
#if GRAPHWARD_HAS_CUDNN
  const bool cl = o.channels_last;
  return dnn::conv2d_plan_description(
      kGpu, {.n = x[0], .c = x[cl ? 3 : 1], .h = x[cl ? 1 : 2], .w = x[cl ? 2 : 3], .k = w[0],
             .r = w[cl ? 1 : 2], .s = w[cl ? 2 : 3], .pad = o.padding, .stride = o.stride,
             .deterministic = o.deterministic, .nhwc = cl});
#else
  (void)x, (void)w, (void)o;
  return "no cuDNN";
#endif
}
// An NCHW shape ([N, C, H, W], or a weight's [K, C, R, S]) as channels last has it ([N, H, W, C],
// [K, R, S, C]).
Shape nhwc_shape(const Shape& s) {
  return {s[0], s[2], s[3], s[1]};
}
const Shape kElementwiseShapes[] = {{1}, {7, 13}, {33, 65}, {128, 257}, {1000, 1031}};

// Note [Checked sizes] on the device: a size that does not fit is refused before anything is
// allocated (not an out-of-memory error, no CUDA error left behind), and windows near the ends
// of int64 are refused as on the CPU.
TEST_F(CudaOps, SizesThatDoNotFitAreRefusedBeforeAnyAllocation) {
  const TensorOptions f32{DType::kFloat32, kGpu};
  GW_EXPECT_ERROR(zeros({std::int64_t{1} << 62}, f32), "float32[4611686018427387904]", "bytes");
  GW_EXPECT_ERROR(randn({std::int64_t{1} << 32, std::int64_t{1} << 32}, 1, f32), "int64");
  GW_EXPECT_ERROR(Tensor::empty({-1, 4}, f32), "negative dimension");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const Tensor x = randn({2, 5}, 2, f32);
  for (std::int64_t start : {INT64_MIN, std::int64_t{-1}, std::int64_t{4}, INT64_MAX}) {
    for (std::int64_t length : {INT64_MIN, std::int64_t{0}, std::int64_t{2}, INT64_MAX}) {
      GW_EXPECT_ERROR(narrow(x, start, length), "narrow", "window");
      Tensor g;
      GW_EXPECT_ERROR(narrow_backward(randn({2, 1}, 3, f32), {2, 5}, start, length, {&g}),
                      "narrow_backward");
      EXPECT_FALSE(g.defined());
    }
  }
  GW_EXPECT_ERROR(reshape(x, {-1, std::int64_t{1} << 32, std::int64_t{1} << 32}), "reshape",
                  "int64");
  EXPECT_EQ(narrow(x, 4, 1).to(Device::cpu()).to_vector<float>(),
            narrow(x.to(Device::cpu()), 4, 1).to_vector<float>());
}

TEST_F(CudaOps, MatmulForwardAndBackward) {
  for (const auto& s : kGemmShapes) {
    const Tensor a = rand({s.m, s.k}), b = rand({s.k, s.n}), dy = rand({s.m, s.n});
    EXPECT_LT(rel_error(matmul(gpu(a), gpu(b)), matmul(a, b)), kGemmTol)
        << s.m << "x" << s.k << "x" << s.n;
    const Tensor ga = gpu(a), gb = gpu(b), gdy = gpu(dy);
    auto make = [](const Tensor& dy_, const Tensor& a_, const Tensor& b_) {
      return [&dy_, &a_, &b_](std::array<Tensor, 2>& g, bool acc) {
        matmul_backward(dy_, a_, b_, {&g[0], acc}, {&g[1], acc});
      };
    };
    expect_backward_matches<2>("matmul_backward", {a.shape(), b.shape()}, kGemmTol, make(dy, a, b),
                               make(gdy, ga, gb));
  }
}

TEST_F(CudaOps, LinearForwardAndBackward) {
  for (const auto& s : kGemmShapes) {
    // x [m, k], weight [n, k], bias [n]
    const Tensor x = rand({s.m, s.k}), w = rand({s.n, s.k}), b = rand({s.n}), dy = rand({s.m, s.n});
    EXPECT_LT(rel_error(linear(gpu(x), gpu(w), gpu(b)), linear(x, w, b)), kGemmTol);
    EXPECT_LT(rel_error(linear(gpu(x), gpu(w)), linear(x, w)), kGemmTol);
    const Tensor gx = gpu(x), gw = gpu(w), gdy = gpu(dy);
    auto make = [](const Tensor& dy_, const Tensor& x_, const Tensor& w_) {
      return [&dy_, &x_, &w_](std::array<Tensor, 3>& g, bool acc) {
        linear_backward(dy_, x_, w_, {&g[0], acc}, {&g[1], acc}, {&g[2], acc});
      };
    };
    expect_backward_matches<3>("linear_backward", {x.shape(), w.shape(), b.shape()}, kGemmTol,
                               make(dy, x, w), make(gdy, gx, gw));
  }
}

TEST_F(CudaOps, BinaryOpsForEveryBroadcastForm) {
  struct Op {
    const char* name;
    Tensor (*forward)(const Tensor&, const Tensor&);
    void (*backward)(const Tensor&, const Tensor&, const Tensor&, GradSlot, GradSlot);
  };
  const Op ops[] = {
      {"add", add, add_backward}, {"sub", sub, sub_backward}, {"mul", mul, mul_backward}};
  const std::pair<Shape, Shape> shapes[] = {{{7, 13}, {7, 13}}, {{1000, 1031}, {1000, 1031}},
                                            {{33, 65}, {65}},   {{513, 257}, {1, 257}},
                                            {{31}, {300, 31}},  {{1, 1}, {1, 1}},
                                            // trailing dimensions (a transformer's positions)
                                            {{16, 32, 64}, {32, 64}}, {{5, 7, 3}, {5, 7, 3}},
                                            {{7, 33}, {3, 7, 33}}};
  for (const Op& op : ops) {
    for (const auto& [sa, sb] : shapes) {
      const Tensor a = rand(sa), b = rand(sb);
      const Tensor ref = op.forward(a, b);
      const Tensor dy = rand(ref.shape());
      EXPECT_LT(rel_error(op.forward(gpu(a), gpu(b)), ref), kElementwiseTol)
          << op.name << " " << shape_str(sa) << " " << shape_str(sb);
      const Tensor ga = gpu(a), gb = gpu(b), gdy = gpu(dy);
      auto make = [&op](const Tensor& dy_, const Tensor& a_, const Tensor& b_) {
        return [&op, &dy_, &a_, &b_](std::array<Tensor, 2>& g, bool acc) {
          op.backward(dy_, a_, b_, {&g[0], acc}, {&g[1], acc});
        };
      };
      expect_backward_matches<2>(op.name, {sa, sb}, kElementwiseTol, make(dy, a, b),
                                 make(gdy, ga, gb));
    }
  }
}

TEST_F(CudaOps, ScalarFormsAndScaleBackward) {
  for (const Shape& s : kElementwiseShapes) {
    const Tensor a = rand(s), dy = rand(s);
    EXPECT_LT(rel_error(add(gpu(a), 1.25), add(a, 1.25)), kElementwiseTol);
    EXPECT_LT(rel_error(sub(gpu(a), -3.0), sub(a, -3.0)), kElementwiseTol);
    EXPECT_LT(rel_error(mul(gpu(a), 0.375), mul(a, 0.375)), kElementwiseTol);
    const Tensor gdy = gpu(dy);
    expect_backward_matches<1>(
        "scale_backward", {s}, kElementwiseTol,
        [&](std::array<Tensor, 1>& g, bool acc) {
          scale_backward(dy, -0.5, {&g[0], acc});
        },
        [&](std::array<Tensor, 1>& g, bool acc) {
          scale_backward(gdy, -0.5, {&g[0], acc});
        });
  }
}

TEST_F(CudaOps, ActivationsForwardAndBackward) {
  struct Act {
    const char* name;
    Tensor (*forward)(const Tensor&);
    void (*backward)(const Tensor&, const Tensor&, GradSlot);
    bool reads_input;  // the backward reads x (GELU), not y
  };
  const Act acts[] = {{"relu", relu, relu_backward, false},
                      {"tanh", graphward::tanh, tanh_backward, false},
                      {"sigmoid", sigmoid, sigmoid_backward, false},
                      {"gelu", gelu, gelu_backward, true}};
  for (const Act& act : acts) {
    for (const Shape& s : kElementwiseShapes) {
      const Tensor x = mul(rand(s), 3.0), dy = rand(s);
      const Tensor out = act.forward(x);
      EXPECT_LT(rel_error(act.forward(gpu(x)), out), kElementwiseTol) << act.name << shape_str(s);
      // Both backends differentiate through the same tensor, so the comparison tests the backward
      // alone.
      const Tensor y = act.reads_input ? x : out;
      const Tensor gy = gpu(y), gdy = gpu(dy);
      expect_backward_matches<1>(
          act.name, {s}, kElementwiseTol,
          [&](std::array<Tensor, 1>& g, bool acc) {
            act.backward(dy, y, {&g[0], acc});
          },
          [&](std::array<Tensor, 1>& g, bool acc) {
            act.backward(gdy, gy, {&g[0], acc});
          });
    }
  }
}

// The kernels with a float4 path (relu forward and backward, gelu backward) read four float32
// elements a load where all their arrays are 16-byte aligned, and one at a time where any is not
// and past the last multiple of four; their grids are sized for the path taken. Each array 4 bytes
// off the boundary in turn, sizes around a multiple of four and past one grid's worth, both slot
// modes: the same bits as the aligned run, which is within the elementwise tolerance of the CPU
// kernel — and bitwise the CPU kernel's for ReLU, which is exact (NaN, -0 and +-inf among the
// inputs).
TEST_F(CudaOps, Float4KernelsGiveTheSameBitsWhetherOrNotTheirArraysAreSixteenByteAligned) {
  // out = f(in0, in1) (in1 unused by a forward); `exact`: bitwise the CPU kernel's.
  struct Kernel {
    const char* name;
    bool backward, exact;
    std::function<void(float*, const float*, const float*, std::int64_t, bool)> gpu, cpu;
  };
  const Kernel kernels_tested[] = {
      {"relu_forward", false, true,
       [](float* y, const float* x, const float*, std::int64_t n, bool) {
         kernels::relu_forward(y, x, n, cudaStreamLegacy);
       },
       [](float* y, const float* x, const float*, std::int64_t n, bool) {
         kernels::cpu::relu_forward(y, x, n);
       }},
      {"relu_backward", true, true,
       [](float* dx, const float* dy, const float* y, std::int64_t n, bool acc) {
         kernels::relu_backward(dx, dy, y, n, acc, cudaStreamLegacy);
       },
       [](float* dx, const float* dy, const float* y, std::int64_t n, bool acc) {
         kernels::cpu::relu_backward(dx, dy, y, n, acc);
       }},
      {"gelu_backward", true, false,
       [](float* dx, const float* dy, const float* x, std::int64_t n, bool acc) {
         kernels::gelu_backward(dx, dy, x, n, acc, cudaStreamLegacy);
       },
       [](float* dx, const float* dy, const float* x, std::int64_t n, bool acc) {
         kernels::cpu::gelu_backward(dx, dy, x, n, acc);
       }},
  };
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -0.f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (const Kernel& k : kernels_tested) {
    for (const std::int64_t n : {1, 3, 4, 5, 1031, 4096, 132 * 32 * 256 * 4 + 7}) {
      const auto size = static_cast<std::size_t>(n);
      std::vector<float> in0 = mul(rand({n}), 3.0).to_vector<float>();
      const std::vector<float> in1 = rand({n}).to_vector<float>(),
                               old = rand({n}).to_vector<float>();
      if (k.exact) {
        for (std::size_t i = 0; i < size; i += 97) in0[i] = specials[(i / 97) % 4];
      }
      auto out_mem = device_array(size), in0_mem = device_array(size), in1_mem = device_array(size);
      // A forward's arrays: out (y) and in0 (x); a backward's: out (dx), in0 (dy), in1 (saved).
      const int arrays = k.backward ? 3 : 2;
      for (const bool acc : {false, true}) {
        if (acc && !k.backward) continue;
        std::vector<float> want = old;
        k.cpu(want.data(), in0.data(), in1.data(), n, acc);
        std::vector<float> aligned;
        for (int off = 0; off <= arrays; ++off) {  // 0: all aligned; 1..3: one array misaligned
          float* d_out = out_mem.get() + (off == 1);
          float* d_in0 = in0_mem.get() + (off == 2);
          float* d_in1 = in1_mem.get() + (off == 3);
          const std::size_t bytes = size * sizeof(float);
          GW_CUDA_CHECK(cudaMemcpy(d_out, old.data(), bytes, cudaMemcpyHostToDevice));
          GW_CUDA_CHECK(cudaMemcpy(d_in0, in0.data(), bytes, cudaMemcpyHostToDevice));
          GW_CUDA_CHECK(cudaMemcpy(d_in1, in1.data(), bytes, cudaMemcpyHostToDevice));
          k.gpu(d_out, d_in0, d_in1, n, acc);
          GW_CUDA_CHECK(cudaGetLastError());
          std::vector<float> got(size);
          GW_CUDA_CHECK(cudaMemcpy(got.data(), d_out, bytes, cudaMemcpyDeviceToHost));
          if (off == 0) {
            aligned = got;
            if (k.exact) {  // a NaN's payload is the hardware's (the CPU keeps an operand's)
              std::size_t differ = 0;
              for (std::size_t i = 0; i < size; ++i) {
                const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
                differ += !both_nan && std::bit_cast<std::uint32_t>(got[i]) !=
                                           std::bit_cast<std::uint32_t>(want[i]);
              }
              EXPECT_EQ(differ, 0u)
                  << k.name << " n " << n << " accumulate " << acc << ": not the CPU's bits";
            } else {
              EXPECT_LE(rel_error(from_vector(got, {n}), from_vector(want, {n})), kElementwiseTol)
                  << k.name << " n " << n;
            }
          } else {
            EXPECT_EQ(std::memcmp(got.data(), aligned.data(), bytes), 0)
                << k.name << " n " << n << " accumulate " << acc << " misaligned array " << off;
          }
        }
      }
    }
  }
}

TEST_F(CudaOps, CrossEntropyOverTheFirstClassesIsCrossEntropyOfTheirColumns) {
  testing::expect_cross_entropy_over_classes_as_over_their_copy(kGpu, DType::kFloat32);
  testing::expect_cross_entropy_over_classes_as_over_their_copy(kGpu, DType::kBFloat16);
}

TEST_F(CudaOps, SoftmaxLogSoftmaxAndCrossEntropy) {
  // Up to 1024 columns a warp per row (its row in 1 to 32 registers a lane: every width class
  // and its edges), beyond a block per row.
  const Shape shapes[] = {{1, 1},    {7, 13}, {33, 1000}, {128, 50257}, {3, 4, 5}, {19, 1024},
                          {9, 1025}, {6, 32}, {5, 33},    {4, 128},     {3, 300},  {11, 129}};
  for (const Shape& s : shapes) {
    const Tensor x = mul(rand(s), 4.0), dy = rand(s);
    for (bool log : {false, true}) {
      const Tensor y = log ? log_softmax(x) : softmax(x);
      EXPECT_LT(rel_error(log ? log_softmax(gpu(x)) : softmax(gpu(x)), y), kElementwiseTol)
          << shape_str(s) << " log=" << log;
      const Tensor gy = gpu(y), gdy = gpu(dy);
      expect_backward_matches<1>(
          log ? "log_softmax" : "softmax", {s}, kElementwiseTol,
          [&](std::array<Tensor, 1>& g, bool acc) {
            if (log)
              log_softmax_backward(dy, y, {&g[0], acc});
            else
              softmax_backward(dy, y, {&g[0], acc});
          },
          [&](std::array<Tensor, 1>& g, bool acc) {
            if (log)
              log_softmax_backward(gdy, gy, {&g[0], acc});
            else
              softmax_backward(gdy, gy, {&g[0], acc});
          });
    }
    if (s.size() != 2) continue;
    std::vector<std::int32_t> t(static_cast<std::size_t>(s[0]));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>((i * 7919) % s[1]);
    const Tensor targets = from_vector(t, {s[0]}), gtargets = targets.to(kGpu);
    const Tensor loss = cross_entropy(x, targets);
    EXPECT_LT(rel_error(cross_entropy(gpu(x), gtargets), loss), kElementwiseTol) << shape_str(s);
    // Each row's (maximum, log Σ exp(x − maximum)).
    const std::vector<float> xv = x.to_vector<float>();
    std::vector<float> row(static_cast<std::size_t>(2 * s[0]));
    for (std::int64_t r = 0; r < s[0]; ++r) {
      float m = xv[r * s[1]];
      for (std::int64_t j = 1; j < s[1]; ++j) m = std::max(m, xv[r * s[1] + j]);
      double sum = 0;
      for (std::int64_t j = 0; j < s[1]; ++j) sum += std::exp(double(xv[r * s[1] + j] - m));
      row[2 * r] = m;
      row[2 * r + 1] = static_cast<float>(std::log(sum));
    }
    const Tensor lse_row = from_vector(row, {s[0], 2});
    const Tensor dl = rand({}), gx = gpu(x), glse = gpu(lse_row), gdl = gpu(dl);
    expect_backward_matches<1>(
        "cross_entropy", {s}, kElementwiseTol,
        [&](std::array<Tensor, 1>& g, bool acc) {
          cross_entropy_backward(dl, x, lse_row, targets, {&g[0], acc});
        },
        [&](std::array<Tensor, 1>& g, bool acc) {
          cross_entropy_backward(gdl, gx, glse, gtargets, {&g[0], acc});
        });
  }
  // An out-of-range target on the GPU: the loss is NaN (no host read refuses it there).
  const Tensor bad = from_vector(std::vector<std::int32_t>{0, 9}, {2}).to(kGpu);
  EXPECT_TRUE(std::isnan(cross_entropy(gpu(rand({2, 4})), bad).item()));
}

TEST_F(CudaOps, CausalSoftmaxAndAttention) {
  // Causal softmax over [n, Tq, Tk]: every warp width class, a block a row past 1024 columns, as
  // many queries as keys, fewer and more; the columns after each row's query are exactly 0.
  const Shape shapes[] = {{1, 1, 1},     {2, 7, 7},    {3, 5, 13},  {2, 40, 33},
                          {4, 128, 128}, {1, 3, 1025}, {2, 9, 300}, {1, 2, 4, 64}};
  for (const Shape& s : shapes) {
    const Tensor x = mul(rand(s), 4.0);
    const Tensor y = causal_softmax(x), gy = causal_softmax(gpu(x));
    EXPECT_LT(rel_error(gy, y), kElementwiseTol) << shape_str(s);
    const std::vector<float> v = gy.to_vector<float>();
    const std::int64_t tq = s[s.size() - 2], tk = s.back();
    for (std::size_t e = 0; e < v.size(); ++e) {
      const std::int64_t row = static_cast<std::int64_t>(e) / tk % tq,
                         col = static_cast<std::int64_t>(e) % tk;
      if (col > row) {
        ASSERT_EQ(v[e], 0.f) << shape_str(s) << " element " << e;
      }
    }
  }
  // Attention through the tape on both devices: the output and q's, k's and v's gradients.
  struct Case {
    Shape q, k, v;
    bool causal;
  };
  const Case cases[] = {{{2, 3, 16, 8}, {2, 3, 16, 8}, {2, 3, 16, 8}, true},
                        {{2, 3, 16, 8}, {2, 3, 16, 8}, {2, 3, 16, 8}, false},
                        {{4, 9, 32}, {4, 20, 32}, {4, 20, 12}, true},
                        {{1, 2, 130, 64}, {1, 2, 130, 64}, {1, 2, 130, 64}, true}};
  for (const Case& c : cases) {
    const Tensor q = rand(c.q), k = rand(c.k), v = rand(c.v);
    Shape out_shape = c.q;
    out_shape.back() = c.v.back();
    const Tensor r = rand(out_shape);
    auto run = [&](Device d) {
      std::vector<Tensor> in{q.to(d), k.to(d), v.to(d)};
      for (Tensor& t : in) t.set_requires_grad(true);
      const Tensor out = scaled_dot_product_attention(in[0], in[1], in[2], {.causal = c.causal});
      backward(sum(mul(out, r.to(d))));
      return std::vector<Tensor>{out, in[0].grad(), in[1].grad(), in[2].grad()};
    };
    const std::vector<Tensor> want = run(Device::cpu()), got = run(kGpu);
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_LT(rel_error(got[i], want[i]), kGemmTol)
          << shape_str(c.q) << " causal=" << c.causal << " (output, dq, dk, dv)[" << i << "]";
    }
  }
}

TEST_F(CudaOps, LayerNormForwardAndBackward) {
  // Rows beyond 128 take the two-pass parameter gradient (partial sums per slice of rows). Up to
  // 1024 columns a warp per row (its row in 2 to 32 registers a lane: every width class and its
  // edges), beyond a block per row.
  const Shape shapes[] = {{1, 1},     {7, 13},     {33, 1000}, {64, 4096}, {2, 3, 257},
                          {1000, 96}, {4, 75, 33}, {3, 64},    {9, 65},    {5, 256},
                          {2, 1024},  {3, 1025},   {17, 512}};
  for (const Shape& s : shapes) {
    const std::int64_t d = s.back();
    const Tensor x = add(mul(rand(s), 3.0), 1.0), w = rand({d}), b = rand({d}), dy = rand(s);
    EXPECT_LT(rel_error(layer_norm(gpu(x), gpu(w), gpu(b)), layer_norm(x, w, b)), kElementwiseTol)
        << shape_str(s);
    EXPECT_LT(rel_error(layer_norm(gpu(x), gpu(w), Tensor()), layer_norm(x, w, Tensor())),
              kElementwiseTol)
        << shape_str(s);
    // mean and rstd from the CPU reference, on both backends.
    std::vector<float> m, r;
    {
      const std::int64_t rows = x.numel() / d;
      const std::vector<float> xv = x.to_vector<float>();
      for (std::int64_t i = 0; i < rows; ++i) {
        double sum = 0, var = 0;
        for (std::int64_t j = 0; j < d; ++j) sum += xv[i * d + j];
        sum /= static_cast<double>(d);
        for (std::int64_t j = 0; j < d; ++j) var += (xv[i * d + j] - sum) * (xv[i * d + j] - sum);
        m.push_back(static_cast<float>(sum));
        r.push_back(static_cast<float>(1 / std::sqrt(var / static_cast<double>(d) + 1e-5)));
      }
    }
    const Shape rows{static_cast<std::int64_t>(m.size())};
    const Tensor cm = from_vector(m, rows), cr = from_vector(r, rows);
    const Tensor gx = gpu(x), gw = gpu(w), gdy = gpu(dy), gm = gpu(cm), gr = gpu(cr);
    expect_backward_matches<3>(
        "layer_norm_backward", {s, Shape{d}, Shape{d}}, 1e-4,
        [&](std::array<Tensor, 3>& g, bool acc) {
          layer_norm_backward(dy, x, w, cm, cr, {&g[0], acc}, {&g[1], acc}, {&g[2], acc});
        },
        [&](std::array<Tensor, 3>& g, bool acc) {
          layer_norm_backward(gdy, gx, gw, gm, gr, {&g[0], acc}, {&g[1], acc}, {&g[2], acc});
        });
  }
}

// add_layer_norm is add then layer_norm in one kernel on the GPU (a block a row past 1024 columns:
// the two launches): its sum, its normalized rows, and every gradient through either output give
// the bits of the two ops, at every register width class and its edges, with and without a bias.
TEST_F(CudaOps, AddLayerNormIsAddThenLayerNormBitwise) {
  // x's shape and the residual's: equal, or x's trailing dimensions (repeated over the leading).
  const std::pair<Shape, Shape> shapes[] = {
      {{1, 1}, {1, 1}},         {{7, 13}, {7, 13}},       {{5, 32}, {5, 32}},
      {{6, 33}, {6, 33}},       {{9, 64}, {9, 64}},       {{4, 65}, {4, 65}},
      {{3, 128}, {3, 128}},     {{11, 129}, {11, 129}},   {{5, 256}, {5, 256}},
      {{17, 512}, {17, 512}},   {{2, 1024}, {2, 1024}},   {{3, 1025}, {3, 1025}},
      {{2, 4096}, {2, 4096}},   {{4, 75, 33}, {4, 75, 33}}, {{512, 256}, {512, 256}},
      {{4, 75, 33}, {75, 33}},  {{16, 32, 64}, {32, 64}}, {{9, 64}, {64}},
      {{3, 2, 1025}, {2, 1025}}, {{2, 3, 5, 7}, {3, 5, 7}}};
  auto bits = [](const Tensor& t) { return t.to_vector<float>(); };
  for (const auto& [s, rs] : shapes) {
    for (const bool with_bias : {true, false}) {
      const std::int64_t d = s.back();
      const std::string where = shape_str(s) + " + " + shape_str(rs) +
                                (with_bias ? " with bias" : " without bias");
      const Tensor x = mul(rand(s), 3.0), r = rand(rs), w = rand({d}), b = rand({d});
      const Tensor dy_normed = rand(s), dy_sum = rand(s);
      struct Run {
        std::vector<float> sum, normed, gx, gr, gw, gb;
      };
      auto run = [&](bool fused) {
        const Tensor gx = gpu(x).set_requires_grad(true), gr = gpu(r).set_requires_grad(true);
        const Tensor gw = gpu(w).set_requires_grad(true);
        const Tensor gb = with_bias ? gpu(b).set_requires_grad(true) : Tensor();
        Tensor sum, normed;
        if (fused) {
          const AddLayerNorm o = add_layer_norm(gx, gr, gw, gb);
          sum = o.sum;
          normed = o.normed;
        } else {
          sum = add(gx, gr);
          normed = layer_norm(sum, gw, gb);
        }
        // Both outputs feed the loss, as a residual stream's sum does.
        backward({normed, sum}, {gpu(dy_normed), gpu(dy_sum)});
        return Run{bits(sum),       bits(normed),   bits(gx.grad()),
                   bits(gr.grad()), bits(gw.grad()), with_bias ? bits(gb.grad()) : std::vector<float>{}};
      };
      const Run fused = run(true), apart = run(false);
      EXPECT_EQ(fused.sum, apart.sum) << where;
      EXPECT_EQ(fused.normed, apart.normed) << where;
      EXPECT_EQ(fused.gx, apart.gx) << where;
      EXPECT_EQ(fused.gr, apart.gr) << where;
      EXPECT_EQ(fused.gw, apart.gw) << where;
      EXPECT_EQ(fused.gb, apart.gb) << where;
      // And within the elementwise tolerance of the CPU's two ops.
      EXPECT_LT(rel_error(from_vector(fused.normed, s), layer_norm(add(x, r), w, with_bias ? b : Tensor())),
                kElementwiseTol)
          << where;
    }
  }
  // Bad input on the GPU: a residual on another device or of another dtype is refused by name.
  const Tensor x = gpu(rand({4, 8})), w = gpu(rand({8}));
  GW_EXPECT_ERROR(add_layer_norm(x, rand({4, 8}), w, Tensor()), "add_layer_norm", "residual");
  GW_EXPECT_ERROR(add_layer_norm(x, gpu(rand({2, 4, 8})), w, Tensor()), "add_layer_norm",
                  "residual", "trailing");
  GW_EXPECT_ERROR(add_layer_norm(x, cast(gpu(rand({4, 8})), DType::kBFloat16), w, Tensor()),
                  "add_layer_norm", "residual");
}

// transpose (swap_dims) moves four floats a load where the innermost run it keeps whole is a
// multiple of four and both arrays are 16-byte aligned, one at a time otherwise: the CPU's bits
// either way, written and added to what the output holds, with either array 4 bytes off.
TEST_F(CudaOps, SwapDimsGivesTheCpusBitsFourFloatsALoadOrOne) {
  struct Case {
    Shape shape;
    int d0, d1;
  };
  // Attention's heads merged ([B, H, T, dh] -> [B, T, H, dh]) at both transformer sizes; a run
  // of 4, 8 and 12; runs of 3 and 1 (one float a load); a swap of the last two (run 1).
  for (const Case& c : {Case{{16, 4, 32, 16}, 1, 2}, Case{{32, 4, 128, 64}, 1, 2},
                        Case{{3, 5, 7, 4}, 0, 2}, Case{{2, 3, 5, 8}, 1, 2},
                        Case{{5, 3, 12}, 0, 1}, Case{{4, 6, 3}, 0, 1}, Case{{3, 5, 7}, 1, 2},
                        Case{{4, 8, 8}, 0, 2}}) {
    kernels::SwapDims dims;
    dims.rank = static_cast<int>(c.shape.size());
    for (int k = 0; k < dims.rank; ++k) dims.in_shape[k] = c.shape[static_cast<std::size_t>(k)];
    dims.d0 = c.d0;
    dims.d1 = c.d1;
    const std::int64_t n = shape_numel(c.shape);
    const auto size = static_cast<std::size_t>(n);
    const std::vector<float> in = rand({n}).to_vector<float>(), old = rand({n}).to_vector<float>();
    auto out_mem = device_array(size), in_mem = device_array(size);
    for (const bool acc : {false, true}) {
      std::vector<float> want = old;
      kernels::cpu::swap_dims(want.data(), in.data(), dims, acc);
      for (int off = 0; off <= 2; ++off) {  // 0: both aligned; 1: the output off; 2: the input
        float* d_out = out_mem.get() + (off == 1);
        float* d_in = in_mem.get() + (off == 2);
        const std::size_t bytes = size * sizeof(float);
        GW_CUDA_CHECK(cudaMemcpy(d_out, old.data(), bytes, cudaMemcpyHostToDevice));
        GW_CUDA_CHECK(cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice));
        kernels::swap_dims(d_out, d_in, dims, acc, cudaStreamLegacy);
        std::vector<float> got(size);
        GW_CUDA_CHECK(cudaMemcpy(got.data(), d_out, bytes, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0)
            << shape_str(c.shape) << " swap " << c.d0 << "," << c.d1 << " accumulate " << acc
            << " misaligned " << off;
      }
    }
  }
}

TEST_F(CudaOps, EmbeddingForwardAndBackward) {
  for (const auto& [vocab, dim, n] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1},
                                      {50, 33, 200},
                                      {1000, 256, 4096}}) {
    const Tensor table = rand({vocab, dim}), dy = rand({n, dim});
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int32_t>((i * 31) % vocab);
    const Tensor cid = from_vector(ids, {n}), gid = cid.to(kGpu);
    EXPECT_EQ(embedding(gpu(table), gid).to_vector<float>(),
              embedding(table, cid).to_vector<float>());
    const Tensor gt = gpu(table), gdy = gpu(dy);
    expect_backward_matches<1>(
        "embedding_backward", {table.shape()}, kElementwiseTol,
        [&](std::array<Tensor, 1>& g, bool acc) {
          embedding_backward(dy, table, cid, {&g[0], acc});
        },
        [&](std::array<Tensor, 1>& g, bool acc) {
          embedding_backward(gdy, gt, gid, {&g[0], acc});
        });
  }
}

// Note [Deterministic embedding gradient]: a repeated id's contributions are added in position
// order, so the float32 gradient is the CPU reference's bitwise, written and accumulated, and two
// runs give the same bits in float32 and bfloat16 — across the ways ids repeat: one id most of
// the batch (a run longer than a block's columns loop), runs scattered by a shuffle, every id
// once, one id, a vocabulary of one, a width that is no multiple of a warp, one column.
TEST_F(CudaOps, TheEmbeddingGradientIsTheCpusBitwiseAndTheSameEveryRun) {
  struct Case {
    std::int64_t vocab, dim, n;
    int heavy_percent;  // of the ids, this share is id 7 % vocab
  };
  for (const Case c : {Case{300, 70, 5000, 60}, Case{50304, 64, 2048, 5}, Case{97, 768, 97, 0},
                       Case{1, 33, 40, 0}, Case{64, 1, 1000, 90}, Case{1000, 256, 1, 0}}) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(c.n));
    std::uint64_t lcg = 12345;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      const bool heavy = static_cast<int>((lcg >> 33) % 100) < c.heavy_percent;
      ids[i] = static_cast<std::int32_t>(heavy ? 7 % c.vocab
                                               : static_cast<std::int64_t>(lcg >> 40) % c.vocab);
    }
    if (c.heavy_percent == 0 && c.vocab == c.n) {  // every id once, in a scrambled order
      for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<std::int32_t>((static_cast<std::int64_t>(i) * 31) % c.vocab);
      }
    }
    const Tensor table = rand({c.vocab, c.dim}), dy = rand({c.n, c.dim});
    const Tensor cid = from_vector(ids, {c.n}), gid = cid.to(kGpu);
    const Tensor gt = gpu(table), gdy = gpu(dy);
    const std::string what = "vocab " + std::to_string(c.vocab) + " dim " +
                             std::to_string(c.dim) + " n " + std::to_string(c.n);
    for (bool acc : {false, true}) {
      Tensor want = acc ? rand({c.vocab, c.dim}) : Tensor();
      Tensor got = acc ? gpu(want) : Tensor(), again = acc ? gpu(want) : Tensor();
      embedding_backward(dy, table, cid, {&want, acc});
      embedding_backward(gdy, gt, gid, {&got, acc});
      embedding_backward(gdy, gt, gid, {&again, acc});
      EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>()) << what << " accumulate " << acc;
      EXPECT_EQ(again.to_vector<float>(), got.to_vector<float>()) << what << " accumulate " << acc;
    }
    const Tensor bt = cast(gt, DType::kBFloat16), bdy = cast(gdy, DType::kBFloat16);
    Tensor b1, b2;
    embedding_backward(bdy, bt, gid, {&b1});
    embedding_backward(bdy, bt, gid, {&b2});
    EXPECT_EQ(cast(b1, DType::kFloat32).to_vector<float>(),
              cast(b2, DType::kFloat32).to_vector<float>())
        << what << " bfloat16";
  }
}

TEST_F(CudaOps, DropoutMasksAreTheCpusBitwiseAndACapturedDropoutDrawsAnewAtEveryReplay) {
  const Tensor x = rand({333, 77});
  Generator cpu_gen(Device::cpu(), 99), gpu_gen(kGpu, 99);
  for (int draw = 0; draw < 2; ++draw) {
    EXPECT_EQ(dropout(gpu(x), 0.25, gpu_gen).to_vector<float>(),
              dropout(x, 0.25, cpu_gen).to_vector<float>())
        << "draw " << draw;
  }
  EXPECT_EQ(gpu_gen.offset(), 2u * 333 * 77);
  // Captured once, replayed three times: the draws at offsets 0, n, 2n, as eager draws give them.
  Stream s(kGpu);
  StreamGuard on(s);
  const Tensor gx = gpu(x);
  Generator captured(kGpu, 5), eager_cpu(Device::cpu(), 5);
  GraphMemoryPool pool(kGpu);
  Tensor out;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    GraphPoolScope scope(pool);
    out = dropout(gx, 0.5, captured);
  }
  ASSERT_EQ(cudaStreamEndCapture(s.get(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<std::vector<float>> seen;
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(cudaGraphLaunch(exec, s.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
    out.storage()->record_use(s.get(), true);
    seen.push_back(out.to_vector<float>());
    EXPECT_EQ(seen.back(), dropout(x, 0.5, eager_cpu).to_vector<float>()) << "replay " << r;
  }
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_EQ(captured.offset(), 3u * 333 * 77);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_F(CudaOps, ReductionsAndMseLoss) {
  const Shape shapes[] = {{1}, {7, 13}, {1000, 1031}, {3, 1 << 20}};
  for (const Shape& s : shapes) {
    const Tensor x = rand(s), t = rand(s), dy = full({}, 0.75);
    const Tensor gx = gpu(x), gt = gpu(t), gdy = gpu(dy);
    EXPECT_LT(rel_error(sum(gx), sum(x)), kElementwiseTol) << shape_str(s);
    EXPECT_LT(rel_error(mean(gx), mean(x)), kElementwiseTol) << shape_str(s);
    EXPECT_LT(rel_error(mse_loss(gx, gt), mse_loss(x, t)), kElementwiseTol) << shape_str(s);
    expect_backward_matches<1>(
        "sum_backward", {s}, kElementwiseTol,
        [&](std::array<Tensor, 1>& g, bool acc) {
          sum_backward(dy, x, {&g[0], acc});
        },
        [&](std::array<Tensor, 1>& g, bool acc) {
          sum_backward(gdy, gx, {&g[0], acc});
        });
    expect_backward_matches<1>(
        "mean_backward", {s}, kElementwiseTol,
        [&](std::array<Tensor, 1>& g, bool acc) {
          mean_backward(dy, x, {&g[0], acc});
        },
        [&](std::array<Tensor, 1>& g, bool acc) {
          mean_backward(gdy, gx, {&g[0], acc});
        });
    expect_backward_matches<2>(
        "mse_loss_backward", {s, s}, kElementwiseTol,
        [&](std::array<Tensor, 2>& g, bool acc) {
          mse_loss_backward(dy, x, t, {&g[0], acc}, {&g[1], acc});
        },
        [&](std::array<Tensor, 2>& g, bool acc) {
          mse_loss_backward(gdy, gx, gt, {&g[0], acc}, {&g[1], acc});
        });
  }
}

TEST_F(CudaOps, ReductionsAreDeterministic) {
  const Tensor x = gpu(rand({4096, 1031}));
  const float first = static_cast<float>(sum(x).item());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(static_cast<float>(sum(x).item()), first);
}

TEST_F(CudaOps, GemmPlansForEveryTransposeAlignmentAndBeta) {
  // graphward::gemm caches a cuBLASLt plan per (shape, transposes, alignment): pointers offset by
  // one float (4-byte aligned) must get a plan of their own and still be right.
  const std::int64_t m = 33, n = 65, k = 31;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (std::int64_t off : {0, 1}) {
        for (float beta : {0.f, 1.f}) {
          const Tensor a = rand({m * k + 1}), b = rand({k * n + 1}), c0 = rand({m * n + 1});
          const Tensor ga = gpu(a), gb = gpu(b), gc = gpu(c0);
          graphward::gemm(kGpu, current_stream(kGpu), ta, tb, m, n, k, 1.f, ga.data<float>() + off,
                          gb.data<float>() + off, beta, gc.data<float>() + off);
          std::vector<float> ref = c0.to_vector<float>();
          kernels::cpu::gemm<float>(ta, tb, m, n, k, 1.f, a.data<float>() + off,
                                    b.data<float>() + off, beta, ref.data() + off);
          const std::vector<float> out = gc.to_vector<float>();
          const std::vector<double> o(out.begin() + off, out.begin() + off + m * n),
              r(ref.begin() + off, ref.begin() + off + m * n);
          EXPECT_LT(rel_error(o, r), kGemmTol)
              << "trans_a=" << ta << " trans_b=" << tb << " offset=" << off << " beta=" << beta;
        }
      }
    }
  }
}

TEST_F(CudaOps, GemmWithFusedBiasGradient) {
  // dW [out, in] = dYᵀ·X with db [out] = Σ_rows dY in one cuBLASLt call (BGRADB epilogue). It must
  // be available for the eager-backward study's layers (else every layer pays a launch more), and
  // wherever it runs it must match the reference; it writes db whatever beta is.
  struct Case {
    std::int64_t out, in, batch;
    bool required;
  };
  for (const Case& cs : {Case{256, 256, 64, true}, Case{1024, 1024, 256, true},
                         Case{33, 65, 31, false}, Case{1, 1, 1, false}}) {
    for (float beta : {0.f, 1.f}) {
      const Tensor dy = rand({cs.batch, cs.out}), x = rand({cs.batch, cs.in}),
                   c0 = rand({cs.out, cs.in}), db0 = rand({cs.out});
      const Tensor gc = gpu(c0), gdb = gpu(db0);
      const bool fused = graphward::gemm_bias_grad(
          kGpu, current_stream(kGpu), true, false, cs.out, cs.in, cs.batch, 1.f,
          gpu(dy).data<float>(), gpu(x).data<float>(), beta, gc.data<float>(), gdb.data<float>());
      const std::string what = std::to_string(cs.out) + "x" + std::to_string(cs.in) + "x" +
                               std::to_string(cs.batch) + " beta=" + std::to_string(beta);
      if (cs.required) {
        // Offered — though Note [Choosing a GEMM algorithm] may decline it where its GEMM and a
        // column sum apart were timed faster.
        bool declined = false;
        for (const auto& c : debug::gemm_choices(kGpu)) {
          declined |= c.m == cs.out && c.n == cs.in && c.k == cs.batch &&
                      c.kind == "gemm+bias_grad" && c.declined;
        }
        EXPECT_TRUE(fused || declined) << what << ": cuBLASLt offered no bias-gradient epilogue";
      }
      if (!fused) {  // nothing was launched: the outputs are untouched
        EXPECT_EQ(gc.to_vector<float>(), c0.to_vector<float>()) << what;
        EXPECT_EQ(gdb.to_vector<float>(), db0.to_vector<float>()) << what;
        continue;
      }
      std::vector<float> ref = c0.to_vector<float>(), ref_db(cs.out, 0.f);
      kernels::cpu::gemm<float>(true, false, cs.out, cs.in, cs.batch, 1.f, dy.data<float>(),
                                x.data<float>(), beta, ref.data());
      kernels::cpu::column_sum<float>(ref_db.data(), dy.data<float>(), nullptr, 1.f, cs.batch,
                                      cs.out, false);
      const std::vector<float> out = gc.to_vector<float>(), out_db = gdb.to_vector<float>();
      EXPECT_LT(rel_error(std::vector<double>(out.begin(), out.end()),
                          std::vector<double>(ref.begin(), ref.end())),
                kGemmTol)
          << what;
      EXPECT_LT(rel_error(std::vector<double>(out_db.begin(), out_db.end()),
                          std::vector<double>(ref_db.begin(), ref_db.end())),
                kGemmTol)
          << what << " (bias gradient)";
    }
  }
}

TEST_F(CudaOps, LinearWithAFusedActivationForwardAndBackward) {
  // The fused epilogue (cuBLASLt) where the shape allows it, the separate kernels elsewhere (GELU's
  // aux needs out % 8 == 0): both against the CPU reference, with and without a bias.
  std::vector<GemmShape> shapes(std::begin(kGemmShapes), std::end(kGemmShapes));
  shapes.push_back({64, 256, 256});
  shapes.push_back({256, 1024, 1024});
  for (const GemmShape& s : shapes) {
    for (const Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
      for (const bool with_bias : {true, false}) {
        const std::string what =
            std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n) + " act " +
            std::to_string(static_cast<int>(act)) + " bias " + std::to_string(with_bias);
        const Tensor x = rand({s.m, s.k}), w = rand({s.n, s.k}), dy = rand({s.m, s.n});
        const Tensor b = with_bias ? rand({s.n}) : Tensor();
        const Tensor gb = with_bias ? gpu(b) : Tensor();
        const Tensor y = linear(x, w, b, act);
        EXPECT_LT(rel_error(linear(gpu(x), gpu(w), gb, act), y), kGemmTol) << what;
        // The backward alone, from the same saved tensor on both backends.
        const Tensor z = linear(x, w, b);
        const Tensor saved = act == Activation::kRelu ? y : z;
        const Tensor gx = gpu(x), gw = gpu(w), gdy = gpu(dy), gsaved = gpu(saved);
        auto make = [act, with_bias](const Tensor& dy_, const Tensor& x_, const Tensor& w_,
                                     const Tensor& s_) {
          return [&dy_, &x_, &w_, &s_, act, with_bias](std::array<Tensor, 3>& g, bool acc) {
            linear_act_backward(dy_, x_, w_, s_, act, {&g[0], acc}, {&g[1], acc}, {&g[2], acc});
            (void)with_bias;
          };
        };
        expect_backward_matches<3>(what.c_str(), {x.shape(), w.shape(), Shape{s.n}}, kGemmTol,
                                   make(dy, x, w, saved), make(gdy, gx, gw, gsaved));
      }
    }
  }
}

// Kernel nodes of `forward` captured on `s`, where its inputs were made (so that nothing in the
// capture waits on another stream), after one eager run on `s` (plans and cuBLAS workspaces are
// made outside the capture).
std::size_t kernels_in(Stream& s, const std::function<Tensor()>& forward) {
  GraphMemoryPool pool(kGpu);
  StreamGuard on(s);
  (void)forward();
  EXPECT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  cudaGraph_t graph = capture::capture_stream(s.get(), "kernels_in", "", [&] {
    GraphPoolScope scope(pool);
    (void)forward();
  });
  const std::size_t kernels = capture::count_nodes(graph).kernels;
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  return kernels;
}

// What cuBLASLt chose for a linear layer's forward [m, k]·[n, k]ᵀ with `ep` (for failure messages).
std::string lt_choice(std::int64_t m, std::int64_t n, std::int64_t k, kernels::Epilogue ep) {
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) return "no cuBLASLt handle";
  std::string s;
  {
    kernels::LtGemm plan(handle, false, true, m, n, k, kBlasWorkspaceBytes, 256,
                         {.bias_grad_a = false, .split_k = false, .epilogue = ep});
    s = plan.describe();
  }
  cublasLtDestroy(handle);
  return s;
}

TEST(CudaLinearEpilogue, ALinearLayerWithItsBiasAndActivationIsOneCublasLtCall) {
  GW_REQUIRE_GPU();  // no poisoning here: it would add a fill kernel per allocation
  const TensorOptions f32{DType::kFloat32, kGpu};
  Stream s(kGpu);
  StreamGuard on(s);  // the inputs are made on s
  const Tensor x = randn({64, 256}, 1, f32), w = randn({256, 256}, 2, f32),
               b = randn({256}, 3, f32);
  const Tensor w13 = randn({13, 256}, 4, f32), b13 = randn({13}, 5, f32);
  EXPECT_EQ(kernels_in(s, [&] { return linear(x, w, b); }), 1u);
  EXPECT_EQ(kernels_in(s, [&] { return linear(x, w, b, Activation::kRelu); }), 1u);
  // cuBLASLt's fp32 GELU-aux epilogue (on the H200: algo 55, no split, no reduction) launches
  // two kernels; still fewer than the GEMM, the bias and the GELU apart (3, below).
  EXPECT_LE(kernels_in(s, [&] { return linear(x, w, b, Activation::kGelu); }), 2u)
      << lt_choice(64, 256, 256, kernels::Epilogue::kBiasGeluAux);
  EXPECT_LE(kernels_in(s, [&] { return linear(x, w, Tensor(), Activation::kGelu); }), 2u)
      << lt_choice(64, 256, 256, kernels::Epilogue::kGeluAux);
  // The composed ops: the linear (bias fused), then the activation.
  EXPECT_EQ(kernels_in(s, [&] { return gelu(linear(x, w, b)); }), 2u);
  // GELU's pre-activation output needs out % 8 == 0 in cuBLASLt: GEMM, bias, GELU apart.
  EXPECT_EQ(kernels_in(s, [&] { return linear(x, w13, b13, Activation::kGelu); }), 3u);
}

TEST_F(CudaOps, LinearBackwardWithMixedSlotModes) {
  // The fused bias gradient is taken only when the bias slot writes; a weight slot that
  // accumulates beside it, and the reverse, must both be right.
  const Tensor x = rand({64, 96}), w = rand({80, 96}), dy = rand({64, 80});
  const Tensor gx = gpu(x), gw_ = gpu(w), gdy = gpu(dy);
  for (bool acc_w : {false, true}) {
    for (bool acc_b : {false, true}) {
      Tensor cw = rand({80, 96}), cb = rand({80});
      Tensor dw = gpu(cw), db = gpu(cb);
      linear_backward(dy, x, w, {}, {&cw, acc_w}, {&cb, acc_b});
      linear_backward(gdy, gx, gw_, {}, {&dw, acc_w}, {&db, acc_b});
      EXPECT_LT(rel_error(dw, cw), kGemmTol) << "acc_w=" << acc_w << " acc_b=" << acc_b;
      EXPECT_LT(rel_error(db, cb), kGemmTol) << "acc_w=" << acc_w << " acc_b=" << acc_b;
    }
  }
}

// Note [Backward epilogue fusion]: a 3-layer MLP (ReLU, then GELU, then plain) trained through the
// fused plan gives the unfused plan's gradients (within GEMM tolerance: cuBLASLt's DGELU is its
// own tanh-approximation arithmetic), in float32 and bfloat16, in both write modes. A width that
// is not a multiple of 128 (the mask's padded rows) included.
TEST(CudaLinearEpilogue, FusedActivationEpiloguesGiveTheUnfusedGradients) {
  GW_REQUIRE_GPU();  // no poisoning here: it would add a fill kernel per allocation
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Stream s(kGpu);
    StreamGuard on(s);
    auto param = [&](const Shape& shape, std::uint64_t seed) {
      return cast(mul(randn(shape, seed, {DType::kFloat32, kGpu}), 0.2), dtype)
          .set_requires_grad(true);
    };
    const Tensor w1 = param({100, 256}, 1), b1 = param({100}, 2), w2 = param({256, 100}, 3),
                 b2 = param({256}, 4), w3 = param({10, 256}, 5), b3 = param({10}, 6);
    const Tensor x = cast(randn({128, 256}, 7, {DType::kFloat32, kGpu}), dtype);
    const std::vector<const Tensor*> params{&w1, &b1, &w2, &b2, &w3, &b3};
    auto loss = [&] {
      const Tensor h1 = linear(x, w1, b1, Activation::kRelu);
      const Tensor h2 = linear(h1, w2, b2, Activation::kGelu);
      return sum(cast(linear(h2, w3, b3), DType::kFloat32));
    };
    const Tensor planned = loss();  // a plan points into its tape: the root keeps it alive
    const BackwardPlan plan = plan_for({planned}, GradWrite::kOverwrite);
    int fusing = 0;
    for (const auto& st : plan.steps) fusing += st.fuses_activation_of >= 0;
    ASSERT_EQ(fusing, 2) << dtype_name(dtype) << "\n" << plan.dump();
    const double tol = dtype == DType::kFloat32 ? kGemmTol : 2e-2;
    for (const GradWrite mode : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
      std::vector<std::vector<double>> plain;
      for (const Tensor* t : params) t->grad() = Tensor();
      for (int i = 0; i < 2; ++i) {
        backward(loss(), {.grad_write = mode, .fuse_activation_epilogues = false});
      }
      for (const Tensor* t : params) {
        plain.push_back(testing::values(cast(t->grad(), DType::kFloat32)));
        t->grad() = Tensor();
      }
      for (int i = 0; i < 2; ++i) backward(loss(), {.grad_write = mode});
      for (std::size_t i = 0; i < params.size(); ++i) {
        EXPECT_LT(rel_error(testing::values(cast(params[i]->grad(), DType::kFloat32)), plain[i]),
                  tol)
            << dtype_name(dtype) << " parameter " << i << " mode " << static_cast<int>(mode);
      }
    }
  }
}

// What cuBLASLt chose for a linear layer's input-gradient GEMM [m, k]·[k, n] with a backward
// epilogue (for failure messages).
std::string lt_backward_choice(std::int64_t m, std::int64_t n, std::int64_t k,
                               kernels::Epilogue ep) {
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) return "no cuBLASLt handle";
  std::string s;
  {
    kernels::LtGemm plan(handle, false, false, m, n, k, kBlasWorkspaceBytes, 256,
                         {.bias_grad_a = false, .split_k = true, .epilogue = ep});
    s = plan.describe();
  }
  cublasLtDestroy(handle);
  return s;
}

// ... and a fused layer never costs more kernels than the unfused one (the MLP example's shapes:
// batch 128, width 256). Not fewer either, on the H200 with CUDA 13.0: cuBLASLt runs fp32
// DRELU/DGELU either split (a split-K GEMM, the epilogue in its reduction kernel) or unsplit as
// algorithm 55, which launches the GEMM and the epilogue as two kernels — measured 12 against 12
// for both activations, split or not. What the fusion saves there is the temporary gradient and
// a launch from graphward's host code.
TEST(CudaLinearEpilogue, AFusedActivationBackwardCostsNoMoreKernels) {
  GW_REQUIRE_GPU();  // no poisoning here: it would add a fill kernel per allocation
  const TensorOptions f32{DType::kFloat32, kGpu};
  Stream s(kGpu);
  StreamGuard on(s);
  const Tensor x = randn({128, 256}, 1, f32);
  const Tensor w1 = randn({256, 256}, 2, f32).set_requires_grad(true),
               b1 = randn({256}, 3, f32).set_requires_grad(true),
               w2 = randn({256, 256}, 4, f32).set_requires_grad(true),
               b2 = randn({256}, 5, f32).set_requires_grad(true);
  for (const Activation act : {Activation::kRelu, Activation::kGelu}) {
    auto step = [&](bool fuse) {
      return [&, fuse] {
        const Tensor l = sum(linear(linear(x, w1, b1, act), w2, b2));
        backward(l, {.grad_write = GradWrite::kOverwrite, .fuse_activation_epilogues = fuse});
        return l;
      };
    };
    const std::size_t unfused = kernels_in(s, step(false)), fused = kernels_in(s, step(true));
    const kernels::Epilogue ep =
        act == Activation::kRelu ? kernels::Epilogue::kDRelu : kernels::Epilogue::kDGelu;
    EXPECT_LE(fused, unfused) << (act == Activation::kRelu ? "ReLU" : "GELU") << ": fused " << fused
                              << ", unfused " << unfused
                              << "; cuBLASLt: " << lt_backward_choice(128, 256, 256, ep);
  }
}

// linear_backward's epilogue where cuBLASLt has none to offer (no ReLU mask; GELU on a width that
// is not a multiple of 8): the same arithmetic as separate kernels, against the CPU; and a mask of
// the wrong size is refused by name before anything is written.
TEST_F(CudaOps, ALinearInputGradientEpilogueWithoutCublasLtMatchesTheCpu) {
  for (const Activation act : {Activation::kRelu, Activation::kGelu}) {
    const Tensor x = rand({33, 13}), w = rand({20, 13}), dy = rand({33, 20});
    const Tensor pre = rand({33, 13});
    const Tensor act_in = act == Activation::kRelu ? relu(pre) : pre;
    Tensor cdx, gdx;
    const GradEpilogue cpu_ep{act, act_in, Tensor()};
    const GradEpilogue gpu_ep{act, gpu(act_in), Tensor()};
    linear_backward(dy, x, w, {&cdx, false, false, &cpu_ep}, {}, {});
    linear_backward(gpu(dy), gpu(x), gpu(w), {&gdx, false, false, &gpu_ep}, {}, {});
    EXPECT_LT(rel_error(gdx, cdx), kGemmTol) << static_cast<int>(act);
  }
  const Tensor x = gpu(rand({33, 13})), w = gpu(rand({20, 13})), dy = gpu(rand({33, 20}));
  const GradEpilogue bad{Activation::kRelu, relu(x), gpu(rand({3}))};
  Tensor dx;
  GW_EXPECT_ERROR(linear_backward(dy, x, w, {&dx, false, false, &bad}, {}, {}), "linear_backward",
                  "has a ReLU mask of 12 bytes; expected 528");
  EXPECT_FALSE(dx.defined());
}

// ---- tensors on the GPU -------------------------------------------------------------------------

TEST_F(CudaOps, RandomTensorsAreBitwiseEqualOnCpuAndGpu) {
  EXPECT_EQ(randn({1000, 33}, 5, {DType::kFloat32, kGpu}).to_vector<float>(),
            randn({1000, 33}, 5).to_vector<float>());
  EXPECT_EQ(uniform({4097}, -2, 3, 6, {DType::kFloat32, kGpu}).to_vector<float>(),
            uniform({4097}, -2, 3, 6).to_vector<float>());
  EXPECT_EQ(randn({77}, 5, {DType::kFloat64, kGpu}).to_vector<double>(),
            randn({77}, 5, {DType::kFloat64}).to_vector<double>());
}

TEST_F(CudaOps, CreationAndCopies) {
  EXPECT_EQ(testing::values(zeros({3, 5}, {DType::kFloat32, kGpu})), std::vector<double>(15, 0.0));
  EXPECT_EQ(testing::values(ones({1031}, {DType::kFloat32, kGpu})), std::vector<double>(1031, 1.0));
  EXPECT_EQ(testing::values(full({7}, -2.5, {DType::kFloat64, kGpu})),
            std::vector<double>(7, -2.5));
  const Tensor host = rand({129, 3});
  const Tensor dev = gpu(host);
  EXPECT_TRUE(dev.is_cuda());
  const Tensor dev2 = dev.clone();
  EXPECT_FALSE(dev2.is_same(dev));
  EXPECT_EQ(dev2.to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(dev.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(zeros({0}, {DType::kFloat32, kGpu}).to_vector<float>().size(), 0u);
}

// ---- bad input on the GPU -----------------------------------------------------------------------

TEST_F(CudaOps, MixedDevicesAreRefusedByName) {
  GW_EXPECT_ERROR(add(ones({2}), ones({2}, {DType::kFloat32, kGpu})), "add", "cpu", "cuda:0",
                  "one device");
  GW_EXPECT_ERROR(matmul(ones({2, 2}, {DType::kFloat32, kGpu}), ones({2, 2})), "matmul", "cuda:0",
                  "cpu");
  Tensor g = zeros({2});  // a CPU gradient slot for a CUDA op
  GW_EXPECT_ERROR(
      relu_backward(ones({2}, {DType::kFloat32, kGpu}), ones({2}, {DType::kFloat32, kGpu}), {&g}),
      "relu_backward", "grad_x", "cpu", "cuda:0");
}

TEST_F(CudaOps, Float64IsRefusedOnCuda) {
  GW_EXPECT_ERROR(relu(ones({2}, {DType::kFloat64, kGpu})), "relu", "float64", "float32");
}

TEST_F(CudaOps, FailedBackwardWritesNothingOnTheGpu) {
  const Tensor x = gpu(rand({4, 3})), w = gpu(rand({2, 3})), dy = gpu(rand({4, 2}));
  const Tensor before = rand({4, 3});
  Tensor gx = gpu(before);
  Tensor gw = zeros({3, 3}, {DType::kFloat32, kGpu});  // wrong shape
  GW_EXPECT_ERROR(linear_backward(dy, x, w, {&gx, true}, {&gw}), "grad_weight");
  EXPECT_EQ(gx.to_vector<float>(), before.to_vector<float>());
  // And the library still computes correctly afterwards.
  Tensor gw_ok;
  linear_backward(dy, x, w, {}, {&gw_ok});
  Tensor gw_ref;
  linear_backward(dy.to(Device::cpu()), x.to(Device::cpu()), w.to(Device::cpu()), {}, {&gw_ref});
  EXPECT_LT(rel_error(gw_ok, gw_ref), kGemmTol);
}

// ---- shapes, batched products, convolution and pooling ---------------------------------------

TEST_F(CudaOps, ReshapeTransposeAndConcatForwardAndBackward) {
  const Tensor x = rand({3, 5, 7});
  const Tensor rx = reshape(gpu(x), {15, -1});
  EXPECT_EQ(rx.shape(), Shape({15, 7}));
  EXPECT_EQ(rx.to_vector<float>(), x.to_vector<float>());
  for (auto [d0, d1] : {std::pair{0, 1}, {1, 2}, {0, 2}, {-1, -3}}) {
    EXPECT_EQ(transpose(gpu(x), d0, d1).to_vector<float>(),
              transpose(x, d0, d1).to_vector<float>());
    const Tensor dy = rand(transpose(x, d0, d1).shape()), gdy = gpu(dy);
    auto make = [d0, d1](const Tensor& dy_) {
      return [&dy_, d0, d1](std::array<Tensor, 1>& g, bool acc) {
        transpose_backward(dy_, d0, d1, {&g[0], acc});
      };
    };
    expect_backward_matches<1>("transpose_backward", {x.shape()}, kElementwiseTol, make(dy),
                               make(gdy));
  }
  const Tensor a = rand({4, 2, 33}), b = rand({4, 5, 33}), c = rand({4, 1, 33});
  EXPECT_EQ(concat({gpu(a), gpu(b), gpu(c)}, 1).to_vector<float>(),
            concat({a, b, c}, 1).to_vector<float>());
  const Tensor dy = rand({4, 8, 33}), gdy = gpu(dy);
  auto make = [](const Tensor& dy_) {
    return [&dy_](std::array<Tensor, 3>& g, bool acc) {
      GradSlot slots[3] = {{&g[0], acc}, {&g[1], acc}, {&g[2], acc}};
      concat_backward(dy_, {{4, 2, 33}, {4, 5, 33}, {4, 1, 33}}, 1, slots);
    };
  };
  expect_backward_matches<3>("concat_backward", {a.shape(), b.shape(), c.shape()}, kElementwiseTol,
                             make(dy), make(gdy));
}

// split_heads gives the CPU's bits on the GPU, forward and backward (written, and added to what the
// slot holds), for the transformer examples' layouts (Q, K and V windows), a ragged one and the
// smallest.
TEST_F(CudaOps, SplitHeadsForwardAndBackwardGiveTheCpusBits) {
  struct Layout {
    std::int64_t batch, seq, cols, heads, start, length;
  };
  for (const Layout l :
       {Layout{16, 32, 192, 4, 0, 64}, Layout{16, 32, 192, 4, 128, 64},
        Layout{32, 128, 768, 4, 256, 256}, Layout{3, 5, 23, 7, 2, 21}, Layout{1, 1, 1, 1, 0, 1}}) {
    const std::string where = "batch " + std::to_string(l.batch) + " seq " + std::to_string(l.seq) +
                              " cols " + std::to_string(l.cols) + " heads " +
                              std::to_string(l.heads) + " window [" + std::to_string(l.start) +
                              ", +" + std::to_string(l.length) + ")";
    const Tensor x = rand({l.batch * l.seq, l.cols});
    const Tensor y = split_heads(x, l.seq, l.heads, l.start, l.length);
    EXPECT_EQ(split_heads(gpu(x), l.seq, l.heads, l.start, l.length).to_vector<float>(),
              y.to_vector<float>())
        << where;
    const Tensor dy = rand(y.shape()), gdy = gpu(dy);
    for (const bool acc : {false, true}) {
      Tensor want = acc ? rand(x.shape()) : Tensor();
      Tensor got = acc ? gpu(want) : Tensor();
      split_heads_backward(dy, x.shape(), l.seq, l.heads, l.start, l.length, {&want, acc});
      split_heads_backward(gdy, x.shape(), l.seq, l.heads, l.start, l.length, {&got, acc});
      EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>()) << where << " accumulate " << acc;
    }
  }
}

TEST_F(CudaOps, BmmForwardAndBackwardForEveryTranspose) {
  struct Case {
    std::int64_t batch, m, k, n;
  };
  for (const Case& s :
       {Case{1, 1, 1, 1}, Case{3, 7, 13, 5}, Case{8, 33, 64, 31}, Case{16, 128, 32, 128}}) {
    for (auto [ta, tb] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
      const Tensor a = rand(ta ? Shape{s.batch, s.k, s.m} : Shape{s.batch, s.m, s.k});
      const Tensor b = rand(tb ? Shape{s.batch, s.n, s.k} : Shape{s.batch, s.k, s.n});
      const Tensor dy = rand({s.batch, s.m, s.n});
      // The scale of attention's scores (1/√d) and a negative one.
      for (const double alpha : {1.0, 0.125, -2.5}) {
        EXPECT_LT(rel_error(bmm(gpu(a), gpu(b), ta, tb, alpha), bmm(a, b, ta, tb, alpha)), kGemmTol)
            << s.batch << "x" << s.m << "x" << s.k << "x" << s.n << " ta " << ta << " tb " << tb
            << " alpha " << alpha;
        const Tensor ga = gpu(a), gb = gpu(b), gdy = gpu(dy);
        auto make = [ta, tb, alpha](const Tensor& dy_, const Tensor& a_, const Tensor& b_) {
          return [&dy_, &a_, &b_, ta, tb, alpha](std::array<Tensor, 2>& g, bool acc) {
            bmm_backward(dy_, a_, b_, ta, tb, {&g[0], acc}, {&g[1], acc}, alpha);
          };
        };
        expect_backward_matches<2>("bmm_backward", {a.shape(), b.shape()}, kGemmTol, make(dy, a, b),
                                   make(gdy, ga, gb));
      }
    }
  }
}

TEST_F(CudaOps, Conv2dForwardAndBackwardThroughCudnn) {
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  const Case cases[] = {{{2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}},
                        {{3, 5, 9, 7}, {6, 5, 3, 3}, {2, 1}},
                        {{1, 1, 5, 5}, {1, 1, 1, 1}, {1, 0}},
                        {{4, 16, 16, 16}, {32, 16, 3, 3}, {1, 1}},
                        {{2, 3, 11, 13}, {5, 3, 5, 5}, {2, 2}},
                        {{8, 32, 8, 8}, {64, 32, 3, 3}, {1, 1}},
                        // big images: the bias gradient sums slices of images in a second pass
                        {{3, 2, 150, 160}, {2, 2, 3, 3}, {1, 1}},
                        // the fastest algorithms, atomics allowed
                        {{64, 16, 16, 16}, {32, 16, 3, 3}, {1, 1, false}}};
  // Each case NCHW, then channels last (Conv2dOptions::channels_last: cuDNN's NHWC descriptors,
  // the bias added and summed by our kernels).
  for (const bool channels_last : {false, true}) {
  for (Case c : cases) {
    if (channels_last) {
      c.x = nhwc_shape(c.x);
      c.w = nhwc_shape(c.w);
      c.o.channels_last = true;
    }
    const Tensor x = rand(c.x), w = rand(c.w), b = rand({c.w[0]});
    const Tensor y = conv2d(x, w, b, c.o);
    EXPECT_LT(rel_error(conv2d(gpu(x), gpu(w), gpu(b), c.o), y), kGemmTol)
        << shape_str(c.x) << " " << shape_str(c.w) << " (" << dnn_plan_for_test(c.x, c.w, c.o)
        << ")";
    EXPECT_LT(rel_error(conv2d(gpu(x), gpu(w), Tensor(), c.o), conv2d(x, w, Tensor(), c.o)),
              kGemmTol);
    const Tensor dy = rand(y.shape()), gx = gpu(x), gw = gpu(w), gdy = gpu(dy);
    auto make = [&c](const Tensor& dy_, const Tensor& x_, const Tensor& w_) {
      return [&dy_, &x_, &w_, &c](std::array<Tensor, 3>& g, bool acc) {
        conv2d_backward(dy_, x_, w_, c.o, {&g[0], acc}, {&g[1], acc}, {&g[2], acc});
      };
    };
    expect_backward_matches<3>(channels_last ? "conv2d_backward, channels last"
                                             : "conv2d_backward",
                               {x.shape(), w.shape(), b.shape()}, kGemmTol, make(dy, x, w),
                               make(gdy, gx, gw));
  }
  }
}

// A convolution with few taps a filter and little work (C·R·S ≤ 32: a first convolution on
// images) takes its weight and bias gradients from kernels of ours (kernels/conv.h): against the
// CPU's (double sums) and cuDNN's deterministic algorithm, at every filter size it takes (1 to 5),
// strides 1 to 3, padding 0 to 2, one slice of images and several, with the bias and without,
// written and accumulated; the same bits on a second run; in bfloat16 too. Just outside its range
// (33 taps, too much work) it is not taken — but in bfloat16 any work is its (b256's first layer:
// within bfloat16's rounding of cuDNN's float32 gradients of the rounded inputs).
TEST_F(CudaOps, AConvolutionWithFewTapsTakesItsWeightGradientFromOurKernel) {
  struct Case {
    Shape x, w;
    Conv2dOptions o;
    bool ours;
  };
  const Case cases[] = {{{64, 3, 16, 16}, {16, 3, 3, 3}, {1, 1}, true},  // the example convnet's
                        {{1, 1, 5, 5}, {1, 1, 1, 1}, {1, 0}, true},
                        {{2, 32, 7, 9}, {5, 32, 1, 1}, {1, 0}, true},  // 32 taps: the limit
                        {{3, 8, 9, 9}, {4, 8, 2, 2}, {2, 1}, true},
                        {{5, 2, 12, 10}, {7, 2, 4, 4}, {3, 2}, true},
                        {{4, 1, 13, 11}, {3, 1, 5, 5}, {2, 2}, true},
                        {{300, 3, 8, 8}, {2, 3, 3, 3}, {1, 1}, true},  // many images a slice
                        {{3, 3, 40, 50}, {8, 3, 3, 3}, {1, 0}, true},
                        {{2, 33, 7, 9}, {5, 33, 1, 1}, {1, 0}, false},      // 33 taps
                        {{256, 3, 32, 32}, {64, 3, 3, 3}, {1, 1}, false}};  // 2^28 products
  for (const Case& c : cases) {
    const std::string what = shape_str(c.x) + " " + shape_str(c.w) + " stride " +
                             std::to_string(c.o.stride) + " padding " + std::to_string(c.o.padding);
    const kernels::ConvGeom g{c.x[0], c.x[1], c.x[2],      c.x[3],     c.w[0],
                              c.w[2], c.w[3], c.o.padding, c.o.stride, true};
    EXPECT_EQ(kernels::conv2d_weight_grad_small_fits(g), c.ours) << what;
    if (!c.ours) continue;  // cuDNN's: Conv2dForwardAndBackwardThroughCudnn
    const Tensor x = rand(c.x), w = rand(c.w), dy = rand({g.n, g.k, g.out_h(), g.out_w()});
    const Tensor gx = gpu(x), gw = gpu(w), gdy = gpu(dy);
    auto make_wb = [&c](const Tensor& dy_, const Tensor& x_, const Tensor& w_) {
      return [&dy_, &x_, &w_, &c](std::array<Tensor, 2>& g2, bool acc) {
        conv2d_backward(dy_, x_, w_, c.o, {}, {&g2[0], acc}, {&g2[1], acc});
      };
    };
    expect_backward_matches<2>("conv2d_backward (weight and bias)", {c.w, Shape{c.w[0]}}, kGemmTol,
                               make_wb(dy, x, w), make_wb(gdy, gx, gw));
    auto make_w = [&c](const Tensor& dy_, const Tensor& x_, const Tensor& w_) {
      return [&dy_, &x_, &w_, &c](std::array<Tensor, 1>& g1, bool acc) {
        conv2d_backward(dy_, x_, w_, c.o, {}, {&g1[0], acc}, {});
      };
    };
    expect_backward_matches<1>("conv2d_backward (weight alone)", {c.w}, kGemmTol, make_w(dy, x, w),
                               make_w(gdy, gx, gw));
    // the same bits twice, and cuDNN's deterministic algorithm
    Tensor first, second, bias;
    conv2d_backward(gdy, gx, gw, c.o, {}, {&first}, {&bias});
    conv2d_backward(gdy, gx, gw, c.o, {}, {&second}, {});
    EXPECT_EQ(first.to_vector<float>(), second.to_vector<float>()) << what;
    {  // bfloat16 storage: the same kernel, within bfloat16's rounding of the float32 gradients
       // of the rounded inputs
      const auto bf = [](const Tensor& t) { return cast(t, DType::kBFloat16); };
      const auto f32 = [](const Tensor& t) { return cast(t, DType::kFloat32); };
      const Tensor x16 = bf(gx), w16 = bf(gw), dy16 = bf(gdy);
      Tensor w_grad16, b_grad16, w_grad32, b_grad32;
      conv2d_backward(dy16, x16, w16, c.o, {}, {&w_grad16}, {&b_grad16});
      conv2d_backward(f32(dy16), f32(x16), f32(w16), c.o, {}, {&w_grad32}, {&b_grad32});
      EXPECT_EQ(w_grad16.dtype(), DType::kBFloat16) << what;
      EXPECT_LT(rel_error(f32(w_grad16), w_grad32), 1e-2) << what << " (bfloat16)";
      EXPECT_LT(rel_error(f32(b_grad16), b_grad32), 1e-2) << what << " (bfloat16)";
    }
#if GRAPHWARD_HAS_CUDNN
    // on one stream: the output's allocation (and its poison fill) ordered before cuDNN's call
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Stream stream(kGpu);
    StreamGuard on(stream);
    const Tensor by_cudnn = Tensor::empty(c.w, {DType::kFloat32, kGpu});
    dnn::conv2d_backward_filter(kGpu, stream.get(), g, by_cudnn.data<float>(), gdy.data<float>(),
                                gx.data<float>(), false);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    EXPECT_LT(rel_error(first, by_cudnn), kGemmTol) << what;
#endif
  }
  {  // bfloat16 at b256's 2^28 products: ours
    const Shape xs{256, 3, 32, 32}, ws{64, 3, 3, 3};
    const Conv2dOptions o{1, 1};
    kernels::ConvGeom g{xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], o.padding, o.stride, true};
    g.bf16 = true;
    EXPECT_TRUE(kernels::conv2d_weight_grad_small_fits(g));
    const auto bf = [](const Tensor& t) { return cast(gpu(t), DType::kBFloat16); };
    const auto f32 = [](const Tensor& t) { return cast(t, DType::kFloat32); };
    const Tensor x16 = bf(rand(xs)), w16 = bf(rand(ws));
    const Tensor dy16 = bf(rand({g.n, g.k, g.out_h(), g.out_w()}));
    Tensor w_grad16, b_grad16, w_grad32, b_grad32;
    conv2d_backward(dy16, x16, w16, o, {}, {&w_grad16}, {&b_grad16});
    conv2d_backward(f32(dy16), f32(x16), f32(w16), o, {}, {&w_grad32}, {&b_grad32});
    EXPECT_LT(rel_error(f32(w_grad16), w_grad32), 1e-2) << "b256 (bfloat16)";
    EXPECT_LT(rel_error(f32(b_grad16), b_grad32), 1e-2) << "b256 (bfloat16)";
  }
}

// The example convnet's first convolution: its weight and bias gradients are two kernels (the
// slices' partial sums, then their sum), not cuDNN's filter gradient and a bias reduction.
TEST(CudaConvWeightGrad, AFirstConvolutionsWeightAndBiasGradientsAreTwoKernels) {
  GW_REQUIRE_GPU();  // no poisoning here: it would add a fill kernel per allocation
  Stream s(kGpu);
  StreamGuard on(s);  // the inputs are made on s
  const TensorOptions f32{DType::kFloat32, kGpu};
  const Tensor x = randn({64, 3, 16, 16}, 81, f32), w = randn({16, 3, 3, 3}, 82, f32);
  const Tensor dy = randn({64, 16, 16, 16}, 83, f32);
  EXPECT_EQ(kernels_in(s,
                       [&] {
                         Tensor dw, db;
                         conv2d_backward(dy, x, w, {1, 1}, {}, {&dw}, {&db});
                         return dw;
                       }),
            2u);
}

// Conv2dOptions::activation on CUDA: cuDNN's convolution, then the bias and the ReLU in one
// pass of ours, is bitwise cuDNN's convolution, its bias add and a ReLU apart — the output, and
// every gradient through the tape (deterministic algorithms) — with and without a bias.
TEST_F(CudaOps, AConvolutionWithItsReluIsReluOfTheConvolutionBitwise) {
  for (bool with_bias : {true, false}) {
    auto leaf = [](const Shape& shape, std::uint64_t seed) {
      return randn(shape, seed, TensorOptions{DType::kFloat32, kGpu}).set_requires_grad(true);
    };
    const Tensor x1 = leaf({4, 16, 16, 16}, 31), w1 = leaf({32, 16, 3, 3}, 32),
                 b1 = with_bias ? leaf({32}, 33) : Tensor();
    const Tensor x2 = leaf({4, 16, 16, 16}, 31), w2 = leaf({32, 16, 3, 3}, 32),
                 b2 = with_bias ? leaf({32}, 33) : Tensor();
    const Conv2dOptions plain{.stride = 1, .padding = 1};
    Conv2dOptions fused = plain;
    fused.activation = Activation::kRelu;
    const Tensor y1 = conv2d(x1, w1, b1, fused), y2 = relu(conv2d(x2, w2, b2, plain));
    EXPECT_EQ(y1.to_vector<float>(), y2.to_vector<float>()) << "bias " << with_bias;
    const Tensor r = randn(y1.shape(), 34, TensorOptions{DType::kFloat32, kGpu});
    backward(sum(mul(y1, r)));
    backward(sum(mul(y2, r)));
    EXPECT_EQ(x1.grad().to_vector<float>(), x2.grad().to_vector<float>()) << "bias " << with_bias;
    EXPECT_EQ(w1.grad().to_vector<float>(), w2.grad().to_vector<float>()) << "bias " << with_bias;
    if (with_bias) {
      EXPECT_EQ(b1.grad().to_vector<float>(), b2.grad().to_vector<float>());
    }
  }
}

// Note [Backward epilogue fusion]: pooling's backward through the ReLU of the conv2d_relu before
// it, one kernel of ours. The op alone, max and average, at every pooling geometry: against the
// CPU reference, and bitwise cuDNN's pooling backward then relu_backward where windows do not
// overlap (average: areas 4 and 9). Through the tape: a conv2d_relu into a pooling fuses one
// step, and its gradients are bitwise the unfused plan's (2x2 windows) or within float rounding
// (overlapping windows).
TEST_F(CudaOps, APoolingTakesTheReluOfTheConvolutionBeforeIt) {
  const Pool2dOptions options[] = {{2, 0, 0}, {3, 2, 1}, {2, 1, 1}, {3, 3, 0}, {3, 1, 1}};
  // NCHW, then channels last with an odd height (2x2 windows leave a row out) and with even sizes
  // (2x2 windows tile the image: a thread per window).
  const Shape shapes[] = {{3, 4, 13, 10}, {3, 13, 10, 4}, {2, 12, 10, 6}};
  for (const Shape& shape : shapes) {
  const bool channels_last = shape != shapes[0];
  for (const bool max : {true, false}) {
    for (Pool2dOptions o : options) {
      o.channels_last = channels_last;
      const std::string what = std::string(max ? "max" : "average") + " kernel " +
                               std::to_string(o.kernel) + " stride " + std::to_string(o.stride) +
                               " padding " + std::to_string(o.padding) + " " + shape_str(shape) +
                               (channels_last ? " channels last" : "");
      const Tensor x = relu(rand(shape));  // a ReLU's output: many zeros
      const Tensor gx = gpu(x);
      auto pool = [&](const Tensor& t) { return max ? max_pool2d(t, o) : avg_pool2d(t, o); };
      const Tensor y = pool(x), gy = pool(gx);
      const Tensor dy = rand(y.shape()), gdy = gpu(dy);
      auto backward_of = [&](const Tensor& dy_, const Tensor& x_, const Tensor& y_,
                             const GradEpilogue* ep) {
        Tensor g;
        GradSlot slot{&g};
        slot.epilogue = ep;
        if (max) {
          max_pool2d_backward(dy_, x_, y_, o, slot);
        } else {
          avg_pool2d_backward(dy_, x_.shape(), o, slot);
        }
        return g;
      };
      GradEpilogue cpu_ep, gpu_ep;
      cpu_ep.act = gpu_ep.act = Activation::kRelu;
      cpu_ep.act_input = x;
      gpu_ep.act_input = gx;
      const Tensor cpu_fused = backward_of(dy, x, y, &cpu_ep);
      const Tensor gpu_fused = backward_of(gdy, gx, gy, &gpu_ep);
      EXPECT_LT(rel_error(gpu_fused, cpu_fused), kElementwiseTol) << what;
      Tensor apart;
      relu_backward(backward_of(gdy, gx, gy, nullptr), gx, {&apart});
      const bool overlap = (o.stride == 0 ? o.kernel : o.stride) < o.kernel;
      if (!overlap && (max || o.kernel == 2)) {
        EXPECT_EQ(gpu_fused.to_vector<float>(), apart.to_vector<float>()) << what;
      } else {
        EXPECT_LT(rel_error(gpu_fused, apart), kElementwiseTol) << what;
      }
    }
  }
  }
  auto leaf = [](const Shape& shape, std::uint64_t seed) {
    return randn(shape, seed, TensorOptions{DType::kFloat32, kGpu}).set_requires_grad(true);
  };
  for (const bool channels_last : {false, true}) {
  const Tensor x = leaf({8, 16, 16, 16}, 61),  // [N, C, H, W] or [N, H, W, C]: 16 each
               w = leaf(channels_last ? Shape{32, 3, 3, 16} : Shape{32, 16, 3, 3}, 62),
               b = leaf({32}, 63);
  const Conv2dOptions conv_relu{
      .padding = 1, .activation = Activation::kRelu, .channels_last = channels_last};
  for (const bool max : {true, false}) {
    for (Pool2dOptions o : {Pool2dOptions{2, 2, 0}, Pool2dOptions{3, 1, 1}}) {
      o.channels_last = channels_last;
      auto pooled = [&] {
        const Tensor h = conv2d(x, w, b, conv_relu);
        return max ? max_pool2d(h, o) : avg_pool2d(h, o);
      };
      const Tensor y = pooled();
      const Tensor r = randn(y.shape(), 64, TensorOptions{DType::kFloat32, kGpu});
      const Tensor planned = sum(mul(y, r));
      int fusing = 0;
      const BackwardPlan plan = plan_for({planned});
      for (const auto& st : plan.steps) fusing += st.fuses_activation_of >= 0;
      ASSERT_EQ(fusing, 1) << plan.dump();
      std::vector<std::vector<float>> plain;
      for (const Tensor* t : {&x, &w, &b}) t->grad() = Tensor();
      backward(sum(mul(pooled(), r)), {.fuse_activation_epilogues = false});
      for (const Tensor* t : {&x, &w, &b}) {
        plain.push_back(t->grad().to_vector<float>());
        t->grad() = Tensor();
      }
      backward(sum(mul(pooled(), r)));
      int i = 0;
      for (const Tensor* t : {&x, &w, &b}) {
        const std::string what = std::string(max ? "max" : "average") + " kernel " +
                                 std::to_string(o.kernel) + " parameter " + std::to_string(i) +
                                 (channels_last ? " channels last" : "");
        if (o.kernel == 2) {
          EXPECT_EQ(t->grad().to_vector<float>(), plain[i]) << what;
        } else {
          EXPECT_LT(rel_error(t->grad(), from_vector(plain[i], t->shape())), kGemmTol) << what;
        }
        ++i;
      }
    }
  }
  }
}

TEST_F(CudaOps, MaxAndAveragePoolingThroughCudnn) {
  const Pool2dOptions options[] = {{2, 0, 0}, {3, 2, 1}, {2, 1, 1}, {3, 3, 0}};
  // NCHW, then channels last with an odd height and with even sizes (2x2 windows tile the image:
  // our kernels, cuDNN's otherwise).
  const Shape shapes[] = {{3, 4, 13, 10}, {3, 13, 10, 4}, {2, 12, 10, 6}};
  for (const Shape& shape : shapes) {
  const bool channels_last = shape != shapes[0];
  for (Pool2dOptions o : options) {
    o.channels_last = channels_last;
    const Tensor x = rand(shape);  // random values: no ties for the maximum
    const Tensor gx = gpu(x);
    const Tensor ymax = max_pool2d(x, o), yavg = avg_pool2d(x, o);
    const Tensor gymax = max_pool2d(gx, o);
    EXPECT_EQ(gymax.to_vector<float>(), ymax.to_vector<float>()) << "max, kernel " << o.kernel;
    EXPECT_LT(rel_error(avg_pool2d(gx, o), yavg), kElementwiseTol) << "avg, kernel " << o.kernel;
    const Tensor dy = rand(ymax.shape()), gdy = gpu(dy);
    auto make_max = [&o](const Tensor& dy_, const Tensor& x_, const Tensor& y_) {
      return [&dy_, &x_, &y_, &o](std::array<Tensor, 1>& g, bool acc) {
        max_pool2d_backward(dy_, x_, y_, o, {&g[0], acc});
      };
    };
    expect_backward_matches<1>("max_pool2d_backward", {x.shape()}, kElementwiseTol,
                               make_max(dy, x, ymax), make_max(gdy, gx, gymax));
    auto make_avg = [&o, &x](const Tensor& dy_) {
      return [&dy_, &o, &x](std::array<Tensor, 1>& g, bool acc) {
        avg_pool2d_backward(dy_, x.shape(), o, {&g[0], acc});
      };
    };
    expect_backward_matches<1>("avg_pool2d_backward", {x.shape()}, kElementwiseTol, make_avg(dy),
                               make_avg(gdy));
  }
  }
}

TEST(CudaConv, TheFirstCudnnCallOfAThreadInsideACaptureIsRefusedAndTheCaptureAbandoned) {
  GW_REQUIRE_GPU();
  std::string message;
  std::thread([&] {  // a fresh thread: no cuDNN handle yet
    Stream s(kGpu);
    StreamGuard on(s);  // the inputs are made on s: the capture waits on nothing outside it
    const Tensor x = randn({1, 1, 4, 4}, 1, {DType::kFloat32, kGpu});
    const Tensor w = randn({1, 1, 3, 3}, 2, {DType::kFloat32, kGpu});
    try {
      cudaGraph_t g = capture::capture_stream(s.get(), "test", "", [&] { (void)conv2d(x, w); });
      (void)cudaGraphDestroy(g);
    } catch (const Error& e) {
      message = e.what();
    }
    cudaStreamCaptureStatus status{};
    EXPECT_EQ(cudaStreamIsCapturing(s.get(), &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
    // Outside the capture the same thread can use cuDNN.
    EXPECT_EQ(conv2d(x, w).shape(), Shape({1, 1, 2, 2}));
    EXPECT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  })
      .join();
  EXPECT_NE(message.find("inside a stream capture"), std::string::npos) << message;
  EXPECT_NE(message.find("eager step"), std::string::npos) << message;
}

// ---- bfloat16 ---------------------------------------------------------------------------------

TEST_F(CudaOps, CastToAndFromBFloat16IsBitwiseTheCpusAndSoIsItsGradient) {
  std::vector<float> v = mul(rand({4099}), 300.0).to_vector<float>();
  for (float special :
       {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1e-40f, -1e-39f,
        std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    v.push_back(special);
  }
  const Shape shape{static_cast<std::int64_t>(v.size())};
  const Tensor x = from_vector(v, shape);
  const Tensor h = cast(x, DType::kBFloat16), gh = cast(gpu(x), DType::kBFloat16);
  ASSERT_TRUE(gh.is_cuda());
  // Bitwise, except that a NaN need only stay a NaN (its payload is the converter's choice).
  const std::vector<bf16> got = gh.to_vector<bf16>(), want = h.to_vector<bf16>();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(v[i])) {
      EXPECT_TRUE(std::isnan(got[i].to_float())) << i;
    } else {
      EXPECT_EQ(got[i].bits, want[i].bits) << i << ": " << v[i];
    }
  }
  const std::vector<float> back = cast(gh, DType::kFloat32).to_vector<float>();
  const std::vector<float> ref = cast(h, DType::kFloat32).to_vector<float>();
  ASSERT_EQ(back.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(v[i])) continue;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(back[i]), std::bit_cast<std::uint32_t>(ref[i])) << i;
  }
  // The backward, written and accumulated, both ways (on the values without the NaN, the last).
  const Shape fs{shape[0] - 1};
  const Tensor finite = from_vector(std::vector<float>(v.begin(), v.end() - 1), fs);
  for (bool acc : {false, true}) {
    Tensor cpu_g = acc ? cast(full(fs, 0.5), DType::kBFloat16) : Tensor();
    Tensor gpu_g = acc ? gpu(cpu_g) : Tensor();
    cast_backward(finite, DType::kBFloat16, {&cpu_g, acc});
    cast_backward(gpu(finite), DType::kBFloat16, {&gpu_g, acc});
    EXPECT_EQ(gpu_g.to_vector<bf16>(), cpu_g.to_vector<bf16>()) << "accumulate " << acc;
    const Tensor hf = cast(finite, DType::kBFloat16);
    Tensor cpu_f = acc ? full(fs, 0.5) : Tensor();
    Tensor gpu_f = acc ? gpu(cpu_f) : Tensor();
    cast_backward(hf, DType::kFloat32, {&cpu_f, acc});
    cast_backward(gpu(hf), DType::kFloat32, {&gpu_f, acc});
    EXPECT_EQ(gpu_f.to_vector<float>(), cpu_f.to_vector<float>()) << "accumulate " << acc;
  }
  GW_EXPECT_ERROR(cast(gpu(x), DType::kFloat64), "cast", "float64", "float32 and bfloat16");
  const Tensor image = gpu(cast(randn({1, 1, 4, 4}, 6), DType::kBFloat16));
  EXPECT_EQ(conv2d(image, gpu(cast(randn({1, 1, 3, 3}, 7), DType::kBFloat16))).dtype(),
            DType::kBFloat16);
}

// bfloat16 storage, float32 arithmetic: each elementwise op on CUDA against the float32 CPU
// reference run on the same (bfloat16-rounded) inputs; the result differs by its own rounding to
// bfloat16 (relative 2^-9 per element) — checked at 1e-2 over the tensor.
TEST_F(CudaOps, ElementwiseOpsOnBFloat16MatchTheFloat32ReferenceAtBFloat16Tolerance) {
  constexpr double kBf16Tol = 1e-2;
  auto bf = [](const Tensor& t) { return cast(gpu(t), DType::kBFloat16); };
  auto rounded = [](const Tensor& t) {  // the float32 values a bfloat16 tensor holds
    return cast(cast(t, DType::kBFloat16), DType::kFloat32);
  };
  auto f32 = [](const Tensor& t) { return cast(t, DType::kFloat32).to(Device::cpu()); };
  const Shape s{33, 65};
  const Tensor a = rounded(rand(s)), b = rounded(rand(s)), row = rounded(rand({65}));
  const Tensor dy = rounded(rand(s));
  struct Binary {
    const char* name;
    Tensor (*forward)(const Tensor&, const Tensor&);
    void (*backward)(const Tensor&, const Tensor&, const Tensor&, GradSlot, GradSlot);
  };
  for (const Binary& op : {Binary{"add", add, add_backward}, Binary{"sub", sub, sub_backward},
                           Binary{"mul", mul, mul_backward}}) {
    for (const Tensor* other : {&b, &row}) {
      const Tensor y = op.forward(bf(a), bf(*other));
      ASSERT_EQ(y.dtype(), DType::kBFloat16) << op.name;
      EXPECT_LT(rel_error(f32(y), op.forward(a, *other)), kBf16Tol) << op.name;
      for (bool acc : {false, true}) {
        Tensor ga = acc ? bf(a) : Tensor(), gb = acc ? bf(*other) : Tensor();
        Tensor ra = acc ? a.clone() : Tensor(), rb = acc ? other->clone() : Tensor();
        op.backward(bf(dy), bf(a), bf(*other), {&ga, acc}, {&gb, acc});
        op.backward(dy, a, *other, {&ra, acc}, {&rb, acc});
        EXPECT_LT(rel_error(f32(ga), ra), kBf16Tol) << op.name << " grad a, accumulate " << acc;
        EXPECT_LT(rel_error(f32(gb), rb), kBf16Tol) << op.name << " grad b, accumulate " << acc;
      }
    }
  }
  EXPECT_LT(rel_error(f32(mul(add(bf(a), 2.0), 3.0)), mul(add(a, 2.0), 3.0)), kBf16Tol);
  struct Unary {
    const char* name;
    Tensor (*forward)(const Tensor&);
    void (*backward)(const Tensor&, const Tensor&, GradSlot);
    bool reads_input;  // GELU's backward reads x, the others y
  };
  for (const Unary& op :
       {Unary{"relu", relu, relu_backward, false}, Unary{"tanh", tanh, tanh_backward, false},
        Unary{"sigmoid", sigmoid, sigmoid_backward, false},
        Unary{"gelu", gelu, gelu_backward, true}}) {
    const Tensor y = op.forward(bf(a)), ref = op.forward(a);
    ASSERT_EQ(y.dtype(), DType::kBFloat16) << op.name;
    EXPECT_LT(rel_error(f32(y), ref), kBf16Tol) << op.name;
    const Tensor saved_gpu = op.reads_input ? bf(a) : y;
    const Tensor saved_cpu = op.reads_input ? a : f32(y);  // the backward's input as stored
    for (bool acc : {false, true}) {
      Tensor g = acc ? bf(b) : Tensor(), r = acc ? b.clone() : Tensor();
      op.backward(bf(dy), saved_gpu, {&g, acc});
      op.backward(dy, saved_cpu, {&r, acc});
      EXPECT_LT(rel_error(f32(g), r), kBf16Tol) << op.name << " backward, accumulate " << acc;
    }
  }
}

// A linear layer (with each fused activation) on bfloat16 storage: cuBLASLt with float32
// accumulation, forward and backward through the tape, against the float32 reference run on the
// same bfloat16-rounded values; 1e-2 (the output's and each gradient's own rounding to bfloat16).
TEST_F(CudaOps, LinearOnBFloat16MatchesTheFloat32ReferenceAtBFloat16Tolerance) {
  constexpr double kBf16Tol = 1e-2;
  auto rounded = [](const Tensor& t) { return cast(cast(t, DType::kBFloat16), DType::kFloat32); };
  auto f32 = [](const Tensor& t) { return cast(t, DType::kFloat32).to(Device::cpu()); };
  for (const auto& s : {GemmShape{7, 13, 5}, GemmShape{64, 256, 128}, GemmShape{33, 65, 32}}) {
    for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
      const Tensor x = rounded(rand({s.m, s.k})), w = rounded(rand({s.n, s.k}));
      const Tensor b = rounded(rand({s.n})), dy = rounded(rand({s.m, s.n}));
      // The reference: float32 leaves on the CPU.
      const Tensor rx = x.clone().set_requires_grad(true), rw = w.clone().set_requires_grad(true),
                   rb = b.clone().set_requires_grad(true);
      const Tensor ry = linear(rx, rw, rb, act);
      backward({ry}, {dy});
      // bfloat16 leaves on the GPU.
      const Tensor gx = cast(gpu(x), DType::kBFloat16).detach().set_requires_grad(true);
      const Tensor gw = cast(gpu(w), DType::kBFloat16).detach().set_requires_grad(true);
      const Tensor gb = cast(gpu(b), DType::kBFloat16).detach().set_requires_grad(true);
      const Tensor gy = linear(gx, gw, gb, act);
      ASSERT_EQ(gy.dtype(), DType::kBFloat16);
      backward({gy}, {cast(gpu(dy), DType::kBFloat16)});
      const std::string what = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" +
                               std::to_string(s.n) + " act " +
                               std::to_string(static_cast<int>(act));
      EXPECT_LT(rel_error(f32(gy), ry), kBf16Tol) << what;
      ASSERT_EQ(gx.grad().dtype(), DType::kBFloat16) << what;
      EXPECT_LT(rel_error(f32(gx.grad()), rx.grad()), kBf16Tol) << what << " dx";
      EXPECT_LT(rel_error(f32(gw.grad()), rw.grad()), kBf16Tol) << what << " dW";
      EXPECT_LT(rel_error(f32(gb.grad()), rb.grad()), kBf16Tol) << what << " db";
    }
  }
}

}  // namespace
}  // namespace graphward
