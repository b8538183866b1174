#pragma once
// Tensors to and from other libraries without a copy, through DLPack.
//
// Note [DLPack]
// DLPack is the C struct every array library exchanges tensors through (PyTorch's at::toDLPack
// and at::fromDLPack, CuPy, JAX, NumPy): a DLTensor (data, device, dtype, shape, strides) inside a
// managed tensor whose deleter its consumer calls when done — DLManagedTensor, or
// DLManagedTensorVersioned since DLPack 1.0 (a version and flags besides). from_dlpack and
// to_dlpack are templates over that struct, read and written by its field names, so they take the
// caller's own dlpack.h (PyTorch's ATen/dlpack.h, or dlpack/dlpack.h) and graphward needs none.
//
// from_dlpack(managed): a tensor over the same memory. Taken as graphward's tensors are:
// contiguous and row-major (strides null, or those of a compact row-major layout; a dimension of
// size 1 may have any stride), float32, float64 (CPU), int32 or bfloat16, one lane, on the CPU or
// a CUDA device of this process, writable. Anything else is refused with an error that names the
// field and what was expected; then nothing was taken: the managed tensor is still the caller's,
// its deleter not called. Once accepted it is graphward's: the deleter runs when the last tensor
// over the memory goes (at once for a tensor of no elements, which keeps no memory), also if
// making the tensor fails after the checks (out of host memory). A managed tensor is consumed once:
// one imported again while the tensor of its first import lives is refused by name.
// Streams (CUDA): `stream` is the one whose work wrote the data and on which its owner reuses the
// memory once released — for PyTorch, its current stream (at::cuda::getCurrentCUDAStream());
// by default graphward's current stream of the device. Work on other streams waits for it before
// reading the tensor (rule [read after write]), and before the deleter runs, `stream` waits for
// every other stream that used the memory (rule [reuse after use]: Note [Adopted storage],
// engine/runtime/memory.h). The stream must outlive the tensor.
//
// to_dlpack<Managed>(tensor): a new managed tensor over the tensor's memory, keeping it alive until
// its deleter is called. `stream` is the one the consumer uses it on (by default graphward's
// current stream of the device): it waits for graphward's work on the tensor first, and
// graphward's later work waits for it — the consumer may write the tensor there — and orders the
// memory's reuse after it. The consumer's writes are not counted as in-place writes by autograd
// (a tensor a recorded node saved must not be written through DLPack before its backward).
// Neither function is allowed inside a stream capture (the tensor would be baked into the graph).
#include <cstdint>
#include <memory>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/runtime/tensor.h"

namespace graphward {

struct FromDLPackOptions {
  // CUDA: the stream whose work wrote the data and on which its owner reuses the memory once
  // released; null: graphward's current stream of the device.
  cudaStream_t stream = nullptr;
};

struct ToDLPackOptions {
  // CUDA: the stream the consumer uses the tensor on; null: graphward's current stream of the
  // device.
  cudaStream_t stream = nullptr;
};

namespace detail {
// DLPack's codes (fixed by its ABI).
inline constexpr std::int32_t kDLCPU = 1, kDLCUDA = 2;
inline constexpr std::uint8_t kDLInt = 0, kDLFloat = 2, kDLBfloat = 4;
inline constexpr std::uint64_t kDLReadOnlyFlag = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY

// What from_dlpack reads of a managed tensor.
struct DLPackFields {
  void* data = nullptr;
  std::int32_t device_type = 0;
  std::int32_t device_id = 0;
  std::int32_t ndim = 0;
  std::uint8_t code = 0;
  std::uint8_t bits = 0;
  std::uint16_t lanes = 0;
  const std::int64_t* shape = nullptr;
  const std::int64_t* strides = nullptr;
  std::uint64_t byte_offset = 0;
  int version_major = -1;  // a versioned tensor's (DLPack 1.x); -1 for a DLManagedTensor
  int version_minor = 0;
  std::uint64_t flags = 0;
};

// The checks of from_dlpack: what the tensor will be (throws, taking nothing, if it cannot be).
struct DLPackImport {
  Device device;
  DType dtype = DType::kFloat32;
  Shape shape;
  void* data = nullptr;  // data + byte_offset
  std::size_t bytes = 0;
  cudaStream_t stream = nullptr;
};
DLPackImport check_dlpack(const DLPackFields& fields, cudaStream_t stream);
// The tensor over the checked memory; `owner` (which calls the deleter) goes with its storage.
Tensor adopt_dlpack(const DLPackImport& import, std::shared_ptr<const void> owner);

// A to_dlpack's manager_ctx: the tensor it keeps alive, and the arrays the DLTensor points into.
struct DLPackExport {
  Tensor tensor;
  std::vector<std::int64_t> shape, strides;
  void* data = nullptr;
  std::int32_t device_type = kDLCPU, device_id = 0;
  std::uint8_t code = kDLFloat, bits = 32;
};
// A managed tensor taken by from_dlpack until its deleter runs: claim_dlpack refuses one taken
// already (its deleter would run twice).
void claim_dlpack(const void* managed);
void forget_dlpack(const void* managed) noexcept;
// Checks the tensor, orders the consumer's stream (Note [DLPack]) and fills the export.
std::unique_ptr<DLPackExport> export_dlpack(const Tensor& tensor, cudaStream_t stream);
}  // namespace detail

// A tensor over a DLPack managed tensor's memory (Note [DLPack]). `Managed`: DLManagedTensor or
// DLManagedTensorVersioned, from the caller's dlpack.h.
template <class Managed>
Tensor from_dlpack(Managed* managed, const FromDLPackOptions& options = {}) {
  GW_CHECK(managed != nullptr, "from_dlpack: expected a DLPack managed tensor, got null");
  const auto& t = managed->dl_tensor;
  detail::DLPackFields f;
  f.data = t.data;
  f.device_type = static_cast<std::int32_t>(t.device.device_type);
  f.device_id = static_cast<std::int32_t>(t.device.device_id);
  f.ndim = static_cast<std::int32_t>(t.ndim);
  f.code = static_cast<std::uint8_t>(t.dtype.code);
  f.bits = static_cast<std::uint8_t>(t.dtype.bits);
  f.lanes = static_cast<std::uint16_t>(t.dtype.lanes);
  f.shape = t.shape;
  f.strides = t.strides;
  f.byte_offset = static_cast<std::uint64_t>(t.byte_offset);
  if constexpr (requires {
                  managed->version.major;
                  managed->flags;
                }) {
    f.version_major = static_cast<int>(managed->version.major);
    f.version_minor = static_cast<int>(managed->version.minor);
    f.flags = static_cast<std::uint64_t>(managed->flags);
  }
  const detail::DLPackImport import = detail::check_dlpack(f, options.stream);
  detail::claim_dlpack(managed);  // refused if it was imported already and not yet deleted
  // Accepted: from here on the managed tensor is graphward's, and whatever happens its deleter
  // runs once.
  std::shared_ptr<const void> owner(managed, [](const void* p) {
    auto* m = static_cast<Managed*>(const_cast<void*>(p));
    detail::forget_dlpack(m);
    if (m->deleter) m->deleter(m);
  });
  return detail::adopt_dlpack(import, std::move(owner));
}

// A new DLPack managed tensor over `tensor`'s memory (Note [DLPack]); its consumer calls its
// deleter. `Managed`: DLManagedTensor or DLManagedTensorVersioned (version 1.0, no flags).
template <class Managed>
Managed* to_dlpack(const Tensor& tensor, const ToDLPackOptions& options = {}) {
  std::unique_ptr<detail::DLPackExport> ex = detail::export_dlpack(tensor, options.stream);
  auto managed = std::make_unique<Managed>();
  auto& t = managed->dl_tensor;
  t.data = ex->data;
  t.device.device_type = static_cast<decltype(t.device.device_type)>(ex->device_type);
  t.device.device_id = ex->device_id;
  t.ndim = static_cast<decltype(t.ndim)>(ex->shape.size());
  t.dtype.code = ex->code;
  t.dtype.bits = ex->bits;
  t.dtype.lanes = 1;
  t.shape = ex->shape.data();
  t.strides = ex->strides.data();
  t.byte_offset = 0;
  if constexpr (requires {
                  managed->version.major;
                  managed->flags;
                }) {
    managed->version.major = 1;
    managed->version.minor = 0;
    managed->flags = 0;
  }
  managed->manager_ctx = ex.release();
  managed->deleter = [](Managed* m) {
    if (!m) return;
    delete static_cast<detail::DLPackExport*>(m->manager_ctx);
    delete m;
  };
  return managed.release();
}

}  // namespace graphward
