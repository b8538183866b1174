// Reductions and losses: sum, mean, mse_loss. Results are 0-d tensors that stay on the device.
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/reduce.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {

// A scalar result (a sum, a loss) of data like `x`: float32 for bfloat16 data.
Tensor new_scalar(const Tensor& x) {
  return Tensor::empty({}, {statistics_dtype(x.dtype()), x.device()});
}
// grad_out: one element, of the scalar's dtype for data of `x_dtype`, on `device`.
void check_scalar_grad(const char* op, const Tensor& grad_out, DType x_dtype, Device device) {
  check_inputs(op, {{"grad_out", &grad_out}});
  GW_CHECK(grad_out.numel() == 1, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected one element (the gradient of a scalar)");
  GW_CHECK(grad_out.dtype() == statistics_dtype(x_dtype) && grad_out.device() == device, op,
           ": grad_out is ", grad_out.str(), "; expected ", dtype_name(statistics_dtype(x_dtype)),
           " on ", device.str(), " (the dtype of the scalar for ", dtype_name(x_dtype), " data)");
}

Tensor reduce(const char* op, const Tensor& x, bool mean) {
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  const std::int64_t n = x.numel();
  const double scale = mean ? 1.0 / static_cast<double>(n) : 1.0;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    Tensor y = new_scalar(x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      k::sum_forward(y.data<float>(), ptr<T>(x), static_cast<float>(scale), n, scope.stream());
    });
    return y;
#endif
  }
  Tensor y = new_scalar(x);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::sum_forward<T>(d.out(y), d.in(x), T(scale), n);
  });
  return y;
}

// The gradient of a reduction over an input of `x_shape` and `x` (dtype and device; x itself is
// never read).
void reduce_backward(const char* op, const Tensor& grad_out, const Shape& x_shape,
                     TensorOptions x_options, GradSlot grad_x, bool mean) {
  check_scalar_grad(op, grad_out, x_options.dtype, x_options.device);
  const std::int64_t n = shape_numel(x_shape);
  GW_CHECK(n > 0, op, ": x has shape ", shape_str(x_shape), "; expected at least one element");
  const DType x_dtype = x_options.dtype;
  if (!check_slot(op, "grad_x", grad_x, x_shape, x_options)) return;
  const double scale = mean ? 1.0 / static_cast<double>(n) : 1.0;
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_x, x_shape, x_options, scope.stream());
    dispatch_cuda(x_dtype, [&]<class T>() {
      k::sum_backward(slot_ptr<T>(grad_x), grad_out.data<float>(), static_cast<float>(scale), n,
                      acc, scope.stream());
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_x, x_shape, x_options, nullptr);
  dispatch_cpu_data(x_dtype, [&]<class T>(CpuData<T>& d) {
    k::cpu::sum_backward<T>(slot_out(d, grad_x, acc), d.in(grad_out), T(scale), n, acc);
  });
}

}  // namespace

namespace {
Tensor recorded_reduce(const char* op, const Tensor& x, bool is_mean) {
  detail::NvtxRange range(op);
  Tensor y = reduce(op, x, is_mean);
  if (needs_grad({&x})) {
    // The backward needs x's shape only: nothing is saved (x written in place after the op does
    // not fail the backward, as in PyTorch).
    record(op, y, {&x}, {},
           [is_mean, shape = x.shape(), options = TensorOptions{x.dtype(), x.device()}](
               const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
             reduce_backward(is_mean ? "mean_backward" : "sum_backward", g, shape, options,
                             grads[0], is_mean);
           },
           {NodeAttribute::integer(is_mean)});
  }
  return y;
}
}  // namespace

Tensor sum(const Tensor& x) {
  return recorded_reduce("sum", x, false);
}
Tensor mean(const Tensor& x) {
  return recorded_reduce("mean", x, true);
}
void sum_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x) {
  check_inputs("sum_backward", {{"x", &x}}, Bf16::kEverywhere);
  reduce_backward("sum_backward", grad_out, x.shape(), {x.dtype(), x.device()}, grad_x, false);
}
void mean_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x) {
  check_inputs("mean_backward", {{"x", &x}}, Bf16::kEverywhere);
  reduce_backward("mean_backward", grad_out, x.shape(), {x.dtype(), x.device()}, grad_x, true);
}

namespace {
Tensor mse_loss_impl(const Tensor& pred, const Tensor& target);
}

Tensor mse_loss(const Tensor& pred, const Tensor& target) {
  detail::NvtxRange range("mse_loss");
  Tensor y = mse_loss_impl(pred, target);
  if (needs_grad({&pred, &target})) {
    record("mse_loss", y, {&pred, &target}, {save("pred", pred), save("target", target)},
           [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             mse_loss_backward(g, s[0], s[1], grads[0], grads[1]);
           });
  }
  return y;
}

namespace {
Tensor mse_loss_impl(const Tensor& pred, const Tensor& target) {
  const char* op = "mse_loss";
  check_inputs(op, {{"pred", &pred}, {"target", &target}}, Bf16::kEverywhere);
  check_same_shape(op, {"pred", &pred}, {"target", &target});
  const std::int64_t n = pred.numel();
  if (pred.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(pred.device());
    scope.read({&pred, &target});
    Tensor y = new_scalar(pred);
    dispatch_cuda(pred.dtype(), [&]<class T>() {
      k::mse_loss_forward(y.data<float>(), ptr<T>(pred), ptr<T>(target), n, scope.stream());
    });
    return y;
#endif
  }
  Tensor y = new_scalar(pred);
  dispatch_cpu_data(pred.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::mse_loss_forward<T>(d.out(y), d.in(pred), d.in(target), n);
  });
  return y;
}
}  // namespace

void mse_loss_backward(const Tensor& grad_out, const Tensor& pred, const Tensor& target,
                       GradSlot grad_pred, GradSlot grad_target) {
  const char* op = "mse_loss_backward";
  check_inputs(op, {{"pred", &pred}, {"target", &target}}, Bf16::kEverywhere);
  check_same_shape(op, {"pred", &pred}, {"target", &target});
  check_scalar_grad(op, grad_out, pred.dtype(), pred.device());
  const bool want_p = check_slot(op, "grad_pred", grad_pred, pred);
  const bool want_t = check_slot(op, "grad_target", grad_target, target);
  if (!want_p && !want_t) return;
  const std::int64_t n = pred.numel();
  if (pred.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(pred.device());
    scope.read({&grad_out, &pred, &target});
    const bool acc_p = want_p && open_slot(grad_pred, pred, scope.stream());
    const bool acc_t = want_t && open_slot(grad_target, target, scope.stream());
    dispatch_cuda(pred.dtype(), [&]<class T>() {
      k::mse_loss_backward(want_p ? slot_ptr<T>(grad_pred) : nullptr,
                           want_t ? slot_ptr<T>(grad_target) : nullptr, grad_out.data<float>(),
                           ptr<T>(pred), ptr<T>(target), n, acc_p, acc_t, scope.stream());
    });
    return;
#endif
  }
  const bool acc_p = want_p && open_slot(grad_pred, pred, nullptr);
  const bool acc_t = want_t && open_slot(grad_target, target, nullptr);
  dispatch_cpu_data(pred.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::mse_loss_backward<T>(want_p ? slot_out(d, grad_pred, acc_p) : nullptr,
                                 want_t ? slot_out(d, grad_target, acc_t) : nullptr,
                                 d.in(grad_out), d.in(pred), d.in(target), n, acc_p, acc_t);
  });
}

}  // namespace graphward
