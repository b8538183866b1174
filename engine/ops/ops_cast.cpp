// cast: conversions between floating-point element types (kernels/cast.h on CUDA; loops on the
// CPU).
#include <optional>

#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/cast.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;

namespace {

void check_cast(const char* op, const Tensor& x, DType from, DType to) {
  GW_CHECK(x.defined(), op, ": x is an undefined tensor; expected a tensor");
  GW_CHECK(x.numel() > 0, op, ": x is empty (shape ", shape_str(x.shape()),
           "); expected at least one element");
  GW_CHECK(is_floating(from) && is_floating(to), op, ": from ", dtype_name(from), " to ",
           dtype_name(to), "; expected floating-point types (float32, float64, bfloat16)");
  if (x.is_cuda()) {
    auto on_cuda = [](DType d) { return d == DType::kFloat32 || d == DType::kBFloat16; };
    GW_CHECK(on_cuda(from) && on_cuda(to), op, ": from ", dtype_name(from), " to ", dtype_name(to),
             " on ", x.device().str(), "; CUDA converts between float32 and bfloat16");
  }
}

// The value of element i of `x`, whatever its floating-point type, as double.
double read(const void* x, DType t, std::int64_t i) {
  switch (t) {
    case DType::kFloat64:
      return static_cast<const double*>(x)[i];
    case DType::kBFloat16:
      return static_cast<const bf16*>(x)[i].to_float();
    default:
      return static_cast<const float*>(x)[i];
  }
}
// y[i] (=|+=) v in y's type (bfloat16: the sum in float32, then rounded; from float64 through
// float32).
void write(void* y, DType t, std::int64_t i, double v, bool accumulate) {
  switch (t) {
    case DType::kFloat64: {
      double& d = static_cast<double*>(y)[i];
      d = accumulate ? d + v : v;
      return;
    }
    case DType::kBFloat16: {
      bf16& d = static_cast<bf16*>(y)[i];
      const float f = static_cast<float>(v);
      d = bf16::from_float(accumulate ? d.to_float() + f : f);
      return;
    }
    default: {
      float& d = static_cast<float*>(y)[i];
      const float f = static_cast<float>(v);
      d = accumulate ? d + f : f;
      return;
    }
  }
}

// y (=|+=) x converted; on x's device (`stream`: the CUDA op's).
void convert(const Tensor& y, const Tensor& x, bool accumulate,
             [[maybe_unused]] cudaStream_t stream) {
  const std::int64_t n = x.numel();
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    if (x.dtype() == y.dtype()) {  // float32 -> float32 (a gradient passed back): a copy or a sum
      if (accumulate) {
        add_(y, x);
      } else {
        GW_CUDA_CHECK(cudaMemcpyAsync(y.raw_data(), x.raw_data(), x.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream));
      }
    } else if (y.dtype() == DType::kBFloat16) {
      kernels::float_to_bf16(static_cast<std::uint16_t*>(y.raw_data()), x.data<float>(), n,
                             accumulate, stream);
    } else {
      kernels::bf16_to_float(y.data<float>(), static_cast<const std::uint16_t*>(x.raw_data()), n,
                             accumulate, stream);
    }
    return;
#endif
  }
  for (std::int64_t i = 0; i < n; ++i) {
    write(y.raw_data(), y.dtype(), i, read(x.raw_data(), x.dtype(), i), accumulate);
  }
}

// Records y = cast(x) as cast() does (where x needs a gradient).
void record_cast(const Tensor& y, const Tensor& x) {
  if (!needs_grad({&x})) return;
  const DType from = x.dtype();
  record("cast", y, {&x}, {},
         [from](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
           cast_backward(g, from, grads[0]);
         });
}

}  // namespace

namespace ops_detail {

std::vector<Tensor> cast_to_bf16_batched(const std::vector<Tensor>& xs) {
  const char* op = "cast";
  detail::NvtxRange range(op);
  for (const Tensor& x : xs) {
    GW_CHECK(x.defined(), op, ": x is an undefined tensor; expected a tensor");
    check_cast(op, x, x.dtype(), DType::kBFloat16);
  }
  std::vector<Tensor> out(xs.size());
#if GRAPHWARD_HAS_CUDA
  // The float32 CUDA tensors, a device at a time: their casts in launches of kCastBatchMax.
  std::vector<bool> done(xs.size(), false);
  for (std::size_t first = 0; first < xs.size(); ++first) {
    if (done[first] || !xs[first].is_cuda() || xs[first].dtype() != DType::kFloat32) continue;
    const Device device = xs[first].device();
    CudaScope scope(device);
    std::vector<kernels::CastSlice> slices;
    const auto launch = [&] {
      kernels::float_to_bf16_batch(slices.data(), static_cast<int>(slices.size()),
                                   scope.stream());
      slices.clear();
    };
    for (std::size_t i = first; i < xs.size(); ++i) {
      const Tensor& x = xs[i];
      if (done[i] || !x.is_cuda() || x.device() != device || x.dtype() != DType::kFloat32) {
        continue;
      }
      scope.read({&x});
      out[i] = Tensor::empty(x.shape(), {DType::kBFloat16, device});
      slices.push_back({static_cast<std::uint16_t*>(out[i].raw_data()), x.data<float>(),
                        x.numel()});
      done[i] = true;
      if (slices.size() == static_cast<std::size_t>(kernels::kCastBatchMax)) launch();
    }
    if (!slices.empty()) launch();
  }
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (out[i].defined()) record_cast(out[i], xs[i]);
  }
#endif
  for (std::size_t i = 0; i < xs.size(); ++i) {  // the rest (the CPU, bfloat16 already) as cast
    if (!out[i].defined()) out[i] = cast(xs[i], DType::kBFloat16);
  }
  return out;
}

}  // namespace ops_detail

Tensor cast(const Tensor& x, DType dtype) {
  const char* op = "cast";
  detail::NvtxRange range(op);
  GW_CHECK(x.defined(), op, ": x is an undefined tensor; expected a tensor");
  check_cast(op, x, x.dtype(), dtype);
  if (x.dtype() == dtype) return x;
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    y = Tensor::empty(x.shape(), {dtype, x.device()});
    convert(y, x, false, scope.stream());
#endif
  } else {
    y = Tensor::empty(x.shape(), {dtype, x.device()});
    convert(y, x, false, nullptr);
  }
  record_cast(y, x);
  return y;
}

void cast_backward(const Tensor& grad_out, DType input_dtype, GradSlot grad_x) {
  const char* op = "cast_backward";
  GW_CHECK(grad_out.defined(), op, ": grad_out is an undefined tensor; expected a tensor");
  check_cast(op, grad_out, grad_out.dtype(), input_dtype);
  const TensorOptions expected{input_dtype, grad_out.device()};
  if (!check_slot(op, "grad_x", grad_x, grad_out.shape(), expected)) return;
  cudaStream_t stream = nullptr;
#if GRAPHWARD_HAS_CUDA
  std::optional<CudaScope> scope;
  if (grad_out.is_cuda()) {
    scope.emplace(grad_out.device());
    scope->read({&grad_out});
    stream = scope->stream();
  }
#endif
  const bool acc = open_slot(grad_x, grad_out.shape(), expected, stream);
  convert(*grad_x.tensor, grad_out, acc, stream);
}

}  // namespace graphward
