#pragma once
// Tensor: a shape, an element type and a device over shared, contiguous, row-major storage.
//
// Copies of a Tensor share one implementation (like PyTorch's): a tensor is a handle. A CUDA
// tensor's storage remembers the stream that produced it; an op on another stream waits for it
// automatically (rule [read after write], Note [Stream-ordered memory] in memory.h). The version
// counter lives in the storage and is bumped by every in-place write.
//
// Creation functions allocate on `options.device`; CUDA allocations and copies are ordered on the
// calling thread's current stream for that device (Note [Current stream] in stream.h).
#include <cstdint>
#include <memory>
#include <vector>

#include "graphward/base/dtype.h"
#include "graphward/base/error.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/engine/runtime/memory.h"

namespace graphward {

class Node;  // engine/tape/autograd.h

struct TensorOptions {
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  // Uninitialized memory (poisoned with NaN when debug::set_poison_new_memory is on).
  static Tensor empty(const Shape& shape, TensorOptions options = {});
  // A tensor over existing storage (e.g. Storage::borrow's), from its first byte; the storage must
  // hold at least the shape's bytes. No autograd history.
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t size(std::int64_t d) const;  // negative d counts from the end
  std::int64_t numel() const;
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }

  // Typed pointer to the first element; checks that T matches dtype().
  template <class T>
  T* data() const {
    GW_CHECK(dtype() == dtype_of<T>(), "Tensor::data: the tensor holds ", dtype_name(dtype()),
             ", not ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  std::uint64_t version() const;
  void bump_version() const;
  const std::shared_ptr<Storage>& storage() const;
  // Whether two tensors share storage.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // Whether this handle is the only one on its storage (no other handle, no detached view): then
  // nothing else can observe an in-place write. Single-threaded use only.
  bool is_unique() const;

  // A copy on `device` (a new tensor, even when the device is the same). Copies to the CPU wait
  // for the copy to finish (a host read: it synchronizes with the current stream).
  Tensor to(Device device) const;
  Tensor clone() const { return to(device()); }
  // The elements as a host vector of T (T must match dtype()). Synchronizes for CUDA tensors.
  template <class T>
  std::vector<T> to_vector() const;
  // The single element of a one-element tensor, as double. Synchronizes for CUDA tensors.
  double item() const;

  std::string str() const;  // "float32[2, 3] on cuda:0"

  // ---- autograd (engine/tape/autograd.h) ----
  // A leaf that requires grad receives its gradient in grad() when backward() reaches it. Only
  // float tensors with no grad_fn may be marked; marking returns *this.
  const Tensor& set_requires_grad(bool requires_grad) const;
  bool requires_grad() const;
  bool is_leaf() const;  // no grad_fn
  // The persistent gradient of a leaf (undefined until a backward writes it). Shared by handles.
  Tensor& grad() const;
  // The node that produced this tensor in a recorded forward (null for leaves and no-grad results).
  const std::shared_ptr<Node>& grad_fn() const;
  void set_grad_fn(std::shared_ptr<Node> node) const;
  // A new handle on the same storage (same version counter) with no autograd history.
  Tensor detach() const;
  // detach() in another shape with the same number of elements (the differentiable form is
  // reshape(), engine/ops/ops.h).
  Tensor view(const Shape& shape) const;

  // What a tape signature reads of a leaf, in one call (capture/signature.cpp reads it for every
  // leaf before every replay): its dtype, shape and data, and its .grad's shape and data (null
  // when the .grad is undefined). The pointers are valid while the tensor and its .grad are.
  struct LeafView {
    DType dtype;
    const Shape* shape;
    const void* data;
    const Shape* grad_shape;
    const void* grad_data;
  };
  LeafView leaf_view() const;
  // Identities for memos: the tensor behind this handle, and behind its .grad (nullptr when
  // undefined). A tensor's shape, dtype and storage never change, so the same identity means the
  // same shape and data.
  const void* id() const { return impl_.get(); }
  const void* grad_id() const;

 private:
  struct Impl;
  explicit Tensor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& impl() const;
  std::shared_ptr<Impl> impl_;
};

// What a handle holds. Here rather than in engine/runtime/tensor.cpp so that the accessors below, which a
// recorded op calls a dozen times (checks, dispatch, its node's metadata), inline.
struct Tensor::Impl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  DType dtype;
  std::int64_t numel;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  Tensor grad;
};

namespace detail {
[[noreturn]] void throw_undefined_tensor();
}  // namespace detail

inline Tensor::Impl& Tensor::impl() const {
  if (!impl_) [[unlikely]]
    detail::throw_undefined_tensor();
  return *impl_;
}
inline const Shape& Tensor::shape() const {
  return impl().shape;
}
inline std::int64_t Tensor::numel() const {
  return impl().numel;
}
inline DType Tensor::dtype() const {
  return impl().dtype;
}
inline Device Tensor::device() const {
  return impl().storage->device();
}
inline void* Tensor::raw_data() const {
  return impl().storage->data();
}
inline const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl().storage;
}

// ---- creation -----------------------------------------------------------------------------------
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// Standard normal (mean 0, std 1) and uniform [low, high): a pure function of (seed, element
// index); bitwise the same on every device (engine/runtime/random.h).
Tensor randn(const Shape& shape, std::uint64_t seed, TensorOptions options = {});
Tensor uniform(const Shape& shape, double low, double high, std::uint64_t seed,
               TensorOptions options = {});
// From host values; values.size() must equal the shape's element count.
Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<std::int32_t>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<bf16>& values, const Shape& shape,
                   Device device = Device::cpu());

}  // namespace graphward
