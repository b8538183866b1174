// The shape ops: narrow (a window of the last dimension), split_heads (a window as attention's
// heads), reshape (a view), transpose and concat.
#include <optional>
#include <string>
#include <utility>

#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/checked.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/shape.h"

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
  if (!checked::window_fits(start, length, cols)) {
    std::int64_t end = 0;
    const std::string window = checked::add(start, length, &end)
                                   ? detail::concat("[", start, ", ", end, ")")
                                   : detail::concat("of ", length, " columns from column ", start);
    GW_CHECK(false, op, ": the window ", window, " of the last dimension does not fit x ",
             shape_str(shape), "; expected 0 <= start, length >= 1 and start + length <= ", cols);
  }
  Window w{shape_numel(shape) / cols, cols, shape};
  w.out.back() = length;
  return w;
}
}  // namespace

Tensor narrow(const Tensor& x, std::int64_t start, std::int64_t length) {
  const char* op = "narrow";
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  const Window w = check_narrow(op, x.shape(), start, length);
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    y = new_output(w.out, x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      k::gather_window(ptr<T>(y), ptr<T>(x), w.rows, w.cols, start, length, false, scope.stream());
    });
#endif
  } else {
    y = new_output(w.out, x);
    dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
      k::cpu::gather_window<T>(d.out(y), d.in(x), w.rows, w.cols, start, length, false);
    });
  }
  if (needs_grad({&x})) {
    const Shape in_shape = x.shape();
    record(op, y, {&x}, {},
           [in_shape, start, length](const Tensor& g, const std::vector<Tensor>&,
                                     std::span<GradSlot> grads) {
             narrow_backward(g, in_shape, start, length, grads[0]);
           },
           {NodeAttribute::integer(start), NodeAttribute::integer(length)});
  }
  return y;
}

void narrow_backward(const Tensor& grad_out, const Shape& input_shape, std::int64_t start,
                     std::int64_t length, GradSlot grad_x) {
  const char* op = "narrow_backward";
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  const Window w = check_narrow(op, input_shape, start, length);
  GW_CHECK(grad_out.shape() == w.out, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected ", shape_str(w.out));
  if (!check_slot(op, "grad_x", grad_x, input_shape, grad_out)) return;
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_x, input_shape, grad_out, scope.stream());
    dispatch_cuda(grad_out.dtype(), [&]<class T>() {
      k::narrow_backward(slot_ptr<T>(grad_x), ptr<T>(grad_out), w.rows, w.cols, start, length, acc,
                         scope.stream());
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_x, input_shape, grad_out, nullptr);
  dispatch_cpu_data(grad_out.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::narrow_backward<T>(slot_out(d, grad_x, acc), d.in(grad_out), w.rows, w.cols, start,
                               length, acc);
  });
}

// ---- split_heads ------------------------------------------------------------------------------
namespace {
// The window's layout, checked: x 2-d, its rows whole sequences, its window whole heads.
k::HeadsWindow check_heads(const char* op, const Shape& shape, std::int64_t seq, std::int64_t heads,
                           std::int64_t start, std::int64_t length, Shape* out) {
  GW_CHECK(shape.size() == 2, op, ": x has shape ", shape_str(shape),
           "; expected 2 dimensions [batch · seq, columns]");
  (void)check_narrow(op, shape, start, length);
  std::int64_t numel = 0;  // bounds every product below (batch · heads · seq · dim <= it)
  GW_CHECK(shape[0] >= 0 && checked::mul(shape[0], shape[1], &numel), op, ": x's shape ",
           shape_str(shape),
           " has no element count an int64 holds; expected rows >= 0 and "
           "rows · columns < 2^63");
  GW_CHECK(seq >= 1 && shape[0] % seq == 0, op, ": seq is ", seq, " and x has ", shape[0],
           " rows; expected seq >= 1 dividing the rows (batch · seq)");
  GW_CHECK(heads >= 1 && length % heads == 0, op, ": heads is ", heads, " and the window has ",
           length, " columns; expected heads >= 1 dividing them (heads · head size)");
  const k::HeadsWindow w{shape[0] / seq, seq, heads, length / heads, shape[1], start};
  *out = {w.batch * heads, seq, w.dim};
  return w;
}
}  // namespace

Tensor split_heads(const Tensor& x, std::int64_t seq, std::int64_t heads, std::int64_t start,
                   std::int64_t length) {
  const char* op = "split_heads";
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  Shape out;
  const k::HeadsWindow w = check_heads(op, x.shape(), seq, heads, start, length, &out);
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    y = new_output(out, x);
    dispatch_cuda(x.dtype(),
                  [&]<class T>() { k::split_heads(ptr<T>(y), ptr<T>(x), w, scope.stream()); });
#endif
  } else {
    y = new_output(out, x);
    dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
      k::cpu::split_heads<T>(d.out(y), d.in(x), w);
    });
  }
  if (needs_grad({&x})) {
    const Shape in_shape = x.shape();
    record(op, y, {&x}, {},
           [in_shape, seq, heads, start, length](const Tensor& g, const std::vector<Tensor>&,
                                                 std::span<GradSlot> grads) {
             split_heads_backward(g, in_shape, seq, heads, start, length, grads[0]);
           },
           {NodeAttribute::integer(seq), NodeAttribute::integer(heads),
            NodeAttribute::integer(start), NodeAttribute::integer(length)});
  }
  return y;
}

void split_heads_backward(const Tensor& grad_out, const Shape& input_shape, std::int64_t seq,
                          std::int64_t heads, std::int64_t start, std::int64_t length,
                          GradSlot grad_x) {
  const char* op = "split_heads_backward";
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  Shape out;
  const k::HeadsWindow w = check_heads(op, input_shape, seq, heads, start, length, &out);
  GW_CHECK(grad_out.shape() == out, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected ", shape_str(out));
  if (!check_slot(op, "grad_x", grad_x, input_shape, grad_out)) return;
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_x, input_shape, grad_out, scope.stream());
    dispatch_cuda(grad_out.dtype(), [&]<class T>() {
      k::split_heads_backward(slot_ptr<T>(grad_x), ptr<T>(grad_out), w, acc, scope.stream());
    });
    return;
#endif
  }
  const bool acc = open_slot(grad_x, input_shape, grad_out, nullptr);
  dispatch_cpu_data(grad_out.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::split_heads_backward<T>(slot_out(d, grad_x, acc), d.in(grad_out), w, acc);
  });
}

}  // namespace graphward

namespace graphward {

namespace {
std::int64_t normalize_dim(const char* op, std::int64_t d, std::int64_t rank) {
  GW_CHECK(d >= -rank && d < rank, op, ": dimension ", d, " is out of range for a ", rank,
           "-d tensor; expected a dimension in [", -rank, ", ", rank - 1, "]");
  return d < 0 ? d + rank : d;
}
}  // namespace

// ---- reshape ----------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape) {
  const char* op = "reshape";
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);  // a view: any storage
  Shape out = shape;
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
      continue;
    }
    GW_CHECK(out[i] >= 1, op, ": shape ", shape_str(shape), " has dimension ", out[i],
             "; expected sizes >= 1 and at most one -1");
    GW_CHECK(checked::mul(known, out[i], &known), op, ": shape ", shape_str(shape),
             " has more elements than fit in int64; expected ", x.numel(), " elements (x is ",
             shape_str(x.shape()), ")");
  }
  if (inferred >= 0) {
    GW_CHECK(x.numel() % known == 0, op, ": cannot infer the -1 of ", shape_str(shape), " for ",
             x.numel(), " elements (x is ", shape_str(x.shape()), "); expected a divisor");
    out[static_cast<std::size_t>(inferred)] = x.numel() / known;
  }
  GW_CHECK(shape_numel(out) == x.numel(), op, ": x ", shape_str(x.shape()), " has ", x.numel(),
           " elements and ", shape_str(shape), " holds ", shape_numel(out),
           "; expected the same number of elements");
  Tensor y = x.view(out);
  if (needs_grad({&x})) {
    const Shape in_shape = x.shape();
    record(op, y, {&x}, {},
           [in_shape](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
             reshape_backward(g, in_shape, grads[0]);
           });
  }
  return y;
}

void reshape_backward(const Tensor& grad_out, const Shape& input_shape, GradSlot grad_x) {
  const char* op = "reshape_backward";
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.numel() == shape_numel(input_shape), op, ": grad_out ",
           shape_str(grad_out.shape()), " does not have the elements of the input ",
           shape_str(input_shape), "; expected ", shape_numel(input_shape), " elements");
  if (!check_slot(op, "grad_x", grad_x, input_shape, grad_out)) return;
  if (grad_x.may_share && !grad_x.accumulate && !grad_x.tensor->defined()) {
    *grad_x.tensor = grad_out.view(input_shape);  // no copy: the gradient is grad_out's elements
    return;
  }
  scale_backward(grad_out.view(input_shape), 1.0, grad_x);
}

// ---- transpose --------------------------------------------------------------------------------
namespace {
k::SwapDims swap_of(const char* op, const Shape& shape, std::int64_t d0, std::int64_t d1) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  GW_CHECK(rank >= 1 && rank <= k::kMaxDims, op, ": a tensor of shape ", shape_str(shape),
           "; expected 1 to ", k::kMaxDims, " dimensions");
  k::SwapDims s;
  s.rank = static_cast<int>(rank);
  for (std::int64_t i = 0; i < rank; ++i) s.in_shape[i] = shape[static_cast<std::size_t>(i)];
  s.d0 = static_cast<int>(normalize_dim(op, d0, rank));
  s.d1 = static_cast<int>(normalize_dim(op, d1, rank));
  return s;
}
Shape swapped(Shape shape, const k::SwapDims& s) {
  std::swap(shape[static_cast<std::size_t>(s.d0)], shape[static_cast<std::size_t>(s.d1)]);
  return shape;
}
// y (=|+=) x with the dims of `s` swapped, on x's device.
void run_swap(const k::SwapDims& s, const Tensor& x, const Tensor& y, bool accumulate,
              [[maybe_unused]] cudaStream_t stream) {
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    dispatch_cuda(x.dtype(),
                  [&]<class T>() { k::swap_dims(ptr<T>(y), ptr<T>(x), s, accumulate, stream); });
    return;
#endif
  }
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::swap_dims<T>(accumulate ? d.inout(y) : d.out(y), d.in(x), s, accumulate);
  });
}
}  // namespace

Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1) {
  const char* op = "transpose";
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  const k::SwapDims s = swap_of(op, x.shape(), d0, d1);
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    y = new_output(swapped(x.shape(), s), x);
    run_swap(s, x, y, false, scope.stream());
#endif
  } else {
    y = new_output(swapped(x.shape(), s), x);
    run_swap(s, x, y, false, nullptr);
  }
  if (needs_grad({&x})) {
    record(op, y, {&x}, {},
           [d0, d1](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
             transpose_backward(g, d0, d1, grads[0]);
           },
           {NodeAttribute::integer(d0), NodeAttribute::integer(d1)});
  }
  return y;
}

void transpose_backward(const Tensor& grad_out, std::int64_t d0, std::int64_t d1, GradSlot grad_x) {
  const char* op = "transpose_backward";
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  const k::SwapDims s = swap_of(op, grad_out.shape(), d0, d1);
  const Shape in_shape = swapped(grad_out.shape(), s);
  if (!check_slot(op, "grad_x", grad_x, in_shape, grad_out)) return;
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(grad_out.device());
    scope.read({&grad_out});
    const bool acc = open_slot(grad_x, in_shape, grad_out, scope.stream());
    run_swap(s, grad_out, *grad_x.tensor, acc, scope.stream());
    return;
#endif
  }
  const bool acc = open_slot(grad_x, in_shape, grad_out, nullptr);
  run_swap(s, grad_out, *grad_x.tensor, acc, nullptr);
}

// ---- concat -----------------------------------------------------------------------------------
namespace {
// Input i occupies columns [start[i], start[i] + len[i]) of the output seen as [rows, cols].
struct ConcatLayout {
  std::int64_t rows = 1, cols = 0;
  std::vector<std::int64_t> start, len;
  Shape out;
};
ConcatLayout concat_layout(const char* op, const std::vector<Shape>& shapes, std::int64_t dim) {
  GW_CHECK(!shapes.empty(), op, ": no tensors; expected at least one");
  const Shape& first = shapes.front();
  const auto rank = static_cast<std::int64_t>(first.size());
  GW_CHECK(rank >= 1, op, ": tensor 0 has shape []; expected at least one dimension");
  const auto d = static_cast<std::size_t>(normalize_dim(op, dim, rank));
  ConcatLayout l;
  l.out = first;
  l.out[d] = 0;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const Shape& s = shapes[t];
    bool same = s.size() == first.size();
    for (std::size_t i = 0; same && i < s.size(); ++i) same = i == d || s[i] == first[i];
    GW_CHECK(same, op, ": tensor ", t, " has shape ", shape_str(s), " and tensor 0 ",
             shape_str(first), "; expected equal sizes in every dimension but ", dim);
    for (std::int64_t size : s) {
      GW_CHECK(size >= 1, op, ": tensor ", t, " has shape ", shape_str(s), "; expected sizes >= 1");
    }
    GW_CHECK(checked::add(l.out[d], s[d], &l.out[d]), op, ": the sizes along dimension ", dim,
             " add up to more than fits in int64");
  }
  // Note [Checked sizes]: once the output's element count fits, every product below does.
  (void)shape_numel(l.out);
  std::int64_t inner = 1;
  for (std::size_t i = d + 1; i < first.size(); ++i) inner *= first[i];
  for (std::size_t i = 0; i < d; ++i) l.rows *= first[i];
  for (const Shape& s : shapes) {
    l.start.push_back(l.cols);
    l.len.push_back(s[d] * inner);
    l.cols += s[d] * inner;
  }
  return l;
}
void check_all(const char* op, const std::vector<Tensor>& xs) {
  GW_CHECK(!xs.empty(), op, ": no tensors; expected at least one");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string name = "xs[" + std::to_string(i) + "]";
    check_inputs(op, {{"xs[0]", &xs[0]}, {name.c_str(), &xs[i]}}, Bf16::kEverywhere);
  }
}
}  // namespace

Tensor concat(const std::vector<Tensor>& xs, std::int64_t dim) {
  const char* op = "concat";
  detail::NvtxRange range(op);
  check_all(op, xs);
  std::vector<Shape> shapes;
  std::vector<const Tensor*> inputs;
  for (const Tensor& x : xs) {
    shapes.push_back(x.shape());
    inputs.push_back(&x);
  }
  const ConcatLayout l = concat_layout(op, shapes, dim);
  const Tensor& first = xs.front();
  Tensor y;
  if (first.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(first.device());
    for (const Tensor& x : xs) scope.read({&x});
    y = new_output(l.out, first);
    dispatch_cuda(first.dtype(), [&]<class T>() {
      for (std::size_t i = 0; i < xs.size(); ++i) {
        k::scatter_window(ptr<T>(y), ptr<T>(xs[i]), l.rows, l.cols, l.start[i], l.len[i], false,
                          scope.stream());
      }
    });
#endif
  } else {
    y = new_output(l.out, first);
    dispatch_cpu_data(first.dtype(), [&]<class T>(CpuData<T>& d) {
      T* out = d.out(y);
      for (std::size_t i = 0; i < xs.size(); ++i) {
        k::cpu::scatter_window<T>(out, d.in(xs[i]), l.rows, l.cols, l.start[i], l.len[i], false);
      }
    });
  }
  if (needs_grad(inputs)) {
    record(op, y, inputs, {},
           [shapes, dim](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
             concat_backward(g, shapes, dim, grads);
           },
           {NodeAttribute::integer(dim)});
  }
  return y;
}

void concat_backward(const Tensor& grad_out, const std::vector<Shape>& input_shapes,
                     std::int64_t dim, std::span<GradSlot> grads) {
  const char* op = "concat_backward";
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  const ConcatLayout l = concat_layout(op, input_shapes, dim);
  GW_CHECK(grad_out.shape() == l.out, op, ": grad_out has shape ", shape_str(grad_out.shape()),
           "; expected ", shape_str(l.out));
  GW_CHECK(grads.size() == input_shapes.size(), op, ": ", grads.size(), " gradient slots for ",
           input_shapes.size(), " inputs; expected one per input");
  std::vector<bool> want(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const std::string name = "grads[" + std::to_string(i) + "]";
    want[i] = check_slot(op, name.c_str(), grads[i], input_shapes[i], grad_out);
  }
  cudaStream_t stream = nullptr;
#if GRAPHWARD_HAS_CUDA
  std::optional<CudaScope> scope;
  if (grad_out.is_cuda()) {
    scope.emplace(grad_out.device());
    scope->read({&grad_out});
    stream = scope->stream();
  }
#endif
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!want[i]) continue;
    const bool acc = open_slot(grads[i], input_shapes[i], grad_out, stream);
    if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
      dispatch_cuda(grad_out.dtype(), [&]<class T>() {
        k::gather_window(slot_ptr<T>(grads[i]), ptr<T>(grad_out), l.rows, l.cols, l.start[i],
                         l.len[i], acc, stream);
      });
#endif
    } else {
      dispatch_cpu_data(grad_out.dtype(), [&]<class T>(CpuData<T>& d) {
        k::cpu::gather_window<T>(slot_out(d, grads[i], acc), d.in(grad_out), l.rows, l.cols,
                                 l.start[i], l.len[i], acc);
      });
    }
  }
}

}  // namespace graphward
