// softmax, log_softmax and cross_entropy over the last dimension (kernels/softmax.h).
#include <algorithm>

#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/softmax.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {

struct Rows {
  std::int64_t rows, cols;
};
Rows rows_of(const char* op, const Tensor& x) {
  GW_CHECK(x.dim() >= 1, op, ": x has shape ", shape_str(x.shape()),
           "; expected at least one dimension (the classes are the last)");
  const std::int64_t cols = x.size(-1);
  return {x.numel() / cols, cols};
}

// queries > 0: the causal softmax of [..., queries, cols] matrices (never `log`).
Tensor softmax_impl(const char* op, const Tensor& x, bool log, std::int64_t queries = 0) {
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  const Rows r = rows_of(op, x);
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    Tensor y = new_output(x.shape(), x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      if (queries > 0) {
        k::causal_softmax_forward(ptr<T>(y), ptr<T>(x), r.rows, r.cols, queries, scope.stream());
      } else if (log) {
        k::log_softmax_forward(ptr<T>(y), ptr<T>(x), r.rows, r.cols, scope.stream());
      } else {
        k::softmax_forward(ptr<T>(y), ptr<T>(x), r.rows, r.cols, scope.stream());
      }
    });
    return y;
#endif
  }
  Tensor y = new_output(x.shape(), x);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    if (queries > 0) {
      k::cpu::causal_softmax_forward<T>(d.out(y), d.in(x), r.rows, r.cols, queries);
    } else {
      k::cpu::softmax_forward<T>(d.out(y), d.in(x), r.rows, r.cols, log);
    }
  });
  return y;
}

void softmax_backward_impl(const char* op, const Tensor& grad_out, const Tensor& y, GradSlot grad_x,
                           bool log) {
  check_inputs(op, {{"grad_out", &grad_out}, {"y", &y}}, Bf16::kEverywhere);
  check_same_shape(op, {"grad_out", &grad_out}, {"y", &y});
  const Rows r = rows_of(op, y);
  if (!check_slot(op, "grad_x", grad_x, y)) return;
  if (y.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(y.device());
    scope.read({&grad_out, &y});
    const bool acc = open_slot(grad_x, y, scope.stream());
    dispatch_cuda(y.dtype(), [&]<class T>() {
      T* dx = slot_ptr<T>(grad_x);
      if (log) {
        k::log_softmax_backward(dx, ptr<T>(grad_out), ptr<T>(y), r.rows, r.cols, acc,
                                scope.stream());
      } else {
        k::softmax_backward(dx, ptr<T>(grad_out), ptr<T>(y), r.rows, r.cols, acc, scope.stream());
      }
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_x, y, nullptr);
  dispatch_cpu_data(y.dtype(), [&]<class T>(CpuData<T>& d) {
    T* dx = acc ? d.inout(*grad_x.tensor) : d.out(*grad_x.tensor);
    k::cpu::softmax_backward<T>(dx, d.in(grad_out), d.in(y), r.rows, r.cols, log, acc);
  });
}

// queries > 0: the causal softmax (softmax_impl), recorded with its query count.
Tensor recorded_softmax(const char* op, bool log, const Tensor& x, std::int64_t queries = 0) {
  detail::NvtxRange range(op);
  Tensor y = softmax_impl(op, x, log, queries);
  if (needs_grad({&x})) {
    record(op, y, {&x}, {save("output", y)},
           [log](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             if (log) {
               log_softmax_backward(g, s[0], grads[0]);
             } else {
               softmax_backward(g, s[0], grads[0]);
             }
           },
           {NodeAttribute::integer(queries > 0 ? queries : std::int64_t{log})});
  }
  return y;
}

void check_targets(const char* op, const Tensor& logits, const Tensor& targets) {
  check_inputs(op, {{"logits", &logits}}, Bf16::kEverywhere);
  check_dim(op, {"logits", &logits}, 2);
  GW_CHECK(targets.defined() && targets.dtype() == DType::kInt32 &&
               targets.shape() == Shape({logits.size(0)}) && targets.device() == logits.device(),
           op, ": targets are ", targets.defined() ? targets.str() : std::string("undefined"),
           "; expected int32[", logits.size(0), "] on ", logits.device().str(),
           " (a class index per row of logits ", shape_str(logits.shape()), ")");
}

}  // namespace

Tensor softmax(const Tensor& x) {
  return recorded_softmax("softmax", false, x);
}
Tensor log_softmax(const Tensor& x) {
  return recorded_softmax("log_softmax", true, x);
}
Tensor causal_softmax(const Tensor& x) {
  const char* op = "causal_softmax";
  GW_CHECK(!x.defined() || x.dim() >= 2, op, ": x has shape ", shape_str(x.shape()),
           "; expected attention's scores [..., Tq, Tk], at least 2-d");
  // An undefined or empty x is refused by softmax_impl's checks, before anything is written.
  const std::int64_t queries = x.defined() ? std::max<std::int64_t>(x.size(-2), 1) : 1;
  return recorded_softmax(op, false, x, queries);
}
void softmax_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x) {
  softmax_backward_impl("softmax_backward", grad_out, y, grad_x, false);
}
void log_softmax_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x) {
  softmax_backward_impl("log_softmax_backward", grad_out, y, grad_x, true);
}

namespace {
struct CrossEntropyOut {
  Tensor loss, lse;
};
// The dtype of cross-entropy's loss, statistics and loss gradient: the logits', float32 for
// bfloat16 logits (the loss keeps float32 math and storage).
DType loss_dtype(const Tensor& logits) {
  return statistics_dtype(logits.dtype());
}
// The classes of a row of `cols` columns: every column, or the first `classes` (checked).
std::int64_t check_classes(const char* op, std::int64_t cols, std::optional<std::int64_t> classes) {
  if (!classes) return cols;
  GW_CHECK(*classes >= 1 && *classes <= cols, op, ": classes is ", *classes, "; expected 1 to ",
           cols, " (the logits' columns)");
  return *classes;
}
CrossEntropyOut cross_entropy_impl(const Tensor& logits, const Tensor& targets,
                                   std::optional<std::int64_t> classes) {
  const char* op = "cross_entropy";
  check_targets(op, logits, targets);
  const std::int64_t rows = logits.size(0), ld = logits.size(1);
  const std::int64_t cols = check_classes(op, ld, classes);
  CrossEntropyOut o;
  if (logits.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(logits.device());
    scope.read({&logits, &targets});
    const TensorOptions f32{DType::kFloat32, logits.device()};
    o.loss = Tensor::empty({}, f32);
    o.lse = Tensor::empty({rows, 2}, f32);
    dispatch_cuda(logits.dtype(), [&]<class T>() {
      k::cross_entropy_forward(o.loss.data<float>(), o.lse.data<float>(), ptr<T>(logits),
                               targets.data<std::int32_t>(), rows, cols, ld, scope.stream());
    });
    return o;
#endif
  }
  check_index_values(op, "target", targets, cols, "a class");
  const std::int32_t* t = targets.data<std::int32_t>();
  const TensorOptions stats{loss_dtype(logits), logits.device()};
  o.loss = Tensor::empty({}, stats);
  o.lse = Tensor::empty({rows, 2}, stats);
  dispatch_cpu_data(logits.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::cross_entropy_forward<T>(d.out(o.loss), d.out(o.lse), d.in(logits), t, rows, cols,
                                     ld);
  });
  return o;
}
}  // namespace

namespace {
Tensor cross_entropy_op(const Tensor& logits, const Tensor& targets,
                        std::optional<std::int64_t> classes) {
  detail::NvtxRange range("cross_entropy");
  CrossEntropyOut o = cross_entropy_impl(logits, targets, classes);
  if (needs_grad({&logits})) {
    // Note [Node attributes]: the classes the backward bakes in (-1: every column).
    record("cross_entropy", o.loss, {&logits, &targets},
           {save("logits", logits), save("logsumexp", o.lse), save("targets", targets)},
           [classes](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             cross_entropy_backward(g, s[0], s[1], s[2], grads[0], classes);
           },
           {NodeAttribute::integer(classes.value_or(-1))});
  }
  return o.loss;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  return cross_entropy_op(logits, targets, std::nullopt);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t classes) {
  return cross_entropy_op(logits, targets, classes);
}

void cross_entropy_backward(const Tensor& grad_out, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, GradSlot grad_logits,
                            std::optional<std::int64_t> classes) {
  const char* op = "cross_entropy_backward";
  check_targets(op, logits, targets);
  check_inputs(op, {{"grad_out", &grad_out}, {"logsumexp", &lse}});
  GW_CHECK(grad_out.dtype() == loss_dtype(logits) && lse.dtype() == loss_dtype(logits) &&
               grad_out.device() == logits.device() && lse.device() == logits.device(),
           op, ": grad_out is ", grad_out.str(), ", logsumexp ", lse.str(), "; expected ",
           dtype_name(loss_dtype(logits)), " on ", logits.device().str(),
           " (the loss's dtype for logits ", logits.str(), ")");
  GW_CHECK(grad_out.numel() == 1, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected one element (the gradient of the loss)");
  GW_CHECK(lse.shape() == Shape({logits.size(0), 2}), op, ": logsumexp has shape ",
           shape_str(lse.shape()), "; expected [", logits.size(0),
           ", 2] (each row's maximum and the log of its sum of exp(x − maximum))");
  const std::int64_t rows = logits.size(0), ld = logits.size(1);
  const std::int64_t cols = check_classes(op, ld, classes);
  check_index_values(op, "target", targets, cols, "a class");
  if (!check_slot(op, "grad_logits", grad_logits, logits)) return;
  if (logits.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(logits.device());
    scope.read({&grad_out, &logits, &lse, &targets});
    const bool acc = open_slot(grad_logits, logits, scope.stream());
    dispatch_cuda(logits.dtype(), [&]<class T>() {
      k::cross_entropy_backward(slot_ptr<T>(grad_logits), grad_out.data<float>(), ptr<T>(logits),
                                lse.data<float>(), targets.data<std::int32_t>(), rows, cols, ld,
                                acc, scope.stream());
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_logits, logits, nullptr);
  dispatch_cpu_data(logits.dtype(), [&]<class T>(CpuData<T>& d) {
    T* dx = acc ? d.inout(*grad_logits.tensor) : d.out(*grad_logits.tensor);
    k::cpu::cross_entropy_backward<T>(dx, d.in(grad_out), d.in(logits), d.in(lse),
                                      targets.data<std::int32_t>(), rows, cols, ld, acc);
  });
}

}  // namespace graphward
