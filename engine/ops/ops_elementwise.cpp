// Elementwise ops: add, sub, mul (tensor and scalar forms) and the activations.
#include <cstring>

#include "graphward/engine/ops/autocast.h"
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/reduce.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {

// How two operands broadcast (see ops.h): the output shape and each operand's period.
struct Broadcast {
  Shape out_shape;
  std::int64_t n = 0;         // output elements
  std::int64_t a_period = 0;  // n, or the row length for a row operand
  std::int64_t b_period = 0;
  std::int64_t cols = 0;  // the output's last dimension
};

bool is_row(const Tensor& t) {
  return t.dim() == 1 || (t.dim() == 2 && t.size(0) == 1);
}

Broadcast broadcast(const char* op, const Tensor& a, const Tensor& b) {
  check_inputs(op, {{"a", &a}, {"b", &b}}, Bf16::kEverywhere);
  Broadcast bc;
  if (a.shape() == b.shape()) {
    bc.out_shape = a.shape();
  } else if (is_row(b) && a.dim() >= 1 && a.size(-1) == b.numel() && a.numel() >= b.numel()) {
    // [3] with [1, 3] is [1, 3] whichever comes first: of two rows, the one of higher rank.
    bc.out_shape = a.numel() == b.numel() && b.dim() > a.dim() ? b.shape() : a.shape();
  } else if (is_row(a) && b.dim() >= 1 && b.size(-1) == a.numel() && b.numel() >= a.numel()) {
    bc.out_shape = b.shape();
  } else if (is_trailing_shape(b, a)) {
    bc.out_shape = a.shape();
  } else if (is_trailing_shape(a, b)) {
    bc.out_shape = b.shape();
  } else {
    GW_CHECK(false, op, ": shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             " do not broadcast; expected equal shapes, a row [n] / [1, n] with a tensor whose "
             "last dimension is n, or one shape the trailing dimensions of the other ([T, D] with "
             "[B, T, D])");
  }
  bc.n = shape_numel(bc.out_shape);
  bc.cols = bc.out_shape.empty() ? 1 : bc.out_shape.back();
  bc.a_period = a.numel() == bc.n ? bc.n : a.numel();
  bc.b_period = b.numel() == bc.n ? bc.n : b.numel();
  return bc;
}

Tensor binary(const char* op, k::BinaryOp kind, const Tensor& a, const Tensor& b) {
  const Broadcast bc = broadcast(op, a, b);
  if (a.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(a.device());
    scope.read({&a, &b});
    Tensor y = new_output(bc.out_shape, a);
    dispatch_cuda(a.dtype(), [&]<class T>() {
      k::binary_forward(kind, ptr<T>(y), ptr<T>(a), bc.a_period, ptr<T>(b), bc.b_period, bc.n,
                        scope.stream());
    });
    return y;
#endif
  }
  Tensor y = new_output(bc.out_shape, a);
  dispatch_cpu_data(a.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::binary_forward<T>(kind, d.out(y), d.in(a), bc.a_period, d.in(b), bc.b_period, bc.n);
  });
  return y;
}

// Backward of a, b -> a (op) b. `sign_b` is +1 (add) or -1 (sub); for mul it is unused.
void binary_backward(const char* op, k::BinaryOp kind, const Tensor& grad_out, const Tensor& a,
                     const Tensor& b, GradSlot grad_a, GradSlot grad_b) {
  const Broadcast bc = broadcast(op, a, b);
  check_inputs(op, {{"grad_out", &grad_out}, {"a", &a}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == bc.out_shape, op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ", shape_str(bc.out_shape));
  const bool want_a = check_slot(op, "grad_a", grad_a, a);
  const bool want_b = check_slot(op, "grad_b", grad_b, b);

  // Gradient of one operand: `other` is the other operand (mul), `sign` the factor (add/sub).
  auto run_cuda = [&](cudaStream_t s, const GradSlot& slot, const Tensor& self, std::int64_t period,
                      const Tensor& other, std::int64_t other_period, float sign) {
#if GRAPHWARD_HAS_CUDA
    const bool acc = open_slot(slot, self, s);
    dispatch_cuda(grad_out.dtype(), [&]<class T>() {
      T* dst = slot_ptr<T>(slot);
      const T* dy = ptr<T>(grad_out);
      if (period == bc.n) {  // full shape
        if (kind == k::BinaryOp::kMul) {
          k::mul_backward(dst, dy, ptr<T>(other), other_period, bc.n, acc, s);
        } else {
          k::scale_backward(dst, dy, sign, bc.n, acc, s);
        }
      } else {  // repeated (a row, trailing dimensions): summed over the repeats
        const T* weight = kind == k::BinaryOp::kMul ? ptr<T>(other) : nullptr;
        k::column_sum<T>(dst, dy, weight, sign, bc.n / period, period, acc, s);
      }
    });
#else
    (void)s, (void)slot, (void)self, (void)period, (void)other, (void)other_period, (void)sign;
#endif
  };
  auto run_cpu = [&]<class T>(CpuData<T>& d, const GradSlot& slot, const Tensor& self,
                              std::int64_t period, const Tensor& other, std::int64_t other_period,
                              T sign) {
    const bool acc = open_slot(slot, self, nullptr);
    T* dst = acc ? d.inout(*slot.tensor) : d.out(*slot.tensor);
    const T* dy = d.in(grad_out);
    if (period == bc.n) {
      if (kind == k::BinaryOp::kMul) {
        k::cpu::mul_backward<T>(dst, dy, d.in(other), other_period, bc.n, acc);
      } else {
        k::cpu::scale_backward<T>(dst, dy, sign, bc.n, acc);
      }
    } else {
      // mul with a row operand whose partner is full: Σ_rows dy * other (other has the full shape).
      const T* weight = kind == k::BinaryOp::kMul ? d.in(other) : nullptr;
      k::cpu::column_sum<T>(dst, dy, weight, sign, bc.n / period, period, acc);
    }
  };
  const float sign_b = kind == k::BinaryOp::kSub ? -1.f : 1.f;
  // A gradient that equals grad_out (a full-shape operand of add, the first of sub) is passed
  // through without a copy where the slot allows sharing (GradSlot::may_share).
  auto pass_through = [&](const GradSlot& slot, const Tensor& self, float sign) {
    if (kind == k::BinaryOp::kMul || sign != 1.f || !slot.may_share || slot.accumulate ||
        slot.tensor->defined() || self.shape() != grad_out.shape()) {
      return false;
    }
    *slot.tensor = grad_out;
    return true;
  };
  const bool share_a = want_a && pass_through(grad_a, a, 1.f);
  const bool share_b = want_b && pass_through(grad_b, b, sign_b);
  if (a.is_cuda()) {
    CudaScope scope(a.device());
    scope.read({&grad_out, &a, &b});
    if (want_a && !share_a) run_cuda(scope.stream(), grad_a, a, bc.a_period, b, bc.b_period, 1.f);
    if (want_b && !share_b)
      run_cuda(scope.stream(), grad_b, b, bc.b_period, a, bc.a_period, sign_b);
    return;
  }
  dispatch_cpu_data(a.dtype(), [&]<class T>(CpuData<T>& d) {
    if (want_a && !share_a) {
      run_cpu.template operator()<T>(d, grad_a, a, bc.a_period, b, bc.b_period, T(1));
    }
    if (want_b && !share_b) {
      run_cpu.template operator()<T>(d, grad_b, b, bc.b_period, a, bc.a_period, T(sign_b));
    }
  });
}

Tensor affine(const char* op, const Tensor& x, double alpha, double beta) {
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    Tensor y = new_output(x.shape(), x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      k::affine_forward(ptr<T>(y), ptr<T>(x), static_cast<float>(alpha), static_cast<float>(beta),
                        x.numel(), scope.stream());
    });
    return y;
#endif
  }
  Tensor y = new_output(x.shape(), x);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::affine_forward<T>(d.out(y), d.in(x), T(alpha), T(beta), x.numel());
  });
  return y;
}

// The pointwise activations. Their backward reads the output y, except GELU's, which reads the
// input x (passed as `y` below: the tensor the node saved).
enum class Pointwise { kRelu, kTanh, kSigmoid, kGelu };

Tensor activation(const char* op, Pointwise act, const Tensor& x) {
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    Tensor y = new_output(x.shape(), x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      T* out = ptr<T>(y);
      const T* in = ptr<T>(x);
      switch (act) {
        case Pointwise::kRelu:
          k::relu_forward(out, in, x.numel(), scope.stream());
          break;
        case Pointwise::kTanh:
          k::tanh_forward(out, in, x.numel(), scope.stream());
          break;
        case Pointwise::kSigmoid:
          k::sigmoid_forward(out, in, x.numel(), scope.stream());
          break;
        case Pointwise::kGelu:
          k::gelu_forward(out, in, x.numel(), scope.stream());
          break;
      }
    });
    return y;
#endif
  }
  Tensor y = new_output(x.shape(), x);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    T* out = d.out(y);
    const T* in = d.in(x);
    switch (act) {
      case Pointwise::kRelu:
        k::cpu::relu_forward<T>(out, in, x.numel());
        break;
      case Pointwise::kTanh:
        k::cpu::tanh_forward<T>(out, in, x.numel());
        break;
      case Pointwise::kSigmoid:
        k::cpu::sigmoid_forward<T>(out, in, x.numel());
        break;
      case Pointwise::kGelu:
        k::cpu::gelu_forward<T>(out, in, x.numel());
        break;
    }
  });
  return y;
}

void activation_backward(const char* op, Pointwise act, const Tensor& grad_out, const Tensor& y,
                         GradSlot grad_x) {
  const char* saved = act == Pointwise::kGelu ? "x" : "y";
  check_inputs(op, {{"grad_out", &grad_out}, {saved, &y}}, Bf16::kEverywhere);
  check_same_shape(op, {"grad_out", &grad_out}, {saved, &y});
  if (!check_slot(op, "grad_x", grad_x, y)) return;
  const std::int64_t n = y.numel();
  // In place (GradSlot::may_share): dx overwrites dy elementwise, in grad_out's own memory, when
  // no other handle can see it and no other stream ever used that memory (another stream may still
  // be reading it on the GPU: a handle count says nothing about queued work); then the slot takes
  // grad_out. Saves an allocation and a free.
  bool in_place =
      grad_x.may_share && !grad_x.accumulate && !grad_x.tensor->defined() && grad_out.is_unique();
  if (y.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(y.device());
    in_place = in_place && grad_out.storage()->used_only_on(scope.stream());
    scope.read({&grad_out, &y});
    if (in_place) {
      grad_out.storage()->sync_for_write(scope.stream());
      grad_out.bump_version();
      *grad_x.tensor = grad_out;
    }
    const bool acc = !in_place && open_slot(grad_x, y, scope.stream());
    dispatch_cuda(y.dtype(), [&]<class T>() {
      T* dx = slot_ptr<T>(grad_x);
      const T *dy = ptr<T>(grad_out), *out = ptr<T>(y);
      switch (act) {
        case Pointwise::kRelu:
          k::relu_backward(dx, dy, out, n, acc, scope.stream());
          break;
        case Pointwise::kTanh:
          k::tanh_backward(dx, dy, out, n, acc, scope.stream());
          break;
        case Pointwise::kSigmoid:
          k::sigmoid_backward(dx, dy, out, n, acc, scope.stream());
          break;
        case Pointwise::kGelu:
          k::gelu_backward(dx, dy, out, n, acc, scope.stream());
          break;
      }
    });
    return;
#endif
  }
  if (in_place) {
    grad_out.bump_version();
    *grad_x.tensor = grad_out;
  }
  const bool acc = !in_place && open_slot(grad_x, y, nullptr);
  dispatch_cpu_data(y.dtype(), [&]<class T>(CpuData<T>& d) {
    // In place, dx is dy's storage: one widened copy serves both (CpuData keys by address).
    const T *dy = d.in(grad_out), *out = d.in(y);
    T* dx = acc || in_place ? d.inout(*grad_x.tensor) : d.out(*grad_x.tensor);
    switch (act) {
      case Pointwise::kRelu:
        k::cpu::relu_backward<T>(dx, dy, out, n, acc);
        break;
      case Pointwise::kTanh:
        k::cpu::tanh_backward<T>(dx, dy, out, n, acc);
        break;
      case Pointwise::kSigmoid:
        k::cpu::sigmoid_backward<T>(dx, dy, out, n, acc);
        break;
      case Pointwise::kGelu:
        k::cpu::gelu_backward<T>(dx, dy, out, n, acc);
        break;
    }
  });
}

}  // namespace

namespace {
using BinaryBackward = void (*)(const Tensor&, const Tensor&, const Tensor&, GradSlot, GradSlot);

BinaryBackward binary_backward_of(k::BinaryOp kind) {
  switch (kind) {
    case k::BinaryOp::kAdd:
      return add_backward;
    case k::BinaryOp::kSub:
      return sub_backward;
    case k::BinaryOp::kMul:
      break;
  }
  return mul_backward;
}
}  // namespace

void ops_detail::record_binary(const char* op, k::BinaryOp kind, const Tensor& a, const Tensor& b,
                               const Tensor& y) {
  if (!needs_grad({&a, &b})) return;
  const BinaryBackward backward = binary_backward_of(kind);
  if (kind != k::BinaryOp::kMul) {
    // add and sub read no operand, only their shapes: nothing is saved (an operand written in
    // place after the op does not fail the backward, as in PyTorch). Their backward is handed a
    // handle of each operand's shape over grad_out's memory, which is at least that large.
    record(op, y, {&a, &b}, {},
           [backward, a_shape = a.shape(), b_shape = b.shape()](
               const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
             backward(g, Tensor::from_storage(g.storage(), a_shape, g.dtype()),
                      Tensor::from_storage(g.storage(), b_shape, g.dtype()), grads[0], grads[1]);
           });
  } else {
    record(op, y, {&a, &b}, {save("a", a), save("b", b)},
           [backward](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             backward(g, s[0], s[1], grads[0], grads[1]);
           });
  }
  // add of equal shapes passes its gradient through to both operands (add_backward).
  if (kind == k::BinaryOp::kAdd && a.shape() == y.shape() && b.shape() == y.shape()) {
    y.grad_fn()->set_passes_gradient_through();
  }
}

namespace {
Tensor recorded_binary(const char* op, k::BinaryOp kind, const Tensor& a_in, const Tensor& b_in) {
  detail::NvtxRange range(op);
  Tensor a = a_in, b = b_in;
  autocast_promote({&a, &b});  // Note [Autocast]
  Tensor y = binary(op, kind, a, b);
  record_binary(op, kind, a, b, y);
  return y;
}

Tensor recorded_affine(const char* op, const Tensor& x, double alpha, double beta) {
  detail::NvtxRange range(op);
  Tensor y = affine(op, x, alpha, beta);
  if (needs_grad({&x})) {
    record(op, y, {&x}, {},
           [alpha](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
             scale_backward(g, alpha, grads[0]);
           },
           {NodeAttribute::number(alpha)});  // Note [Node attributes]
  }
  return y;
}

using ActivationBackward = void (*)(const Tensor&, const Tensor&, GradSlot);

Tensor recorded_activation(const char* op, Pointwise act, ActivationBackward backward,
                           const Tensor& x) {
  detail::NvtxRange range(op);
  Tensor y = activation(op, act, x);
  if (needs_grad({&x})) {
    record(op, y, {&x}, {act == Pointwise::kGelu ? save("input", x) : save("output", y)},
           [backward](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             backward(g, s[0], grads[0]);
           });
  }
  return y;
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return recorded_binary("add", k::BinaryOp::kAdd, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return recorded_binary("sub", k::BinaryOp::kSub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return recorded_binary("mul", k::BinaryOp::kMul, a, b);
}

void add_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                  GradSlot grad_b) {
  binary_backward("add_backward", k::BinaryOp::kAdd, grad_out, a, b, grad_a, grad_b);
}
void sub_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                  GradSlot grad_b) {
  binary_backward("sub_backward", k::BinaryOp::kSub, grad_out, a, b, grad_a, grad_b);
}
void mul_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                  GradSlot grad_b) {
  binary_backward("mul_backward", k::BinaryOp::kMul, grad_out, a, b, grad_a, grad_b);
}

Tensor add(const Tensor& a, double s) {
  check_finite_scalar("add", s, a);
  return recorded_affine("add", a, 1.0, s);
}
Tensor sub(const Tensor& a, double s) {
  check_finite_scalar("sub", s, a);
  return recorded_affine("sub", a, 1.0, -s);
}
Tensor mul(const Tensor& a, double s) {
  check_finite_scalar("mul", s, a);
  return recorded_affine("mul", a, s, 0.0);
}

void scale_backward(const Tensor& grad_out, double scale, GradSlot grad_a) {
  const char* op = "scale_backward";
  check_finite_scalar(op, scale, grad_out);
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  if (!check_slot(op, "grad_a", grad_a, grad_out)) return;
  const std::int64_t n = grad_out.numel();
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_a, grad_out, scope.stream());
    dispatch_cuda(grad_out.dtype(), [&]<class T>() {
      k::scale_backward(slot_ptr<T>(grad_a), ptr<T>(grad_out), static_cast<float>(scale), n, acc,
                        scope.stream());
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_a, grad_out, nullptr);
  dispatch_cpu_data(grad_out.dtype(), [&]<class T>(CpuData<T>& d) {
    T* dx = acc ? d.inout(*grad_a.tensor) : d.out(*grad_a.tensor);
    k::cpu::scale_backward<T>(dx, d.in(grad_out), T(scale), n, acc);
  });
}

Tensor relu(const Tensor& x) {
  return recorded_activation("relu", Pointwise::kRelu, relu_backward, x);
}
Tensor tanh(const Tensor& x) {
  return recorded_activation("tanh", Pointwise::kTanh, tanh_backward, x);
}
Tensor sigmoid(const Tensor& x) {
  return recorded_activation("sigmoid", Pointwise::kSigmoid, sigmoid_backward, x);
}
Tensor gelu(const Tensor& x) {
  return recorded_activation("gelu", Pointwise::kGelu, gelu_backward, x);
}

void add_(const Tensor& a, const Tensor& b, double alpha) {
  const char* op = "add_";
  detail::NvtxRange range(op);
  check_finite_scalar(op, alpha, a);
  check_inputs(op, {{"a", &a}, {"b", &b}}, Bf16::kEverywhere);
  check_same_shape(op, {"a", &a}, {"b", &b});
  GW_CHECK(!(grad_mode_enabled() && a.requires_grad()), op, ": ", a.str(),
           " requires grad; in-place ops are not recorded on the tape: update it inside a "
           "NoGradGuard scope (as an optimizer does)");
  Tensor target = a;
  scale_backward(b, alpha, {&target, /*accumulate=*/true});  // a += alpha * b; bumps a's version
}

void copy_(const Tensor& dst, const Tensor& src) {
  const char* op = "copy_";
  detail::NvtxRange range(op);
  // Any dtype (int32 targets into a static slot too): a byte copy, after the usual checks.
  GW_CHECK(dst.defined() && src.defined(), op, ": expected two defined tensors");
  GW_CHECK(dst.device() == src.device() && dst.dtype() == src.dtype(), op, ": dst is ", dst.str(),
           ", src is ", src.str(), "; expected one device and one dtype");
  check_same_shape(op, {"dst", &dst}, {"src", &src});
  GW_CHECK(!(grad_mode_enabled() && dst.requires_grad()), op, ": ", dst.str(),
           " requires grad; in-place ops are not recorded on the tape: copy into it inside a "
           "NoGradGuard scope");
  if (dst.nbytes() == 0 || dst.raw_data() == src.raw_data()) return;
  if (dst.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(dst.device());
    scope.read({&src});
    dst.storage()->sync_for_write(scope.stream());
    GW_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                  cudaMemcpyDeviceToDevice, scope.stream()));
#endif
  } else {
    std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
  }
  dst.bump_version();
}

void relu_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x) {
  activation_backward("relu_backward", Pointwise::kRelu, grad_out, y, grad_x);
}
void tanh_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x) {
  activation_backward("tanh_backward", Pointwise::kTanh, grad_out, y, grad_x);
}
void sigmoid_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x) {
  activation_backward("sigmoid_backward", Pointwise::kSigmoid, grad_out, y, grad_x);
}
void gelu_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x) {
  activation_backward("gelu_backward", Pointwise::kGelu, grad_out, x, grad_x);
}

}  // namespace graphward
