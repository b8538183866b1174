#pragma once
// The bfloat16 ops, one case each: the op's outputs and input gradients (each backward called
// directly with a fixed random grad_out) for inputs made on the CPU in float32 and converted to
// the asked dtype and device, and the tolerance of the bfloat16 results against the float32 CPU
// reference on the same (unrounded) inputs: ‖bf16 − fp32‖ / ‖fp32‖, per output. bfloat16 keeps 8
// bits of mantissa (a rounding error of up to 2^-9 ≈ 2e-3 an element): an op whose outputs are
// its inputs rounded once lands near 2e-3; one that sums or exponentiates rounded inputs, a few
// times that. Shared by the CPU tests and the CUDA tests.
//
// | op (forward, backward)             | tolerance | why                                            |
// |------------------------------------|-----------|------------------------------------------------|
// | softmax, log_softmax, causal       | 3e-2      | logits of scale 3 rounded: 3 · 2^-9 an element |
// | cross_entropy                      | 2e-2      | logits of scale 2 rounded; the loss float32    |
// | relu, tanh, sigmoid, gelu          | 1e-2      | inputs rounded, then one rounding an output    |
// | add, sub, mul, mul by a scalar     | 1e-2      | the same; broadcast gradients summed in fp32   |
// | bmm (every transpose)              | 1e-2      | products of rounded inputs summed in fp32      |
// | linear (+ bias, ReLU, GELU), matmul| 1e-2      | the same; bias and activation on the fp32 sum  |
// | narrow, transpose, concat, heads   | 5e-3      | copies of rounded inputs; sums rounded once    |
// | layer_norm, add_layer_norm         | 1e-2      | statistics fp32; normalized values rounded     |
// | embedding                          | 5e-3      | rows copied; repeated ids' gradients fp32 sums |
// | sum, mean, mse_loss                | 5e-3      | fp32 results of rounded inputs; one rounding   |
// | dropout                            | 5e-3      | the same mask; one rounding an output          |
// | conv2d (+ bias, ReLU), avg pooling | 2e-2      | products of rounded inputs summed in fp32      |
// |   (NCHW and channels last)         |           |                                                |
// | max and avg pooling                | 1e-2      | distinct inputs exact in bf16: the same maxima |
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace graphward::testing {

struct Bf16Case {
  std::string name;
  double tol;
  // Outputs then gradients, in `options` (dtype, device).
  std::function<std::vector<Tensor>(TensorOptions)> run;
};

// A float32 CPU tensor of `shape` (seed) converted to `options`.
inline Tensor bf16_case_input(const Shape& shape, std::uint64_t seed, TensorOptions options,
                              double scale = 1.0) {
  Tensor x = mul(randn(shape, seed), scale);
  if (options.dtype != DType::kFloat32) x = cast(x, options.dtype);
  return x.to(options.device);
}
// Inputs of few bits: k/8 of P, P the power of two at or below `scale`, k an integer in
// [-8, 8] (randn's value doubled and rounded): exact in bfloat16, and the products and sums of a
// convolution's few thousand of them exact in float32.
inline Tensor exact_case_input(const Shape& shape, std::uint64_t seed, TensorOptions options,
                               double scale = 1.0) {
  const double unit = std::exp2(std::floor(std::log2(scale))) / 8.0;
  std::vector<float> v = randn(shape, seed).to_vector<float>();
  for (float& e : v) e = static_cast<float>(std::clamp(std::round(e * 2.0), -8.0, 8.0) * unit);
  Tensor x = from_vector(v, shape);
  if (options.dtype != DType::kFloat32) x = cast(x, options.dtype);
  return x.to(options.device);
}
inline std::vector<Bf16Case> bf16_cases() {
  std::vector<Bf16Case> cases;
  auto rowwise = [&](const char* name, double tol, std::int64_t cols, auto forward, auto bwd) {
    cases.push_back({name, tol, [=](TensorOptions o) {
                       const Tensor x = bf16_case_input({48, cols}, 1, o, 3.0);
                       const Tensor dy = bf16_case_input({48, cols}, 2, o);
                       const Tensor y = forward(x);
                       Tensor dx;
                       bwd(dy, y, GradSlot{&dx});
                       return std::vector<Tensor>{y, dx};
                     }});
  };
  for (std::int64_t cols : {40, 700, 3000}) {  // a warp a row, in registers; a block a row
    rowwise("softmax", 3e-2, cols, [](const Tensor& x) { return softmax(x); },
            [](const Tensor& dy, const Tensor& y, GradSlot g) { softmax_backward(dy, y, g); });
    rowwise("log_softmax", 3e-2, cols, [](const Tensor& x) { return log_softmax(x); },
            [](const Tensor& dy, const Tensor& y, GradSlot g) { log_softmax_backward(dy, y, g); });
  }
  cases.push_back({"causal_softmax", 3e-2, [](TensorOptions o) {
                     const Tensor x = bf16_case_input({3, 40, 40}, 3, o, 3.0);
                     const Tensor dy = bf16_case_input({3, 40, 40}, 4, o);
                     const Tensor y = causal_softmax(x);
                     Tensor dx;
                     softmax_backward(dy, y, GradSlot{&dx});
                     return std::vector<Tensor>{y, dx};
                   }});
  for (std::int64_t cols : {10, 2000}) {  // the loss through autograd: its seed is float32
    cases.push_back({"cross_entropy", 2e-2, [cols](TensorOptions o) {
                       const Tensor x =
                           bf16_case_input({64, cols}, 5, o, 2.0).detach().set_requires_grad(true);
                       std::vector<std::int32_t> t(64);
                       for (std::size_t i = 0; i < t.size(); ++i) {
                         t[i] = static_cast<std::int32_t>((i * 7919) %
                                                          static_cast<std::size_t>(cols));
                       }
                       const Tensor loss = cross_entropy(x, from_vector(t, {64}).to(o.device));
                       backward(loss);
                       return std::vector<Tensor>{loss, x.grad()};
                     }});
  }
  // Elementwise: each output one rounding of float32 math on rounded inputs.
  using Unary = Tensor (*)(const Tensor&);
  using UnaryBackward = void (*)(const Tensor&, const Tensor&, GradSlot);
  struct Act {
    const char* name;
    Unary forward;
    UnaryBackward backward;
    bool reads_input;  // GELU's backward reads x, the others y
  };
  for (const Act& act : {Act{"relu", relu, relu_backward, false},
                         Act{"tanh", tanh, tanh_backward, false},
                         Act{"sigmoid", sigmoid, sigmoid_backward, false},
                         Act{"gelu", gelu, gelu_backward, true}}) {
    cases.push_back({act.name, 1e-2, [act](TensorOptions o) {
                       const Tensor x = bf16_case_input({33, 65}, 6, o, 2.0);
                       const Tensor dy = bf16_case_input({33, 65}, 7, o);
                       const Tensor y = act.forward(x);
                       Tensor dx;
                       act.backward(dy, act.reads_input ? x : y, GradSlot{&dx});
                       return std::vector<Tensor>{y, dx};
                     }});
  }
  cases.push_back({"add, sub, mul (a trailing operand broadcast), mul by a scalar", 1e-2,
                   [](TensorOptions o) {
                     const Tensor a = bf16_case_input({6, 20, 16}, 8, o);
                     const Tensor b = bf16_case_input({20, 16}, 9, o);
                     const Tensor dy = bf16_case_input({6, 20, 16}, 10, o);
                     Tensor ga, gb, ma, mb, sa;
                     add_backward(dy, a, b, {&ga}, {&gb});
                     mul_backward(dy, a, b, {&ma}, {&mb});
                     scale_backward(dy, -3.0, {&sa});
                     return std::vector<Tensor>{add(a, b), sub(a, b), mul(a, b), mul(a, -3.0), ga,
                                                gb, ma, mb, sa};
                   }});
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      cases.push_back({"bmm", 1e-2, [ta, tb](TensorOptions o) {
                         const Tensor a = bf16_case_input(ta ? Shape{3, 40, 24} : Shape{3, 24, 40},
                                                          11, o);
                         const Tensor b = bf16_case_input(tb ? Shape{3, 16, 40} : Shape{3, 40, 16},
                                                          12, o);
                         const Tensor dy = bf16_case_input({3, 24, 16}, 13, o);
                         Tensor ga, gb;
                         bmm_backward(dy, a, b, ta, tb, {&ga}, {&gb}, 0.5);
                         return std::vector<Tensor>{bmm(a, b, ta, tb, 0.5), ga, gb};
                       }});
    }
  }
  for (const Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
    cases.push_back({"linear (bias, activation) and matmul", 1e-2, [act](TensorOptions o) {
                       const Tensor x = bf16_case_input({24, 40}, 14, o);
                       const Tensor w = bf16_case_input({56, 40}, 15, o, 0.3);
                       const Tensor b = bf16_case_input({56}, 16, o);
                       const Tensor dy = bf16_case_input({24, 56}, 17, o);
                       const Tensor xl = x.detach().set_requires_grad(true);
                       const Tensor wl = w.detach().set_requires_grad(true);
                       const Tensor bl = b.detach().set_requires_grad(true);
                       const Tensor y = linear(xl, wl, bl, act);
                       backward({y}, {dy});
                       const Tensor wt = bf16_case_input({40, 56}, 18, o, 0.3);
                       Tensor ma, mb;
                       matmul_backward(dy, x, wt, {&ma}, {&mb});
                       return std::vector<Tensor>{y, xl.grad(), wl.grad(), bl.grad(),
                                                  matmul(x, wt), ma, mb};
                     }});
  }
  // Data movement: each output an input element as stored; accumulated gradients summed in float32.
  cases.push_back({"narrow, transpose, concat, split_heads and their backwards (accumulating)",
                   5e-3, [](TensorOptions o) {
                     const Tensor x = bf16_case_input({12, 48}, 19, o);  // batch 3 · seq 4
                     const Tensor z = bf16_case_input({12, 16}, 20, o);
                     const Tensor dn = bf16_case_input({12, 20}, 21, o);
                     const Tensor dt = bf16_case_input({48, 12}, 22, o);
                     const Tensor dc = bf16_case_input({12, 64}, 23, o);
                     const Tensor dh = bf16_case_input({3 * 2, 4, 12}, 24, o);
                     Tensor gn, gt, gh, gc0, gc1;
                     narrow_backward(dn, {12, 48}, 8, 20, {&gn});
                     narrow_backward(dn, {12, 48}, 8, 20, {&gn, true});
                     transpose_backward(dt, 0, 1, {&gt});
                     transpose_backward(dt, 0, 1, {&gt, true});
                     split_heads_backward(dh, {12, 48}, 4, 2, 16, 24, {&gh});
                     split_heads_backward(dh, {12, 48}, 4, 2, 16, 24, {&gh, true});
                     GradSlot slots[2] = {{&gc0}, {&gc1}};
                     concat_backward(dc, {{12, 48}, {12, 16}}, 1, slots);
                     return std::vector<Tensor>{narrow(x, 8, 20), transpose(x, 0, 1),
                                                concat({x, z}, 1), split_heads(x, 4, 2, 16, 24),
                                                gn, gt, gh, gc0, gc1};
                   }});
  for (std::int64_t cols : {48, 1500}) {  // a warp a row; a block a row
    cases.push_back({"layer_norm, add_layer_norm (a residual broadcast) and their backwards", 1e-2,
                     [cols](TensorOptions o) {
                       const Tensor x = bf16_case_input({3, 50, cols}, 25, o, 2.0);
                       const Tensor r = bf16_case_input({50, cols}, 26, o);
                       const Tensor w = add(bf16_case_input({cols}, 27, o, 0.2), 1.0);
                       const Tensor b = bf16_case_input({cols}, 28, o, 0.2);
                       const Tensor dy = bf16_case_input({3, 50, cols}, 29, o);
                       const Tensor xl = x.detach().set_requires_grad(true);
                       const Tensor wl = w.detach().set_requires_grad(true);
                       const Tensor bl = b.detach().set_requires_grad(true);
                       const Tensor y = layer_norm(xl, wl, bl, 1e-5);
                       backward({y}, {dy});
                       const AddLayerNorm a = add_layer_norm(x, r, w, b, 1e-5);
                       return std::vector<Tensor>{y,     xl.grad(), wl.grad(), bl.grad(),
                                                  a.sum, a.normed};
                     }});
  }
  cases.push_back({"embedding (ids repeated) and its backward (accumulating)", 5e-3,
                   [](TensorOptions o) {
                     const Tensor table = bf16_case_input({37, 24}, 30, o);
                     std::vector<std::int32_t> id(90);
                     for (std::size_t i = 0; i < id.size(); ++i) {
                       id[i] = static_cast<std::int32_t>((i * i + 3) % 37);
                     }
                     const Tensor ids = from_vector(id, {9, 10}).to(o.device);
                     const Tensor dy = bf16_case_input({9, 10, 24}, 31, o);
                     Tensor g;
                     embedding_backward(dy, table, ids, {&g});
                     Tensor twice = g.clone();
                     embedding_backward(dy, table, ids, {&twice, true});
                     return std::vector<Tensor>{embedding(table, ids), g, twice};
                   }});
  cases.push_back({"sum, mean, mse_loss (float32 results) and their backwards", 5e-3,
                   [](TensorOptions o) {
                     // Of mean 2: a sum of zero-mean values cancels, and its relative error
                     // measures the cancellation, not the op.
                     const Tensor x =
                         add(bf16_case_input({30, 70}, 32, o), 2.0).detach().set_requires_grad(true);
                     const Tensor t = bf16_case_input({30, 70}, 33, o).detach().set_requires_grad(true);
                     const Tensor s = sum(x), m = mean(x), l = mse_loss(x, t);
                     backward({s, m, l}, {full({}, 0.5).to(o.device), full({}, 3.0).to(o.device),
                                          full({}, 2.0).to(o.device)});
                     return std::vector<Tensor>{s, m, l, x.grad(), t.grad()};
                   }});
  cases.push_back({"dropout and its backward", 5e-3, [](TensorOptions o) {
                     const Tensor x = bf16_case_input({40, 50}, 34, o).detach().set_requires_grad(true);
                     const Tensor dy = bf16_case_input({40, 50}, 35, o);
                     Generator gen(o.device, 11);
                     const Tensor y = dropout(x, 0.3, gen);
                     backward({y}, {dy});
                     return std::vector<Tensor>{y, x.grad()};
                   }});
  for (const bool relu : {false, true}) {
  for (const bool cl : {false, true}) {  // NCHW, then channels last
    cases.push_back({std::string(relu ? "conv2d with bias and ReLU, average pooling after it, and "
                                        "their backwards"
                                      : "conv2d with bias, average pooling after it, and their "
                                        "backwards") +
                         (cl ? ", channels last" : ""),
                     2e-2,
                     [relu, cl](TensorOptions o) {
                       // With the ReLU, inputs of few bits (exact_case_input): every product and
                       // sum exact in float32 on both runs, so both find the same pre-activations
                       // and the same ReLU mask. From random inputs one pre-activation near 0 on
                       // the other side of it in one run moves a channel's gradient by a whole
                       // term: 2-5% against float32, whatever the arithmetic's precision. The
                       // bias is shifted by 1/512, half the products' unit (x in 1/8s, w in
                       // 1/32s), so that no pre-activation is 0 or near it: an exact 0 would be
                       // put on either side by an algorithm whose transforms round (cuDNN's
                       // Winograd, where its timing picks that one).
                       auto input = [&](const Shape& shape, std::uint64_t seed, double scale) {
                         return relu ? exact_case_input(shape, seed, o, scale)
                                     : bf16_case_input(shape, seed, o, scale);
                       };
                       const Tensor x = input(cl ? Shape{4, 12, 12, 3} : Shape{4, 3, 12, 12}, 36,
                                              1.0)
                                            .detach()
                                            .set_requires_grad(true);
                       // [K, C, R, S] or [K, R, S, C]: three of each.
                       const Tensor w =
                           input({8, 3, 3, 3}, 37, 0.3).detach().set_requires_grad(true);
                       const Tensor b = (relu ? add(input({8}, 38, 0.1),
                                                    full({8}, 1.0 / 512, {o.dtype, o.device}))
                                              : input({8}, 38, 0.1))
                                            .detach()
                                            .set_requires_grad(true);
                       const Tensor y = conv2d(
                           x, w, b,
                           {.padding = 1,
                            .activation = relu ? Activation::kRelu : Activation::kNone,
                            .channels_last = cl});
                       const Tensor a = avg_pool2d(y, {.kernel = 2, .channels_last = cl});
                       backward({a}, {input(a.shape(), 39, 1.0)});
                       return std::vector<Tensor>{y, a, x.grad(), w.grad(), b.grad()};
                     }});
  }
  }
  cases.push_back({"max and average pooling of distinct values, and their backwards", 1e-2,
                   [](TensorOptions o) {
                     // Distinct multiples of 1/16 in [-8, 8): exact in bfloat16, so both runs
                     // pool the same values and find the same maxima.
                     std::vector<float> v(2 * 2 * 8 * 8);
                     for (std::size_t i = 0; i < v.size(); ++i) {
                       v[i] = static_cast<float>(static_cast<int>((i * 97) % v.size()) - 128) /
                              16.f;
                     }
                     Tensor x = from_vector(v, {2, 2, 8, 8});
                     if (o.dtype != DType::kFloat32) x = cast(x, o.dtype);
                     x = x.to(o.device).detach().set_requires_grad(true);
                     const Tensor m = max_pool2d(x, {.kernel = 2});
                     const Tensor a = avg_pool2d(x, {.kernel = 3, .stride = 2, .padding = 1});
                     backward({m, a}, {bf16_case_input({2, 2, 4, 4}, 40, o),
                                       bf16_case_input({2, 2, 4, 4}, 41, o)});
                     return std::vector<Tensor>{m, a, x.grad()};
                   }});
  return cases;
}

// Every case run in bfloat16 with `bf16` (its device) against the float32 CPU reference, each
// output within the case's tolerance.
inline void expect_bf16_cases_within_tolerance(TensorOptions bf16) {
  const TensorOptions f32_cpu{DType::kFloat32, Device::cpu()};
  for (const Bf16Case& c : bf16_cases()) {
    const std::vector<Tensor> ref = c.run(f32_cpu), got = c.run(bf16);
    ASSERT_EQ(ref.size(), got.size()) << c.name;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const Tensor g = got[i].to(Device::cpu());
      EXPECT_LT(rel_error(g.dtype() == DType::kFloat32 ? g : cast(g, DType::kFloat32), ref[i]),
                c.tol)
          << c.name << ", output " << i;
    }
  }
}

}  // namespace graphward::testing
