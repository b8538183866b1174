#include "graphward/engine/ops/ops_common.h"

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "graphward/engine/runtime/capture_mode.h"

namespace graphward::ops_detail {

void check_inputs(const char* op, std::initializer_list<Named> inputs, Bf16 bf16) {
  const bool cuda_bf16 = bf16 != Bf16::kNo;
  const Named* first = nullptr;
  for (const Named& in : inputs) {
    GW_CHECK(in.tensor && in.tensor->defined(), op, ": input '", in.name,
             "' is an undefined tensor; expected a tensor");
    const Tensor& t = *in.tensor;
    GW_CHECK(is_floating(t.dtype()), op, ": input '", in.name, "' is ", t.str(),
             "; expected a floating-point tensor");
    GW_CHECK(t.dtype() != DType::kBFloat16 || bf16 == Bf16::kEverywhere || (cuda_bf16 && t.is_cuda()),
             op, ": input '", in.name,
             "' is ", t.str(), "; ",
             cuda_bf16 ? "bfloat16 runs on CUDA only (on the CPU it is storage only): expected "
                         "float32 or float64 (convert with cast(x, DType::kFloat32))"
                       : "this op does not take bfloat16 yet: expected float32 (convert with "
                         "cast(x, DType::kFloat32))");
    GW_CHECK(t.numel() > 0, op, ": input '", in.name, "' is empty (shape ", shape_str(t.shape()),
             "); expected at least one element");
    if (t.is_cuda()) {
      GW_CHECK(t.dtype() == DType::kFloat32 || t.dtype() == DType::kBFloat16, op, ": input '",
               in.name, "' is ", t.str(),
               cuda_bf16 ? "; CUDA ops take float32 or bfloat16" : "; CUDA ops take float32");
    }
    if (!first) {
      first = &in;
      continue;
    }
    const Tensor& f = *first->tensor;
    GW_CHECK(t.device() == f.device(), op, ": inputs are on different devices: '", first->name,
             "' is on ", f.device().str(), ", '", in.name, "' is on ", t.device().str(),
             "; expected all inputs on one device (copy with Tensor::to)");
    GW_CHECK(t.dtype() == f.dtype(), op, ": inputs have different dtypes: '", first->name, "' is ",
             dtype_name(f.dtype()), ", '", in.name, "' is ", dtype_name(t.dtype()),
             "; expected one dtype");
  }
}

void check_same_shape(const char* op, Named a, Named b) {
  GW_CHECK(a.tensor->shape() == b.tensor->shape(), op, ": shapes differ: '", a.name, "' is ",
           shape_str(a.tensor->shape()), ", '", b.name, "' is ", shape_str(b.tensor->shape()),
           "; expected equal shapes");
}

void check_index_values(const char* op, const char* what, const Tensor& indices, std::int64_t bound,
                        const char* expected) {
  if (indices.is_cuda()) return;
  const std::int32_t* v = indices.data<std::int32_t>();
  for (std::int64_t i = 0; i < indices.numel(); ++i) {
    GW_CHECK(v[i] >= 0 && v[i] < bound, op, ": ", what, " ", i, " is ", v[i], "; expected ",
             expected, " in [0, ", bound, ")");
  }
}

void check_dim(const char* op, Named t, std::int64_t dim) {
  GW_CHECK(t.tensor->dim() == dim, op, ": '", t.name, "' has shape ", shape_str(t.tensor->shape()),
           "; expected a ", dim, "-d tensor");
}

bool is_trailing_shape(const Tensor& t, const Tensor& of) {
  if (t.dim() < 1 || t.dim() > of.dim()) return false;
  for (std::int64_t i = 1; i <= t.dim(); ++i) {
    if (t.size(-i) != of.size(-i)) return false;
  }
  return true;
}

void check_finite_scalar(const char* op, double scalar, const Tensor& like) {
  GW_CHECK(std::isfinite(scalar), op, ": the scalar is ", scalar,
           "; expected a finite number (it would make every element non-finite)");
  // Note [Checked sizes]'s sibling for values: a scalar the kernels take in float32 must be
  // finite there too (1e39 is a finite double and an infinite float).
  GW_CHECK(!like.defined() || finite_as(scalar, like.dtype()), op, ": the scalar is ", scalar,
           ", which is infinite as ", dtype_name(like.dtype()),
           " (the type the op computes in); expected a magnitude of at most ", FLT_MAX);
}

CudaScope::CudaScope(Device device) : guard_(device), stream_(current_stream(device)) {}

void CudaScope::read(std::initializer_list<const Tensor*> inputs) const {
  read(std::span<const Tensor* const>(inputs.begin(), inputs.size()));
}

void CudaScope::read(std::span<const Tensor* const> inputs) const {
  for (const Tensor* t : inputs) t->storage()->sync_for_read(stream_);
  // Note [Streams inside a capture] (engine/runtime/capture_mode.h): checked after the waits, which join
  // the stream into the capture when it reads work captured there.
  if (capturing()) [[unlikely]] {
    check_launch_stream(stream_);
  }
}

Tensor new_output(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, {like.dtype(), like.device()});
}

bool check_slot(const char* op, const char* name, const GradSlot& slot, const Shape& shape,
                const Tensor& like) {
  return check_slot(op, name, slot, shape, TensorOptions{like.dtype(), like.device()});
}

bool check_slot(const char* op, const char* name, const GradSlot& slot, const Shape& shape,
                TensorOptions expected) {
  if (!slot.tensor) return false;
  const Tensor& g = *slot.tensor;
  if (!g.defined()) return true;
  GW_CHECK(g.shape() == shape && g.dtype() == expected.dtype && g.device() == expected.device, op,
           ": the gradient slot '", name, "' holds ", g.str(), "; expected ",
           dtype_name(expected.dtype), shape_str(shape), " on ", expected.device.str());
  return true;
}

bool open_slot(const GradSlot& slot, const Shape& shape, const Tensor& like, cudaStream_t stream) {
  return open_slot(slot, shape, TensorOptions{like.dtype(), like.device()}, stream);
}

bool open_slot(const GradSlot& slot, const Shape& shape, TensorOptions options,
               cudaStream_t stream) {
  Tensor& g = *slot.tensor;
  if (!g.defined()) {
    g = Tensor::empty(shape, options);
    return false;  // a fresh gradient is written, never added to
  }
  if (stream) g.storage()->sync_for_write(stream);
  g.bump_version();
  return slot.accumulate;
}

template <class T>
T* CpuData<T>::view(const Tensor& t, bool read, bool output) {
  if (!widen_ || t.dtype() != DType::kBFloat16) return static_cast<T*>(t.raw_data());
  if constexpr (std::is_same_v<T, float>) {
    for (Widened& w : widened_) {
      if (w.target.raw_data() != t.raw_data()) continue;
      w.output = w.output || output;
      return w.copy.template data<float>();
    }
    Tensor copy = Tensor::empty(t.shape(), {DType::kFloat32, Device::cpu()});
    const auto* src = static_cast<const bf16*>(t.raw_data());
    float* dst = copy.data<float>();
    const std::int64_t n = t.numel();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = read ? src[i].to_float() : 0.f;
    widened_.push_back({t, copy, output});
    return dst;
  } else {
    GW_CHECK(false, "a bfloat16 CPU kernel computes in float32 only");
    return nullptr;
  }
}

template <class T>
void CpuData<T>::commit() {
  for (Widened& w : widened_) {
    if (!w.output) continue;
    auto* dst = static_cast<bf16*>(w.target.raw_data());
    const float* src = w.copy.template data<float>();
    const std::int64_t n = w.target.numel();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16::from_float(src[i]);
  }
  widened_.clear();
}

template class CpuData<float>;
template class CpuData<double>;

}  // namespace graphward::ops_detail
