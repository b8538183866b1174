// Reductions and losses: sum, mean, mse_loss. Results are 0-d tensors that stay on the device.
#include "kernels/reduce.h"
#include "ops/ops_common.h"
#include "runtime/nvtx.h"
#include "tape/autograd.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {

Tensor reduce(const char* op, const Tensor& x, bool mean) {
  check_inputs(op, {{"x", &x}});
  const std::int64_t n = x.numel();
  const double scale = mean ? 1.0 / static_cast<double>(n) : 1.0;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    Tensor y = new_output({}, x);
    k::sum_forward(y.data<float>(), x.data<float>(), static_cast<float>(scale), n, scope.stream());
    return y;
#endif
  }
  Tensor y = new_output({}, x);
  dispatch_cpu(x.dtype(),
               [&]<class T>() { k::cpu::sum_forward<T>(ptr<T>(y), ptr<T>(x), T(scale), n); });
  return y;
}

// The gradient of a reduction over an input of `x_shape` (x itself is never read).
void reduce_backward(const char* op, const Tensor& grad_out, const Shape& x_shape, GradSlot grad_x,
                     bool mean) {
  check_inputs(op, {{"grad_out", &grad_out}});
  GW_CHECK(grad_out.numel() == 1, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected one element (the gradient of a scalar)");
  const std::int64_t n = shape_numel(x_shape);
  GW_CHECK(n > 0, op, ": x has shape ", shape_str(x_shape), "; expected at least one element");
  if (!check_slot(op, "grad_x", grad_x, x_shape, grad_out)) return;
  const double scale = mean ? 1.0 / static_cast<double>(n) : 1.0;
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_x, x_shape, grad_out, scope.stream());
    k::sum_backward(grad_x.tensor->data<float>(), grad_out.data<float>(), static_cast<float>(scale),
                    n, acc, scope.stream());
    return;
#endif
  }
  const bool acc = open_slot(grad_x, x_shape, grad_out, nullptr);
  dispatch_cpu(grad_out.dtype(), [&]<class T>() {
    k::cpu::sum_backward<T>(slot_ptr<T>(grad_x), ptr<T>(grad_out), T(scale), n, acc);
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
           [is_mean, shape = x.shape()](const Tensor& g, const std::vector<Tensor>&,
                                        std::span<GradSlot> grads) {
             reduce_backward(is_mean ? "mean_backward" : "sum_backward", g, shape, grads[0],
                             is_mean);
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
  check_inputs("sum_backward", {{"grad_out", &grad_out}, {"x", &x}});
  reduce_backward("sum_backward", grad_out, x.shape(), grad_x, false);
}
void mean_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x) {
  check_inputs("mean_backward", {{"grad_out", &grad_out}, {"x", &x}});
  reduce_backward("mean_backward", grad_out, x.shape(), grad_x, true);
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
  check_inputs(op, {{"pred", &pred}, {"target", &target}});
  check_same_shape(op, {"pred", &pred}, {"target", &target});
  const std::int64_t n = pred.numel();
  if (pred.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(pred.device());
    scope.read({&pred, &target});
    Tensor y = new_output({}, pred);
    k::mse_loss_forward(y.data<float>(), pred.data<float>(), target.data<float>(), n,
                        scope.stream());
    return y;
#endif
  }
  Tensor y = new_output({}, pred);
  dispatch_cpu(pred.dtype(), [&]<class T>() {
    k::cpu::mse_loss_forward<T>(ptr<T>(y), ptr<T>(pred), ptr<T>(target), n);
  });
  return y;
}
}  // namespace

void mse_loss_backward(const Tensor& grad_out, const Tensor& pred, const Tensor& target,
                       GradSlot grad_pred, GradSlot grad_target) {
  const char* op = "mse_loss_backward";
  check_inputs(op, {{"grad_out", &grad_out}, {"pred", &pred}, {"target", &target}});
  check_same_shape(op, {"pred", &pred}, {"target", &target});
  GW_CHECK(grad_out.numel() == 1, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected one element (the gradient of a scalar)");
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
    k::mse_loss_backward(want_p ? grad_pred.tensor->data<float>() : nullptr,
                         want_t ? grad_target.tensor->data<float>() : nullptr,
                         grad_out.data<float>(), pred.data<float>(), target.data<float>(), n, acc_p,
                         acc_t, scope.stream());
    return;
#endif
  }
  const bool acc_p = want_p && open_slot(grad_pred, pred, nullptr);
  const bool acc_t = want_t && open_slot(grad_target, target, nullptr);
  dispatch_cpu(pred.dtype(), [&]<class T>() {
    k::cpu::mse_loss_backward<T>(slot_ptr<T>(grad_pred), slot_ptr<T>(grad_target), ptr<T>(grad_out),
                                 ptr<T>(pred), ptr<T>(target), n, acc_p, acc_t);
  });
}

}  // namespace graphward
