// layer_norm and embedding (kernels/norm.h).
#include <cmath>

#include "graphward/engine/ops/autocast.h"
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/norm.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {
struct NormDims {
  std::int64_t rows, cols;
};
NormDims check_layer_norm(const char* op, const Tensor& x, const Tensor& weight,
                          const Tensor& bias) {
  if (bias.defined()) {
    check_inputs(op, {{"x", &x}, {"weight", &weight}, {"bias", &bias}}, Bf16::kEverywhere);
  } else {
    check_inputs(op, {{"x", &x}, {"weight", &weight}}, Bf16::kEverywhere);
  }
  GW_CHECK(x.dim() >= 1, op, ": x has shape ", shape_str(x.shape()),
           "; expected at least one dimension (normalized over the last)");
  const std::int64_t cols = x.size(-1);
  GW_CHECK(weight.shape() == Shape({cols}), op, ": weight has shape ", shape_str(weight.shape()),
           "; expected [", cols, "] (x's last dimension)");
  if (bias.defined()) {
    GW_CHECK(bias.shape() == Shape({cols}), op, ": bias has shape ", shape_str(bias.shape()),
             "; expected [", cols, "] (x's last dimension)");
  }
  return {x.numel() / cols, cols};
}

struct LayerNormOut {
  Tensor y, mean, rstd;
};
void check_eps(const char* op, double eps, const Tensor& x) {
  GW_CHECK(std::isfinite(eps) && eps > 0, op, ": eps is ", eps, "; expected a finite eps > 0");
  check_finite_scalar(op, eps, x);
}

// The statistics' tensors (float32 for bfloat16 x, Note [bfloat16 on the CPU]).
Tensor new_statistics(std::int64_t rows, const Tensor& x) {
  return Tensor::empty({rows}, {statistics_dtype(x.dtype()), x.device()});
}

// Note [Autocast]: inside an enabled scope, a layer norm of float32 x, weight and bias returns its
// normalized output in bfloat16 — float32 statistics and arithmetic, the output rounded once when
// stored — for the matrix product it feeds, which would cast it: the cast and, in the backward,
// its widening are not kernels of their own. (Its sum, add_layer_norm's, stays float32.)
bool autocast_bf16_output(const Tensor& x, const Tensor& w, const Tensor& b) {
  return autocast_enabled() && x.dtype() == DType::kFloat32 && w.dtype() == DType::kFloat32 &&
         (!b.defined() || b.dtype() == DType::kFloat32);
}

#if GRAPHWARD_HAS_CUDA
// f.template operator()<X, Y>(): X the storage of x (and of the sum, weight, bias and their
// gradients), Y that of the normalized output y and its gradient — float32 and bfloat16 for Note
// [Autocast]'s bfloat16 y of float32 x (bf16_y), else both x's dtype. The kernels' overloads
// (kernels/norm.h) take either pair.
template <class F>
void dispatch_norm(DType x_dtype, bool bf16_y, F&& f) {
  if (bf16_y) {
    f.template operator()<float, bf16>();
    return;
  }
  dispatch_cuda(x_dtype, [&]<class T>() { f.template operator()<T, T>(); });
}
#endif

// bf16_output: Note [Autocast]'s bfloat16 y of float32 x.
LayerNormOut layer_norm_impl(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                             bool bf16_output) {
  const char* op = "layer_norm";
  const NormDims d = check_layer_norm(op, x, w, b);
  check_eps(op, eps, x);
  GW_CHECK(!bf16_output || x.dtype() == DType::kFloat32, op,
           ": a bfloat16 output is for float32 x; x is ", x.str());
  LayerNormOut o;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    if (b.defined()) {
      scope.read({&x, &w, &b});
    } else {
      scope.read({&x, &w});
    }
    o.mean = new_statistics(d.rows, x);
    o.rstd = new_statistics(d.rows, x);
    o.y = bf16_output ? Tensor::empty(x.shape(), {DType::kBFloat16, x.device()})
                      : new_output(x.shape(), x);
    dispatch_norm(x.dtype(), bf16_output, [&]<class X, class Y>() {
      k::layer_norm_forward(ptr<Y>(o.y), o.mean.data<float>(), o.rstd.data<float>(), ptr<X>(x),
                            ptr<X>(w), b.defined() ? ptr<X>(b) : nullptr, d.rows, d.cols,
                            static_cast<float>(eps), scope.stream());
    });
    return o;
#endif
  }
  o.y = new_output(x.shape(), x);
  o.mean = new_statistics(d.rows, x);
  o.rstd = new_statistics(d.rows, x);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& data) {
    k::cpu::layer_norm_forward<T>(data.out(o.y), data.out(o.mean), data.out(o.rstd), data.in(x),
                                  data.in(w), b.defined() ? data.in(b) : nullptr, d.rows, d.cols,
                                  static_cast<T>(eps));
  });
  if (bf16_output) {  // the float32 output rounded once, as the CUDA kernel stores it
    NoGradGuard no_grad;
    o.y = cast(o.y, DType::kBFloat16);
  }
  return o;
}
}  // namespace

namespace {
void record_layer_norm(const LayerNormOut& o, const Tensor& x, const Tensor& weight,
                       const Tensor& bias) {
  if (needs_grad({&x, &weight, &bias})) {
    auto backward = [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
      layer_norm_backward(g, s[0], s[1], s[2], s[3], grads[0], grads[1],
                          grads.size() > 2 ? grads[2] : GradSlot{});
    };
    std::vector<SavedTensor> saved{save("x", x), save("weight", weight), save("mean", o.mean),
                                   save("rstd", o.rstd)};
    if (bias.defined()) {
      record("layer_norm", o.y, {&x, &weight, &bias}, std::move(saved), backward);
    } else {
      record("layer_norm", o.y, {&x, &weight}, std::move(saved), backward);
    }
  }
}
}  // namespace

Tensor layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps) {
  detail::NvtxRange range("layer_norm");
  Tensor x = x_in, weight = weight_in, bias = bias_in;
  autocast_promote({&x, &weight, &bias});  // Note [Autocast]
  LayerNormOut o = layer_norm_impl(x, weight, bias, eps, autocast_bf16_output(x, weight, bias));
  record_layer_norm(o, x, weight, bias);
  return o.y;
}

namespace {
// Note [Autocast]: a bfloat16 residual of float32 x, weight and bias — a matrix product's output
// added to a float32 residual stream — is widened as the add reads it, not by a cast of its own.
bool autocast_widens_residual(const Tensor& x, const Tensor& residual, const Tensor& w,
                              const Tensor& b) {
  return autocast_enabled() && x.defined() && residual.defined() && w.defined() &&
         x.dtype() == DType::kFloat32 && residual.dtype() == DType::kBFloat16 &&
         w.dtype() == DType::kFloat32 && (!b.defined() || b.dtype() == DType::kFloat32);
}

// Records sum = x + residual widened as one node: add's backward, the residual's float32
// gradient then rounded to bfloat16 into its slot — what the add and the widening cast's backward
// would write, without the cast's node.
void record_widened_add(const Tensor& x, const Tensor& residual, const Tensor& sum) {
  if (!needs_grad({&x, &residual})) return;
  record("add", sum, {&x, &residual}, {},
         [x_shape = x.shape(), r_shape = residual.shape()](
             const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
           const bool want_r = grads[1].tensor != nullptr;
           Tensor wide;  // the residual's float32 gradient: g itself where the shapes match
           add_backward(g, Tensor::from_storage(g.storage(), x_shape, g.dtype()),
                        Tensor::from_storage(g.storage(), r_shape, g.dtype()), grads[0],
                        want_r ? GradSlot{&wide, false, true} : GradSlot{});
           if (want_r) cast_backward(wide, DType::kBFloat16, grads[1]);
         });
}
}  // namespace

AddLayerNorm add_layer_norm(const Tensor& x_in, const Tensor& residual_in,
                            const Tensor& weight_in, const Tensor& bias_in, double eps) {
  const char* op = "add_layer_norm";
  detail::NvtxRange range(op);
  Tensor x = x_in, residual = residual_in, weight = weight_in, bias = bias_in;
  const bool widen = autocast_widens_residual(x, residual, weight, bias);
  if (!widen) autocast_promote({&x, &residual, &weight, &bias});  // Note [Autocast]
  // Everything checked before the first write (Note [Check, then write]): the add's operands,
  // then the layer norm's.
  if (widen) {
    check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
    check_inputs(op, {{"residual", &residual}}, Bf16::kEverywhere);
    GW_CHECK(residual.device() == x.device(), op, ": residual is on ", residual.device().str(),
             " and x on ", x.device().str(), "; expected one device (copy with Tensor::to)");
  } else {
    check_inputs(op, {{"x", &x}, {"residual", &residual}}, Bf16::kEverywhere);
  }
  GW_CHECK(is_trailing_shape(residual, x), op, ": residual has shape ", shape_str(residual.shape()),
           " and x ", shape_str(x.shape()),
           "; expected x's shape or its trailing dimensions (repeated over "
           "the leading ones, as [T, D] over [B, T, D])");
  [[maybe_unused]] const NormDims d = check_layer_norm(op, x, weight, bias);
  check_eps(op, eps, x);
  AddLayerNorm out;
  if (!x.is_cuda()) {  // the two ops as they are: the CPU has no launch to save
    if (widen) {  // recorded as the GPU records it: one add node, no cast
      {
        NoGradGuard no_grad;
        out.sum = add(x, cast(residual, DType::kFloat32));
      }
      record_widened_add(x, residual, out.sum);
    } else {
      out.sum = add(x, residual);
    }
    out.normed = layer_norm(out.sum, weight, bias, eps);
    return out;
  }
#if GRAPHWARD_HAS_CUDA
  LayerNormOut o;
  {
    CudaScope scope(x.device());
    if (bias.defined()) {
      scope.read({&x, &residual, &weight, &bias});
    } else {
      scope.read({&x, &residual, &weight});
    }
    out.sum = new_output(x.shape(), x);
    o.mean = new_statistics(d.rows, x);
    o.rstd = new_statistics(d.rows, x);
    // Note [Autocast] (autocast_bf16_output): a bfloat16 normalized output of float32 operands.
    const bool bf16_y = autocast_bf16_output(x, weight, bias);
    o.y = bf16_y ? Tensor::empty(x.shape(), {DType::kBFloat16, x.device()})
                 : new_output(x.shape(), x);
    if (widen) {
      k::add_layer_norm_forward(ptr<bf16>(o.y), ptr<float>(out.sum), o.mean.data<float>(),
                                o.rstd.data<float>(), ptr<float>(x), ptr<bf16>(residual),
                                residual.numel() / d.cols, ptr<float>(weight),
                                bias.defined() ? ptr<float>(bias) : nullptr, d.rows, d.cols,
                                static_cast<float>(eps), scope.stream());
    } else {
      dispatch_norm(x.dtype(), bf16_y, [&]<class X, class Y>() {
        k::add_layer_norm_forward(ptr<Y>(o.y), ptr<X>(out.sum), o.mean.data<float>(),
                                  o.rstd.data<float>(), ptr<X>(x), ptr<X>(residual),
                                  residual.numel() / d.cols, ptr<X>(weight),
                                  bias.defined() ? ptr<X>(bias) : nullptr, d.rows, d.cols,
                                  static_cast<float>(eps), scope.stream());
      });
    }
  }
  if (widen) {
    record_widened_add(x, residual, out.sum);
  } else {
    record_binary("add", k::BinaryOp::kAdd, x, residual, out.sum);
  }
  record_layer_norm(o, out.sum, weight, bias);
  out.normed = o.y;
#endif
  return out;
}

void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, GradSlot grad_x,
                         GradSlot grad_weight, GradSlot grad_bias) {
  const char* op = "layer_norm_backward";
  const NormDims d = check_layer_norm(op, x, weight, Tensor());
  // Note [Autocast]: a bfloat16 grad_out of float32 x (the gradient of a bfloat16 output).
  const bool bf16_grad = grad_out.defined() && grad_out.dtype() == DType::kBFloat16 &&
                         x.defined() && x.dtype() == DType::kFloat32;
  if (bf16_grad) {
    check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
    check_inputs(op, {{"x", &x}});
    GW_CHECK(grad_out.device() == x.device(), op, ": grad_out is on ", grad_out.device().str(),
             " and x on ", x.device().str(), "; expected one device");
  } else {
    check_inputs(op, {{"grad_out", &grad_out}, {"x", &x}}, Bf16::kEverywhere);
  }
  check_inputs(op, {{"mean", &mean}, {"rstd", &rstd}});
  GW_CHECK(mean.dtype() == statistics_dtype(x.dtype()) && mean.device() == x.device() &&
               rstd.device() == x.device(),
           op, ": mean is ", mean.str(), ", rstd ", rstd.str(), "; expected ",
           dtype_name(statistics_dtype(x.dtype())), " on ", x.device().str(),
           " (the statistics' dtype for x ", x.str(), ")");
  check_same_shape(op, {"grad_out", &grad_out}, {"x", &x});
  GW_CHECK(mean.shape() == Shape({d.rows}) && rstd.shape() == Shape({d.rows}), op,
           ": mean and rstd have shapes ", shape_str(mean.shape()), " and ",
           shape_str(rstd.shape()), "; expected [", d.rows, "] (one per row of x)");
  const bool want_x = check_slot(op, "grad_x", grad_x, x);
  const bool want_w = check_slot(op, "grad_weight", grad_weight, weight);
  const bool want_b = check_slot(op, "grad_bias", grad_bias, weight.shape(), weight);
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&grad_out, &x, &weight, &mean, &rstd});
    if (want_x) {
      const bool acc = open_slot(grad_x, x, scope.stream());
      dispatch_norm(x.dtype(), bf16_grad, [&]<class X, class Y>() {
        k::layer_norm_backward_input(slot_ptr<X>(grad_x), ptr<Y>(grad_out), ptr<X>(x),
                                     mean.data<float>(), rstd.data<float>(), ptr<X>(weight),
                                     d.rows, d.cols, acc, scope.stream());
      });
    }
    if (want_w || want_b) {
      const bool acc_w = want_w && open_slot(grad_weight, weight, scope.stream());
      const bool acc_b = want_b && open_slot(grad_bias, weight.shape(), weight, scope.stream());
      const std::int64_t ws = k::layer_norm_params_workspace(d.rows, d.cols);
      const Tensor partial = ws > 0 ? Tensor::empty({ws}, {DType::kFloat32, x.device()}) : Tensor();
      dispatch_norm(x.dtype(), bf16_grad, [&]<class X, class Y>() {
        k::layer_norm_backward_params(
            want_w ? slot_ptr<X>(grad_weight) : nullptr, want_b ? slot_ptr<X>(grad_bias) : nullptr,
            ptr<Y>(grad_out), ptr<X>(x), mean.data<float>(), rstd.data<float>(), d.rows, d.cols,
            acc_w, acc_b, ws > 0 ? partial.data<float>() : nullptr, scope.stream());
      });
    }
    return;
#endif
  }
  // A bfloat16 grad_out of float32 x: widened exactly, as the CUDA kernels widen it when loaded.
  Tensor g = grad_out;
  if (bf16_grad) {
    NoGradGuard no_grad;
    g = cast(grad_out, DType::kFloat32);
  }
  const bool acc_x = want_x && open_slot(grad_x, x, nullptr);
  const bool acc_w = want_w && open_slot(grad_weight, weight, nullptr);
  const bool acc_b = want_b && open_slot(grad_bias, weight.shape(), weight, nullptr);
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& data) {
    k::cpu::layer_norm_backward<T>(
        want_x ? slot_out(data, grad_x, acc_x) : nullptr,
        want_w ? slot_out(data, grad_weight, acc_w) : nullptr,
        want_b ? slot_out(data, grad_bias, acc_b) : nullptr, data.in(g), data.in(x),
        data.in(mean), data.in(rstd), data.in(weight), d.rows, d.cols, acc_x, acc_w, acc_b);
  });
}

namespace {
void check_embedding(const char* op, const Tensor& table, const Tensor& ids) {
  check_inputs(op, {{"table", &table}}, Bf16::kEverywhere);
  check_dim(op, {"table", &table}, 2);
  GW_CHECK(ids.defined() && ids.dtype() == DType::kInt32 && ids.device() == table.device() &&
               ids.numel() > 0,
           op, ": ids are ", ids.defined() ? ids.str() : std::string("undefined"),
           "; expected a non-empty int32 tensor on ", table.device().str());
}
Shape embedding_shape(const Tensor& table, const Tensor& ids) {
  Shape s = ids.shape();
  s.push_back(table.size(1));
  return s;
}
}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  const char* op = "embedding";
  detail::NvtxRange range(op);
  check_embedding(op, table, ids);
  const std::int64_t n = ids.numel(), vocab = table.size(0), dim = table.size(1);
  Tensor y;
  if (table.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(table.device());
    scope.read({&table, &ids});
    y = new_output(embedding_shape(table, ids), table);
    dispatch_cuda(table.dtype(), [&]<class T>() {
      k::embedding_forward(ptr<T>(y), ptr<T>(table), ids.data<std::int32_t>(), n, vocab, dim,
                           scope.stream());
    });
#endif
  } else {
    check_index_values(op, "id", ids, vocab, "a row of the table");
    const std::int32_t* id = ids.data<std::int32_t>();
    y = new_output(embedding_shape(table, ids), table);
    dispatch_cpu_data(table.dtype(), [&]<class T>(CpuData<T>& data) {
      k::cpu::embedding_forward<T>(data.out(y), data.in(table), id, n, vocab, dim);
    });
  }
  if (needs_grad({&table})) {
    record(op, y, {&table, &ids}, {save("table", table), save("ids", ids)},
           [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             embedding_backward(g, s[0], s[1], grads[0]);
           });
  }
  return y;
}

void embedding_backward(const Tensor& grad_out, const Tensor& table, const Tensor& ids,
                        GradSlot grad_table) {
  const char* op = "embedding_backward";
  check_embedding(op, table, ids);
  check_inputs(op, {{"grad_out", &grad_out}, {"table", &table}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == embedding_shape(table, ids), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected ", shape_str(embedding_shape(table, ids)));
  const std::int64_t n = ids.numel(), vocab = table.size(0), dim = table.size(1);
  check_index_values(op, "id", ids, vocab, "a row of the table");
  if (!check_slot(op, "grad_table", grad_table, table)) return;
  if (table.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(table.device());
    scope.read({&grad_out, &ids});
    const bool acc = open_slot(grad_table, table, scope.stream());
    // Note [Deterministic embedding gradient] (kernels/norm.cu): the ids sorted in scratch.
    const std::int64_t ws = k::embedding_backward_workspace(n, vocab);
    const Tensor scratch =
        ws > 0 ? Tensor::empty({(ws + 3) / 4}, {DType::kFloat32, table.device()}) : Tensor();
    dispatch_cuda(table.dtype(), [&]<class T>() {
      k::embedding_backward(slot_ptr<T>(grad_table), ptr<T>(grad_out), ids.data<std::int32_t>(),
                            n, vocab, dim, acc, ws > 0 ? scratch.raw_data() : nullptr, ws,
                            scope.stream());
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_table, table, nullptr);
  dispatch_cpu_data(table.dtype(), [&]<class T>(CpuData<T>& data) {
    k::cpu::embedding_backward<T>(slot_out(data, grad_table, acc), data.in(grad_out),
                                  ids.data<std::int32_t>(), n, vocab, dim, acc);
  });
}

}  // namespace graphward
