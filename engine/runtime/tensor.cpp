#include "graphward/engine/runtime/tensor.h"

#include "graphward/engine/runtime/capture_mode.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "graphward/engine/runtime/random.h"
#include "graphward/engine/runtime/stream.h"

#if GRAPHWARD_HAS_CUDA
#include "graphward/kernels/elementwise.h"
#endif

namespace graphward {

// ---- Tensor -------------------------------------------------------------------------------------

void detail::throw_undefined_tensor() {
  detail::throw_check_failure(__FILE__, __LINE__, "impl_",
                              "use of an undefined Tensor (default-constructed or moved from); "
                              "expected a tensor made by a creation function or an op");
}

std::uint64_t Tensor::version() const {
  return impl().storage->version();
}
void Tensor::bump_version() const {
  impl().storage->bump_version();
}

bool Tensor::is_unique() const {
  return impl_ && impl_.use_count() == 1 && impl_->storage.use_count() == 1 && !impl_->grad_fn &&
         !impl_->requires_grad;
}

std::int64_t Tensor::size(std::int64_t d) const {
  const std::int64_t n = dim();
  GW_CHECK(d >= -n && d < n, "Tensor::size: dimension ", d,
           " is out of range for a tensor of shape ", shape_str(shape()),
           "; expected a dimension in [", -n, ", ", n, ")");
  return shape()[static_cast<std::size_t>(d < 0 ? d + n : d)];
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return detail::concat(dtype_name(dtype()), shape_str(shape()), " on ", device().str());
}

Tensor Tensor::empty(const Shape& shape, TensorOptions options) {
  GW_CHECK(is_valid(options.dtype), "Tensor::empty: the dtype is ", dtype_name(options.dtype),
           "; expected float32, float64, int32 or bfloat16");
  const std::int64_t n = shape_numel(shape);
  const std::size_t bytes = shape_nbytes(shape, options.dtype);
  std::shared_ptr<Storage> storage;
  if (options.device.is_cpu()) {
    storage = Storage::allocate_cpu(bytes);
  } else {
    check_cuda_device(options.device, "Tensor::empty");
    storage = Storage::allocate(options.device, bytes, current_stream(options.device));
  }
  return Tensor(
      std::make_shared<Impl>(Impl{std::move(storage), shape, options.dtype, n, false, {}, {}}));
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  GW_CHECK(storage, "Tensor::from_storage: expected a storage, got none");
  const std::int64_t n = shape_numel(shape);
  const std::size_t bytes = shape_nbytes(shape, dtype);
  GW_CHECK(storage->bytes() >= bytes, "Tensor::from_storage: a storage of ", storage->bytes(),
           " bytes cannot hold ", dtype_name(dtype), shape_str(shape), " (", bytes, " bytes)");
  return Tensor(std::make_shared<Impl>(Impl{std::move(storage), shape, dtype, n, false, {}, {}}));
}

const Tensor& Tensor::set_requires_grad(bool requires_grad) const {
  Impl& i = impl();
  GW_CHECK(!i.grad_fn, "set_requires_grad: ", str(),
           " is the result of a recorded op (it has a grad_fn); only leaves can be marked");
  GW_CHECK(!requires_grad || is_floating(i.dtype), "set_requires_grad: ", str(),
           " holds integers; only floating-point tensors can require grad");
  i.requires_grad = requires_grad;
  return *this;
}
bool Tensor::requires_grad() const {
  return impl().requires_grad;
}
bool Tensor::is_leaf() const {
  return !impl().grad_fn;
}
Tensor& Tensor::grad() const {
  return impl().grad;
}
const void* Tensor::grad_id() const {
  return impl().grad.impl_.get();
}
Tensor::LeafView Tensor::leaf_view() const {
  const Impl& i = impl();
  LeafView v{i.dtype, &i.shape, i.storage->data(), nullptr, nullptr};
  if (const Impl* g = i.grad.impl_.get()) {
    v.grad_shape = &g->shape;
    v.grad_data = g->storage->data();
  }
  return v;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const {
  return impl().grad_fn;
}
void Tensor::set_grad_fn(std::shared_ptr<Node> node) const {
  Impl& i = impl();
  i.requires_grad = node != nullptr;
  i.grad_fn = std::move(node);
}
Tensor Tensor::detach() const {
  const Impl& i = impl();
  return Tensor(std::make_shared<Impl>(Impl{i.storage, i.shape, i.dtype, i.numel, false, {}, {}}));
}

Tensor Tensor::view(const Shape& shape) const {
  const Impl& i = impl();
  for (std::int64_t d : shape) {
    GW_CHECK(d >= 0, "Tensor::view: shape ", shape_str(shape),
             " has a negative dimension; expected sizes >= 0");
  }
  GW_CHECK(shape_numel(shape) == i.numel, "Tensor::view: shape ", shape_str(shape), " has ",
           shape_numel(shape), " elements; expected ", i.numel, " (the tensor is ",
           shape_str(i.shape), ")");
  return Tensor(std::make_shared<Impl>(Impl{i.storage, shape, i.dtype, i.numel, false, {}, {}}));
}

namespace {

// Copies t.nbytes() of host memory into `t`, a fresh tensor.
Tensor upload_into(Tensor t, const void* host) {
  if (t.nbytes() == 0) return t;
  if (t.device().is_cpu()) {
    std::memcpy(t.raw_data(), host, t.nbytes());
    return t;
  }
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(t.device());
  // From pageable memory: returns once the source has been staged, so `host` may be freed after.
  GW_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), host, t.nbytes(), cudaMemcpyHostToDevice,
                                t.storage()->producer_stream()));
#endif
  return t;
}

// Copies host memory into a fresh tensor of `shape` on `options.device`.
Tensor upload(const void* host, const Shape& shape, TensorOptions options) {
  return upload_into(Tensor::empty(shape, options), host);
}

// Note [Host memory] (allocation.cpp): the tensor is made first (its size checked, its memory taken
// or refused with OutOfMemoryError); a CPU tensor is then filled in place, a CUDA one from a host
// staging buffer of the same size, whose failure is an OutOfMemoryError too.
template <class Gen>
Tensor generate(const Shape& shape, TensorOptions options, Gen gen) {
  GW_CHECK(is_floating(options.dtype), "creating a ", dtype_name(options.dtype), shape_str(shape),
           " tensor from values: expected float32 or float64 (or bfloat16; int32 tensors: "
           "from_vector or zeros)");
  Tensor t = Tensor::empty(shape, options);
  const std::int64_t n = t.numel();
  auto fill = [&](auto* v) {
    using T = std::remove_pointer_t<decltype(v)>;
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, bf16>) {  // the float32 values, rounded
        v[i] = bf16::from_float(static_cast<float>(gen(i)));
      } else {
        v[i] = static_cast<T>(gen(i));
      }
    }
  };
  auto fill_as = [&]<class T>() {
    if (options.device.is_cpu()) {
      fill(static_cast<T*>(t.raw_data()));
      return t;
    }
    std::vector<T> v;
    try {
      v.resize(static_cast<std::size_t>(n));
    } catch (const std::exception&) {
      throw OutOfMemoryError(detail::concat("graphward: out of host memory: staging the values of ",
                                            t.str(), " needed ", t.nbytes(), " bytes"));
    }
    fill(v.data());
    return upload_into(t, v.data());
  };
  if (options.dtype == DType::kBFloat16) return fill_as.template operator()<bf16>();
  if (options.dtype == DType::kFloat64) return fill_as.template operator()<double>();
  return fill_as.template operator()<float>();
}

}  // namespace

Tensor Tensor::to(Device target) const {
  const Impl& src = impl();
  const Device from = device();
  if (from != target) check_capturable("Tensor::to");  // Note [Capture-unsafe ops]
  const TensorOptions options{src.dtype, target};
  if (from.is_cpu()) return upload(raw_data(), src.shape, options);
#if GRAPHWARD_HAS_CUDA
  const std::size_t bytes = nbytes();
  if (target.is_cpu()) {
    Tensor out = empty(src.shape, options);
    if (bytes == 0) return out;
    DeviceGuard guard(from);
    cudaStream_t s = current_stream(from);
    src.storage->sync_for_read(s);
    GW_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), raw_data(), bytes, cudaMemcpyDeviceToHost, s));
    GW_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
  }
  Tensor out = empty(src.shape, options);
  if (bytes == 0) return out;
  cudaStream_t s = out.storage()->producer_stream();
  if (target == from) {
    DeviceGuard guard(target);
    src.storage->sync_for_read(s);
    GW_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), raw_data(), bytes, cudaMemcpyDeviceToDevice, s));
    return out;
  }
  // Across devices: synchronous, so that no stream of one device is left using the other's memory.
  {
    DeviceGuard guard(from);
    GW_CUDA_CHECK(cudaStreamSynchronize(src.storage->producer_stream()));
  }
  DeviceGuard guard(target);
  GW_CUDA_CHECK(
      cudaMemcpyPeerAsync(out.raw_data(), target.index, raw_data(), from.index, bytes, s));
  GW_CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
#else
  GW_CHECK(false, "Tensor::to: cannot copy from ", from.str(),
           ": graphward was built without CUDA");
  return {};
#endif
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_capturable("Tensor::to_vector");  // Note [Capture-unsafe ops]
  GW_CHECK(dtype() == dtype_of<T>(), "Tensor::to_vector: the tensor holds ", dtype_name(dtype()),
           ", not ", dtype_name(dtype_of<T>()));
  const Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  const T* p = static_cast<const T*>(host.raw_data());
  return std::vector<T>(p, p + numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>() const;
template std::vector<bf16> Tensor::to_vector<bf16>() const;

double Tensor::item() const {
  check_capturable("Tensor::item");  // Note [Capture-unsafe ops]
  GW_CHECK(numel() == 1, "Tensor::item: expected a tensor with one element, got shape ",
           shape_str(shape()));
  if (dtype() == DType::kInt32) return to_vector<std::int32_t>()[0];
  if (dtype() == DType::kBFloat16) return to_vector<bf16>()[0].to_float();
  return dtype() == DType::kFloat64 ? to_vector<double>()[0] : to_vector<float>()[0];
}

// ---- creation -----------------------------------------------------------------------------------

Tensor zeros(const Shape& shape, TensorOptions options) {
  if (options.device.is_cpu()) {
    Tensor t = Tensor::empty(shape, options);
    std::memset(t.raw_data(), 0, t.nbytes());
    return t;
  }
  Tensor t = Tensor::empty(shape, options);
#if GRAPHWARD_HAS_CUDA
  if (t.nbytes() > 0) {
    DeviceGuard guard(options.device);
    GW_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), t.storage()->producer_stream()));
  }
#endif
  return t;
}

Tensor ones(const Shape& shape, TensorOptions options) {
  return full(shape, 1.0, options);
}

namespace {
// A finite value that the tensor's type would make infinite (1e39 as float32) is refused; NaN and
// the infinities are taken as given.
void check_representable(const char* what, double value, DType dtype) {
  GW_CHECK(!std::isfinite(value) || finite_as(value, dtype), what, ": ", value,
           " is finite but infinite as ", dtype_name(dtype), "; expected a magnitude of at most ",
           FLT_MAX, " (or a float64 tensor)");
}
}  // namespace

Tensor full(const Shape& shape, double value, TensorOptions options) {
  check_representable("full", value, options.dtype);
#if GRAPHWARD_HAS_CUDA
  if (options.device.is_cuda() && options.dtype == DType::kFloat32) {
    Tensor t = Tensor::empty(shape, options);
    DeviceGuard guard(options.device);
    kernels::fill(t.data<float>(), static_cast<float>(value), t.numel(),
                  t.storage()->producer_stream());
    return t;
  }
#endif
  return generate(shape, options, [value](std::int64_t) { return value; });
}

Tensor randn(const Shape& shape, std::uint64_t seed, TensorOptions options) {
  return generate(shape, options, [seed](std::int64_t i) {
    return philox_normal(seed, static_cast<std::uint64_t>(i));
  });
}

Tensor uniform(const Shape& shape, double low, double high, std::uint64_t seed,
               TensorOptions options) {
  GW_CHECK(std::isfinite(low) && std::isfinite(high) && low < high,
           "uniform: expected finite bounds with low < high, got low=", low, " high=", high);
  check_representable("uniform", low, options.dtype);
  check_representable("uniform", high, options.dtype);
  const bool f32 = options.dtype == DType::kFloat32;
  return generate(shape, options, [=](std::int64_t i) {
    double v = low + (high - low) * philox_uniform(seed, static_cast<std::uint64_t>(i));
    // Rounding (to double, or later to float) must not reach `high`: the interval is half-open.
    if (f32 && static_cast<float>(v) >= static_cast<float>(high)) {
      v = std::nextafter(static_cast<float>(high), static_cast<float>(low));
    } else if (v >= high) {
      v = std::nextafter(high, low);
    }
    return v;
  });
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  GW_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector: got ",
           values.size(), " values for shape ", shape_str(shape), ", which holds ",
           shape_numel(shape));
  return upload(values.data(), shape, {DType::kFloat32, device});
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, Device device) {
  GW_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector: got ",
           values.size(), " values for shape ", shape_str(shape), ", which holds ",
           shape_numel(shape));
  return upload(values.data(), shape, {DType::kFloat64, device});
}

Tensor from_vector(const std::vector<bf16>& values, const Shape& shape, Device device) {
  GW_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector: got ",
           values.size(), " values for shape ", shape_str(shape), ", which holds ",
           shape_numel(shape));
  return upload(values.data(), shape, {DType::kBFloat16, device});
}

Tensor from_vector(const std::vector<std::int32_t>& values, const Shape& shape, Device device) {
  GW_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape), "from_vector: got ",
           values.size(), " values for shape ", shape_str(shape), ", which holds ",
           shape_numel(shape));
  return upload(values.data(), shape, {DType::kInt32, device});
}

}  // namespace graphward
