// narrow: a window of the last dimension, as a new tensor.
#include "engine/autograd.h"
#include "engine/nvtx.h"
#include "engine/ops_common.h"
#include "kernels/elementwise.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
namespace k = kernels;

namespace {
struct Window {
  std::int64_t rows, cols;
  Shape out;
};
Window check_narrow(const char* op, const Shape& shape, std::int64_t start, std::int64_t length) {
  GW_CHECK(!shape.empty(), op, ": x has shape [], expected at least one dimension");
  const std::int64_t cols = shape.back();
  GW_CHECK(start >= 0 && length >= 1 && start + length <= cols, op, ": the window [", start, ", ",
           start + length, ") of the last dimension does not fit x ", shape_str(shape),
           "; expected 0 <= start and start + length <= ", cols, " with length >= 1");
  Window w{shape_numel(shape) / cols, cols, shape};
  w.out.back() = length;
  return w;
}
}  // namespace

Tensor narrow(const Tensor& x, std::int64_t start, std::int64_t length) {
  const char* op = "narrow";
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}});
  const Window w = check_narrow(op, x.shape(), start, length);
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    y = new_output(w.out, x);
    k::narrow_forward(y.data<float>(), x.data<float>(), w.rows, w.cols, start, length,
                      scope.stream());
#endif
  } else {
    y = new_output(w.out, x);
    dispatch_cpu(x.dtype(), [&]<class T>() {
      k::cpu::narrow_forward<T>(ptr<T>(y), ptr<T>(x), w.rows, w.cols, start, length);
    });
  }
  if (needs_grad({&x})) {
    const Shape in_shape = x.shape();
    record(op, y, {&x}, {},
           [in_shape, start, length](const Tensor& g, const std::vector<Tensor>&,
                                     std::span<GradSlot> grads) {
             narrow_backward(g, in_shape, start, length, grads[0]);
           });
  }
  return y;
}

void narrow_backward(const Tensor& grad_out, const Shape& input_shape, std::int64_t start,
                     std::int64_t length, GradSlot grad_x) {
  const char* op = "narrow_backward";
  check_inputs(op, {{"grad_out", &grad_out}});
  const Window w = check_narrow(op, input_shape, start, length);
  GW_CHECK(grad_out.shape() == w.out, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected ", shape_str(w.out));
  if (!check_slot(op, "grad_x", grad_x, input_shape, grad_out)) return;
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_x, input_shape, grad_out, scope.stream());
    k::narrow_backward(grad_x.tensor->data<float>(), grad_out.data<float>(), w.rows, w.cols, start,
                       length, acc, scope.stream());
    return;
#endif
  }
  const bool acc = open_slot(grad_x, input_shape, grad_out, nullptr);
  dispatch_cpu(grad_out.dtype(), [&]<class T>() {
    k::cpu::narrow_backward<T>(slot_ptr<T>(grad_x), ptr<T>(grad_out), w.rows, w.cols, start,
                               length, acc);
  });
}

}  // namespace graphward
