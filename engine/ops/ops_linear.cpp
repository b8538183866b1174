// matmul and linear: GEMMs through cuBLAS on CUDA (kernels/gemm.h), the reference on the CPU.
#include "graphward/engine/ops/autocast.h"
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/gemm.h"
#include "graphward/kernels/reduce.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {

// One GEMM C[m,n] (=|+=) op(A)·op(B) on the op's device (see kernels/gemm.h for the layout).
// On the CPU: a and b read through `d` (Note [bfloat16 on the CPU]).
template <class T>
void gemm_cpu(CpuData<T>& d, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t kk,
              const Tensor& a, const Tensor& b, bool accumulate, T* c) {
  k::cpu::gemm<T>(ta, tb, m, n, kk, T(1), d.in(a), d.in(b), accumulate ? T(1) : T(0), c);
}

#if GRAPHWARD_HAS_CUDA
// T: float, or bf16 (bfloat16 storage, float32 arithmetic).
template <class T = float>
void gemm_cuda(const CudaScope& scope, Device device, bool ta, bool tb, std::int64_t m,
               std::int64_t n, std::int64_t kk, const Tensor& a, const Tensor& b, bool accumulate,
               T* c) {
  graphward::gemm(device, scope.stream(), ta, tb, m, n, kk, 1.f, ptr<T>(a), ptr<T>(b),
                  accumulate ? 1.f : 0.f, c);
}
#endif

}  // namespace

namespace {
struct MatmulDims {
  std::int64_t m, k, n;
};
MatmulDims check_matmul(const char* op, const Tensor& a, const Tensor& b) {
  check_inputs(op, {{"a", &a}, {"b", &b}}, Bf16::kEverywhere);
  check_dim(op, {"a", &a}, 2);
  check_dim(op, {"b", &b}, 2);
  GW_CHECK(a.size(1) == b.size(0), op, ": inner dimensions differ: a is ", shape_str(a.shape()),
           ", b is ", shape_str(b.shape()), "; expected a.shape[1] == b.shape[0]");
  return {a.size(0), a.size(1), b.size(1)};
}
}  // namespace

namespace {
Tensor matmul_impl(const Tensor& a, const Tensor& b);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (Tensor a16 = a, b16 = b; autocast_matrix_operands({&a16, &b16})) {  // Note [Autocast]
    return matmul(a16, b16);
  }
  detail::NvtxRange range("matmul");
  Tensor c = matmul_impl(a, b);
  if (needs_grad({&a, &b})) {
    record("matmul", c, {&a, &b}, {save("a", a), save("b", b)},
           [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             matmul_backward(g, s[0], s[1], grads[0], grads[1]);
           });
    c.grad_fn()->set_backward_flops(4.0 * static_cast<double>(a.numel()) *
                                    static_cast<double>(b.size(1)));
  }
  return c;
}

namespace {
Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  const auto [m, kk, n] = check_matmul("matmul", a, b);
  if (a.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(a.device());
    scope.read({&a, &b});
    Tensor c = new_output({m, n}, a);
    dispatch_cuda(a.dtype(), [&]<class T>() {
      gemm_cuda<T>(scope, a.device(), false, false, m, n, kk, a, b, false, ptr<T>(c));
    });
    return c;
#endif
  }
  Tensor c = new_output({m, n}, a);
  dispatch_cpu_data(a.dtype(), [&]<class T>(CpuData<T>& d) {
    gemm_cpu<T>(d, false, false, m, n, kk, a, b, false, d.out(c));
  });
  return c;
}
}  // namespace

void matmul_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                     GradSlot grad_b) {
  const char* op = "matmul_backward";
  const auto [m, kk, n] = check_matmul(op, a, b);
  check_inputs(op, {{"a", &a}, {"grad_out", &grad_out}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == Shape({m, n}), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ", shape_str({m, n}));
  const bool want_a = check_slot(op, "grad_a", grad_a, a);
  const bool want_b = check_slot(op, "grad_b", grad_b, b);
  // dA [m,k] = dC [m,n] · Bᵀ ;  dB [k,n] = Aᵀ · dC
  if (a.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(a.device());
    scope.read({&grad_out, &a, &b});
    dispatch_cuda(a.dtype(), [&]<class T>() {
      if (want_a) {
        const bool acc = open_slot(grad_a, a, scope.stream());
        gemm_cuda<T>(scope, a.device(), false, true, m, kk, n, grad_out, b, acc,
                     slot_ptr<T>(grad_a));
      }
      if (want_b) {
        const bool acc = open_slot(grad_b, b, scope.stream());
        gemm_cuda<T>(scope, a.device(), true, false, kk, n, m, a, grad_out, acc,
                     slot_ptr<T>(grad_b));
      }
    });
    return;
#endif
  }
  dispatch_cpu_data(a.dtype(), [&]<class T>(CpuData<T>& d) {
    if (want_a) {
      const bool acc = open_slot(grad_a, a, nullptr);
      gemm_cpu<T>(d, false, true, m, kk, n, grad_out, b, acc, slot_out(d, grad_a, acc));
    }
    if (want_b) {
      const bool acc = open_slot(grad_b, b, nullptr);
      gemm_cpu<T>(d, true, false, kk, n, m, a, grad_out, acc, slot_out(d, grad_b, acc));
    }
  });
}

namespace {
struct LinearDims {
  std::int64_t batch, in, out;
};

LinearDims check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // bfloat16 on CUDA: storage only, the GEMMs and epilogues accumulate in float32.
  if (bias.defined()) {
    check_inputs(op, {{"x", &x}, {"weight", &weight}, {"bias", &bias}}, Bf16::kEverywhere);
  } else {
    check_inputs(op, {{"x", &x}, {"weight", &weight}}, Bf16::kEverywhere);
  }
  check_dim(op, {"x", &x}, 2);
  check_dim(op, {"weight", &weight}, 2);
  GW_CHECK(x.size(1) == weight.size(1), op, ": x is ", shape_str(x.shape()), " and weight is ",
           shape_str(weight.shape()), "; expected weight [out, in] with in == x.shape[1] (",
           x.size(1), ")");
  if (bias.defined()) {
    GW_CHECK(bias.shape() == Shape({weight.size(0)}), op, ": bias is ", shape_str(bias.shape()),
             "; expected [", weight.size(0), "] (weight's out dimension)");
  }
  return {x.size(0), x.size(1), weight.size(0)};
}
}  // namespace

namespace {
const char* linear_name(Activation act) {
  switch (act) {
    case Activation::kRelu:
      return "linear_relu";
    case Activation::kGelu:
      return "linear_gelu";
    case Activation::kNone:
      break;
  }
  return "linear";
}

struct LinearOut {
  Tensor y;
  Tensor z;     // the pre-activation x · Wᵀ + b (GELU only: its backward reads it)
  Tensor mask;  // ReLU's bit mask from cuBLASLt's RELU_AUX epilogue (CUDA, when asked and made)
};
// relu_mask: ask for ReLU's bit mask (for a backward epilogue; Note [Backward epilogue fusion]).
LinearOut linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                      bool relu_mask);

// Note [Autocast]: a linear layer that computed with a float32 parameter's bfloat16 copy records
// the parameter itself as its input, and its backward writes that parameter's gradient in
// float32 — the GEMM's (or the column sum's) float32 sums stored unrounded, where a recorded cast
// would round them to bfloat16 and widen them in a kernel of its own.
struct WideGrads {
  bool weight = false, bias = false;
};
void linear_backward_impl(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                          GradSlot grad_x, GradSlot grad_weight, GradSlot grad_bias, WideGrads wide);
void linear_act_backward_impl(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                              const Tensor& saved, Activation act, GradSlot grad_x,
                              GradSlot grad_weight, GradSlot grad_bias, WideGrads wide);
// Whether t is a parameter Autocast casts (a float32 leaf that requires grad).
bool is_autocast_parameter(const Tensor& t) {
  return t.defined() && t.dtype() == DType::kFloat32 && t.is_leaf() && t.requires_grad();
}
// linear() of operands as given, recorded with `weight_input` and `bias_input` as the node's
// inputs (the operands themselves, or the float32 parameters whose bfloat16 copies they are).
Tensor linear_recorded(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                       const Tensor& weight_input, const Tensor& bias_input);
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear(x, weight, bias, Activation::kNone);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  GW_CHECK(is_valid(act), "linear: the activation is Activation(", static_cast<int>(act),
           "); expected Activation::kNone, kRelu or kGelu");
  if (Tensor x16 = x, w16 = weight, b16 = bias;
      autocast_matrix_operands({&x16, &w16, &b16})) {  // Note [Autocast]
    const bool wide_w = is_autocast_parameter(weight) && w16.dtype() == DType::kBFloat16;
    const bool wide_b = is_autocast_parameter(bias) && b16.dtype() == DType::kBFloat16;
    return linear_recorded(x16, w16, b16, act, wide_w ? weight : w16, wide_b ? bias : b16);
  }
  return linear_recorded(x, weight, bias, act, weight, bias);
}

namespace {
Tensor linear_recorded(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                       const Tensor& weight_input, const Tensor& bias_input) {
  const char* name = linear_name(act);
  detail::NvtxRange range(name);
  const bool grad = needs_grad({&x, &weight_input, &bias_input});
  LinearOut out = linear_impl(x, weight, bias, act, grad);
  if (grad) {
    const WideGrads wide{.weight = weight_input.dtype() != weight.dtype(),
                         .bias = bias.defined() && bias_input.dtype() != bias.dtype()};
    auto backward = [act, wide](const Tensor& g, const std::vector<Tensor>& s,
                                std::span<GradSlot> grads) {
      linear_act_backward_impl(g, s[0], s[1], s.size() > 2 ? s[2] : Tensor(), act, grads[0],
                               grads[1], grads.size() > 2 ? grads[2] : GradSlot{}, wide);
    };
    std::vector<SavedTensor> saved{save("x", x), save("weight", weight)};
    if (act == Activation::kRelu) saved.push_back(save("output", out.y));
    if (act == Activation::kGelu) saved.push_back(save("preactivation", out.z));
    if (out.mask.defined()) saved.push_back(save("relu_mask", out.mask));
    if (bias.defined()) {
      record(name, out.y, {&x, &weight_input, &bias_input}, std::move(saved), backward);
    } else {
      record(name, out.y, {&x, &weight_input}, std::move(saved), backward);
    }
    // Note [Backward epilogue fusion]: any linear layer takes an epilogue on its input gradient;
    // a linear+activation layer may hand its activation backward to its consumer — on the CPU
    // (the same arithmetic as separate steps), and on CUDA where cuBLASLt can read what it needs:
    // the ReLU mask (made above when it could be), GELU's pre-activation (width a multiple of 8).
    Node& node = *out.y.grad_fn();
    node.set_takes_input_epilogue();
    // Two products of the input's rows by the weight's (rows × out × in multiply-adds each).
    node.set_backward_flops(4.0 * static_cast<double>(x.numel()) *
                            static_cast<double>(weight.size(0)));
    const bool cpu = !x.is_cuda();
    const bool fusable = (act == Activation::kRelu && (cpu || out.mask.defined())) ||
                         (act == Activation::kGelu && (cpu || weight.size(0) % 8 == 0));
    if (fusable) {
      node.set_activation_fusion(
          {.act = act,
           .act_input_saved = 2,
           .relu_mask_saved = out.mask.defined() ? 3 : -1,
           .from_preactivation = [wide](const Tensor& g, const std::vector<Tensor>& s,
                                        std::span<GradSlot> grads) {
             linear_backward_impl(g, s[0], s[1], grads[0], grads[1],
                                  grads.size() > 2 ? grads[2] : GradSlot{}, wide);
           }});
    }
  }
  return out.y;
}

LinearOut linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                      bool relu_mask) {
  const char* op = linear_name(act);
  const LinearDims d = check_linear(op, x, weight, bias);
  const std::int64_t n = d.batch * d.out;
  LinearOut o;
  // y [B,out] = act(x [B,in] · Wᵀ + bias): the bias a row broadcast; GELU's input kept in z.
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    if (bias.defined()) {
      scope.read({&x, &weight, &bias});
    } else {
      scope.read({&x, &weight});
    }
    o.y = new_output({d.batch, d.out}, x);
    if (act == Activation::kGelu) o.z = new_output({d.batch, d.out}, x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      T* out = ptr<T>(o.y);
      T* pre = act == Activation::kGelu ? ptr<T>(o.z) : out;
      const T* b = bias.defined() ? ptr<T>(bias) : nullptr;
      const bool has_bias = bias.defined();
      k::Epilogue ep = has_bias ? k::Epilogue::kBias : k::Epilogue::kNone;
      if (act == Activation::kRelu) ep = has_bias ? k::Epilogue::kBiasRelu : k::Epilogue::kRelu;
      if (act == Activation::kGelu) {
        ep = has_bias ? k::Epilogue::kBiasGeluAux : k::Epilogue::kGeluAux;
      }
      // One kernel where cuBLASLt has the epilogue; else the GEMM, the bias and the activation.
      // ReLU's bit mask for a fused backward, where asked for and cuBLASLt writes one.
      bool fused = false;
      if (act == Activation::kRelu && relu_mask) {
        const std::int64_t words = k::relu_mask_bytes(d.batch, d.out) / 4;
        o.mask = Tensor::empty({words}, {DType::kFloat32, x.device()});
        fused = graphward::gemm_epilogue(
            x.device(), scope.stream(), false, true, d.batch, d.out, d.in, ptr<T>(x),
            ptr<T>(weight), out, has_bias ? k::Epilogue::kBiasReluAux : k::Epilogue::kReluAux, b,
            o.mask.raw_data());
        if (!fused) o.mask = Tensor();
      }
      fused = fused || (ep != k::Epilogue::kNone &&
                        graphward::gemm_epilogue(x.device(), scope.stream(), false, true, d.batch,
                                                 d.out, d.in, ptr<T>(x), ptr<T>(weight), out, ep, b,
                                                 o.z.defined() ? pre : nullptr));
      if (!fused) {
        gemm_cuda<T>(scope, x.device(), false, true, d.batch, d.out, d.in, x, weight, false, pre);
        if (has_bias) {
          k::binary_forward(k::BinaryOp::kAdd, pre, pre, n, b, d.out, n, scope.stream());
        }
        if (act == Activation::kRelu) k::relu_forward(out, out, n, scope.stream());
        if (act == Activation::kGelu) k::gelu_forward(out, pre, n, scope.stream());
      }
    });
    return o;
#endif
  }
  (void)relu_mask;  // the CPU backend needs no mask: its fused backward reads the output
  o.y = new_output({d.batch, d.out}, x);
  if (act == Activation::kGelu) o.z = new_output({d.batch, d.out}, x);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& cd) {
    // Bias and activation on the float32 product: one rounding an output, as the CUDA epilogue.
    T* out = cd.out(o.y);
    T* pre = act == Activation::kGelu ? cd.out(o.z) : out;
    gemm_cpu<T>(cd, false, true, d.batch, d.out, d.in, x, weight, false, pre);
    if (bias.defined()) {
      k::cpu::binary_forward<T>(k::BinaryOp::kAdd, pre, pre, n, cd.in(bias), d.out, n);
    }
    if (act == Activation::kRelu) k::cpu::relu_forward<T>(out, out, n);
    if (act == Activation::kGelu) k::cpu::gelu_forward<T>(out, pre, n);
  });
  return o;
}
}  // namespace

void linear_act_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                         const Tensor& saved, Activation act, GradSlot grad_x, GradSlot grad_weight,
                         GradSlot grad_bias) {
  linear_act_backward_impl(grad_out, x, weight, saved, act, grad_x, grad_weight, grad_bias, {});
}

namespace {
// The dtypes of a linear layer's parameter gradients (WideGrads: float32 for bfloat16 operands).
TensorOptions weight_grad_options(const Tensor& weight, WideGrads wide) {
  return {wide.weight ? DType::kFloat32 : weight.dtype(), weight.device()};
}
TensorOptions bias_grad_options(const Tensor& x, WideGrads wide) {
  return {wide.bias ? DType::kFloat32 : x.dtype(), x.device()};
}
void check_wide(const char* op, const Tensor& x, WideGrads wide) {
  GW_CHECK(!(wide.weight || wide.bias) || x.dtype() == DType::kBFloat16, op,
           ": float32 parameter gradients are for bfloat16 operands; x is ", x.str());
}

void linear_act_backward_impl(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                              const Tensor& saved, Activation act, GradSlot grad_x,
                              GradSlot grad_weight, GradSlot grad_bias, WideGrads wide) {
  if (act == Activation::kNone) {
    linear_backward_impl(grad_out, x, weight, grad_x, grad_weight, grad_bias, wide);
    return;
  }
  const char* op = act == Activation::kRelu ? "linear_relu_backward" : "linear_gelu_backward";
  const char* saved_name = act == Activation::kRelu ? "output" : "preactivation";
  // Every check before anything is allocated or written (Note [Check, then write]).
  const LinearDims d = check_linear(op, x, weight, Tensor());
  check_inputs(op, {{"x", &x}, {"grad_out", &grad_out}, {saved_name, &saved}},
               Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == Shape({d.batch, d.out}), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ",
           shape_str({d.batch, d.out}));
  check_same_shape(op, {"grad_out", &grad_out}, {saved_name, &saved});
  check_wide(op, x, wide);
  const bool want_x = check_slot(op, "grad_x", grad_x, x);
  const bool want_w =
      check_slot(op, "grad_weight", grad_weight, weight.shape(), weight_grad_options(weight, wide));
  const bool want_b = check_slot(op, "grad_bias", grad_bias, {d.out}, bias_grad_options(x, wide));
  if (!want_x && !want_w && !want_b) return;
  // dz = dy · act'(·), a temporary; then the linear layer's backward of dz.
  Tensor dz;
  const std::int64_t n = d.batch * d.out;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&grad_out, &saved});
    dz = new_output({d.batch, d.out}, x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      if (act == Activation::kRelu) {
        k::relu_backward(ptr<T>(dz), ptr<T>(grad_out), ptr<T>(saved), n, false, scope.stream());
      } else {
        k::gelu_backward(ptr<T>(dz), ptr<T>(grad_out), ptr<T>(saved), n, false, scope.stream());
      }
    });
#endif
  } else {
    dz = new_output({d.batch, d.out}, x);
    dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& cd) {
      if (act == Activation::kRelu) {
        k::cpu::relu_backward<T>(cd.out(dz), cd.in(grad_out), cd.in(saved), n, false);
      } else {
        k::cpu::gelu_backward<T>(cd.out(dz), cd.in(grad_out), cd.in(saved), n, false);
      }
    });
  }
  linear_backward_impl(dz, x, weight, grad_x, grad_weight, grad_bias, wide);
}

// Note [Backward epilogue fusion]: the checks of grad_x's epilogue (before anything is written).
void check_epilogue(const char* op, const GradEpilogue& ep, const LinearDims& d, const Tensor& x) {
  GW_CHECK(ep.act == Activation::kRelu || ep.act == Activation::kGelu, op,
           ": grad_x's epilogue has no activation; expected ReLU or GELU");
  GW_CHECK(ep.act_input.defined() && ep.act_input.shape() == Shape({d.batch, d.in}) &&
               ep.act_input.dtype() == x.dtype() && ep.act_input.device() == x.device(),
           op, ": grad_x's epilogue reads ", ep.act_input.str(), "; expected the [", d.batch, ", ",
           d.in, "] ", dtype_name(x.dtype()), " activation input on ", x.device().str());
  GW_CHECK(!ep.relu_mask.defined() ||
               (ep.act == Activation::kRelu && x.is_cuda() &&
                ep.relu_mask.nbytes() ==
                    static_cast<std::size_t>(kernels::relu_mask_bytes(d.batch, d.in))),
           op, ": grad_x's epilogue has a ReLU mask of ", ep.relu_mask.nbytes(),
           " bytes; expected ", kernels::relu_mask_bytes(d.batch, d.in), " (CUDA, ReLU only)");
}

#if GRAPHWARD_HAS_CUDA
// WideGrads on CUDA: dW [out,in] = dyᵀ · x and db = Σ_rows dy of bfloat16 dy and x, each into its
// slot (opened already; an undefined slot is not wanted) in float32 where `wide` says so — the
// bias gradient in the weight-gradient GEMM's epilogue where both are float32 and written.
void wide_param_grads(const CudaScope& scope, Device device, const LinearDims& d,
                      const Tensor& grad_out, const Tensor& x, GradSlot grad_weight, bool acc_w,
                      GradSlot grad_bias, bool acc_b, WideGrads wide) {
  const bool want_w = grad_weight.tensor != nullptr, want_b = grad_bias.tensor != nullptr;
  const bf16* dy = ptr<bf16>(grad_out);
  const bf16* xs = ptr<bf16>(x);
  bool bias_done = false;
  if (want_w && want_b && !acc_b && wide.weight && wide.bias) {
    bias_done = graphward::gemm_bias_grad(device, scope.stream(), true, false, d.out, d.in, d.batch,
                                          1.f, dy, xs, acc_w ? 1.f : 0.f,
                                          slot_ptr<float>(grad_weight), slot_ptr<float>(grad_bias));
  }
  if (want_w && !bias_done) {
    if (wide.weight) {
      graphward::gemm(device, scope.stream(), true, false, d.out, d.in, d.batch, 1.f, dy, xs,
                      acc_w ? 1.f : 0.f, slot_ptr<float>(grad_weight));
    } else {
      gemm_cuda<bf16>(scope, device, true, false, d.out, d.in, d.batch, grad_out, x, acc_w,
                      slot_ptr<bf16>(grad_weight));
    }
  }
  if (want_b && !bias_done) {
    if (wide.bias) {
      k::column_sum(slot_ptr<float>(grad_bias), dy, 1.f, d.batch, d.out, acc_b, scope.stream());
    } else {
      k::column_sum<bf16>(slot_ptr<bf16>(grad_bias), dy, nullptr, 1.f, d.batch, d.out, acc_b,
                          scope.stream());
    }
  }
}
#endif

void linear_backward_impl(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                          GradSlot grad_x, GradSlot grad_weight, GradSlot grad_bias,
                          WideGrads wide) {
  const char* op = "linear_backward";
  const LinearDims d = check_linear(op, x, weight, Tensor());
  check_inputs(op, {{"x", &x}, {"grad_out", &grad_out}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == Shape({d.batch, d.out}), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ",
           shape_str({d.batch, d.out}));
  check_wide(op, x, wide);
  const TensorOptions w_opt = weight_grad_options(weight, wide);
  const TensorOptions b_opt = bias_grad_options(x, wide);
  const bool want_x = check_slot(op, "grad_x", grad_x, x);
  const bool want_w = check_slot(op, "grad_weight", grad_weight, weight.shape(), w_opt);
  const bool want_b = check_slot(op, "grad_bias", grad_bias, {d.out}, b_opt);
  // Note [Backward epilogue fusion]: grad_x is then the pre-activation gradient of the layer
  // that made x.
  const GradEpilogue* ep = want_x ? grad_x.epilogue : nullptr;
  if (ep) {
    check_epilogue(op, *ep, d, x);
    GW_CHECK(!grad_x.accumulate, op,
             ": grad_x has an epilogue and accumulates; an epilogue "
             "writes the sole gradient of its layer");
  }
  const std::int64_t nx = d.batch * d.in;
  // dx [B,in] = dy [B,out] · W [out,in];  dW [out,in] = dyᵀ · x;  db [out] = Σ_rows dy
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&grad_out, &x, &weight});
    if (ep) {
      if (ep->relu_mask.defined()) {
        scope.read({&ep->act_input, &ep->relu_mask});
      } else {
        scope.read({&ep->act_input});
      }
    }
    dispatch_cuda(x.dtype(), [&]<class T>() {
      if (want_x && ep) {
        (void)open_slot(grad_x, x, scope.stream());
        T* dz = slot_ptr<T>(grad_x);
        const bool relu = ep->act == Activation::kRelu;
        const void* aux = relu ? (ep->relu_mask.defined() ? ep->relu_mask.raw_data() : nullptr)
                               : ep->act_input.raw_data();
        const bool fused =
            aux != nullptr &&
            graphward::gemm_act_grad(x.device(), scope.stream(), false, false, d.batch, d.in, d.out,
                                     ptr<T>(grad_out), ptr<T>(weight), dz,
                                     relu ? k::Epilogue::kDRelu : k::Epilogue::kDGelu, aux);
        if (!fused) {  // the same arithmetic in two kernels
          gemm_cuda<T>(scope, x.device(), false, false, d.batch, d.in, d.out, grad_out, weight,
                       false, dz);
          if (relu) {
            k::relu_backward(dz, dz, ptr<T>(ep->act_input), nx, false, scope.stream());
          } else {
            k::gelu_backward(dz, dz, ptr<T>(ep->act_input), nx, false, scope.stream());
          }
        }
      } else if (want_x) {
        const bool acc = open_slot(grad_x, x, scope.stream());
        gemm_cuda<T>(scope, x.device(), false, false, d.batch, d.in, d.out, grad_out, weight, acc,
                     slot_ptr<T>(grad_x));
      }
      const bool acc_w = want_w && open_slot(grad_weight, weight.shape(), w_opt, scope.stream());
      const bool acc_b = want_b && open_slot(grad_bias, {d.out}, b_opt, scope.stream());
      if (wide.weight || wide.bias) {  // bfloat16 operands, a float32 gradient or two
        wide_param_grads(scope, x.device(), d, grad_out, x, want_w ? grad_weight : GradSlot{},
                         acc_w, want_b ? grad_bias : GradSlot{}, acc_b, wide);
        return;
      }
      // The bias gradient rides in the weight-gradient GEMM's epilogue when it is written (the
      // epilogue cannot accumulate): one launch fewer per layer.
      bool bias_done = false;
      if (want_w && want_b && !acc_b) {
        bias_done = graphward::gemm_bias_grad(
            x.device(), scope.stream(), true, false, d.out, d.in, d.batch, 1.f, ptr<T>(grad_out),
            ptr<T>(x), acc_w ? 1.f : 0.f, slot_ptr<T>(grad_weight), slot_ptr<T>(grad_bias));
      }
      if (want_w && !bias_done) {
        gemm_cuda<T>(scope, x.device(), true, false, d.out, d.in, d.batch, grad_out, x, acc_w,
                     slot_ptr<T>(grad_weight));
      }
      if (want_b && !bias_done) {
        k::column_sum<T>(slot_ptr<T>(grad_bias), ptr<T>(grad_out), nullptr, 1.f, d.batch, d.out,
                         acc_b, scope.stream());
      }
    });
    return;
#endif
  }
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& cd) {
    if (want_x) {
      const bool acc = open_slot(grad_x, x, nullptr);
      T* dx = slot_out(cd, grad_x, acc);
      gemm_cpu<T>(cd, false, false, d.batch, d.in, d.out, grad_out, weight, acc, dx);
      if (ep) {  // the pre-activation gradient of x's layer, on the float32 product
        if (ep->act == Activation::kRelu) {
          k::cpu::relu_backward<T>(dx, dx, cd.in(ep->act_input), nx, false);
        } else {
          k::cpu::gelu_backward<T>(dx, dx, cd.in(ep->act_input), nx, false);
        }
      }
    }
    // A float32 gradient of bfloat16 operands (WideGrads) is written unrounded: its tensor is
    // float32, which CpuData hands the kernel as it is.
    if (want_w) {
      const bool acc = open_slot(grad_weight, weight.shape(), w_opt, nullptr);
      gemm_cpu<T>(cd, true, false, d.out, d.in, d.batch, grad_out, x, acc,
                  slot_out(cd, grad_weight, acc));
    }
    if (want_b) {
      const bool acc = open_slot(grad_bias, {d.out}, b_opt, nullptr);
      k::cpu::column_sum<T>(slot_out(cd, grad_bias, acc), cd.in(grad_out), nullptr, T(1), d.batch,
                            d.out, acc);
    }
  });
}

}  // namespace

void linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, GradSlot grad_x,
                     GradSlot grad_weight, GradSlot grad_bias) {
  linear_backward_impl(grad_out, x, weight, grad_x, grad_weight, grad_bias, {});
}

}  // namespace graphward
