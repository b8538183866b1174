#include "graphward/engine/runtime/dlpack.h"

#include <mutex>
#include <string>
#include <unordered_set>

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/checked.h"
#include "graphward/engine/runtime/cuda.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/engine/runtime/memory.h"

namespace graphward::detail {
namespace {

const char* device_type_name(std::int32_t type) {
  switch (type) {
    case 1:
      return "kDLCPU";
    case 2:
      return "kDLCUDA";
    case 3:
      return "kDLCUDAHost (pinned host memory)";
    case 4:
      return "kDLOpenCL";
    case 7:
      return "kDLVulkan";
    case 8:
      return "kDLMetal";
    case 9:
      return "kDLVPI";
    case 10:
      return "kDLROCM";
    case 11:
      return "kDLROCMHost";
    case 12:
      return "kDLExtDev";
    case 13:
      return "kDLCUDAManaged (managed memory)";
    case 14:
      return "kDLOneAPI";
    default:
      return "an unknown device type";
  }
}

DType dtype_of_dlpack(const DLPackFields& f, Device device) {
  GW_CHECK(f.lanes == 1, "from_dlpack: the tensor's dtype has ", f.lanes,
           " lanes; expected 1 (graphward has no vector types)");
  if (f.code == kDLFloat && f.bits == 32) return DType::kFloat32;
  if (f.code == kDLInt && f.bits == 32) return DType::kInt32;
  if (f.code == kDLBfloat && f.bits == 16) return DType::kBFloat16;
  if (f.code == kDLFloat && f.bits == 64) {
    GW_CHECK(device.is_cpu(), "from_dlpack: a float64 tensor on ", device.str(),
             "; graphward holds float64 on the CPU only (convert it to float32 first)");
    return DType::kFloat64;
  }
  GW_CHECK(false, "from_dlpack: the tensor's dtype is code ", static_cast<int>(f.code), " with ",
           static_cast<int>(f.bits),
           " bits; expected float32 (code 2, 32 bits), float64 (2, 64, "
           "CPU), int32 (0, 32) or bfloat16 (4, 16)");
  return DType::kFloat32;
}

std::string dims_str(const std::int64_t* v, std::int32_t n) {
  std::string s = "[";
  for (std::int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

DLPackImport check_dlpack(const DLPackFields& f, cudaStream_t stream) {
  check_capturable("from_dlpack");
  GW_CHECK(f.version_major < 0 || f.version_major == 1, "from_dlpack: a DLPack ", f.version_major,
           ".", f.version_minor, " tensor; expected DLPack 1.x");
  GW_CHECK((f.flags & kDLReadOnlyFlag) == 0,
           "from_dlpack: the tensor is read-only; graphward may "
           "write any tensor in place (optimizers, in-place ops), so expected a writable one");
  DLPackImport im;
  if (f.device_type == kDLCPU) {
    im.device = Device::cpu();
  } else if (f.device_type == kDLCUDA) {
    GW_CHECK(f.device_id >= 0, "from_dlpack: CUDA device id ", f.device_id,
             "; expected a device of this process");
    im.device = Device::cuda(f.device_id);
    check_cuda_device(im.device, "from_dlpack");
  } else {
    GW_CHECK(false, "from_dlpack: the tensor is on device type ", f.device_type, " (",
             device_type_name(f.device_type), "); expected kDLCPU (1) or kDLCUDA (2)");
  }
  im.dtype = dtype_of_dlpack(f, im.device);
  GW_CHECK(f.ndim >= 0, "from_dlpack: ndim is ", f.ndim, "; expected 0 or more dimensions");
  GW_CHECK(f.ndim == 0 || f.shape != nullptr, "from_dlpack: ndim is ", f.ndim,
           " but the shape is null; expected ", f.ndim, " sizes");
  im.shape.assign(f.shape, f.shape + f.ndim);
  for (std::int32_t d = 0; d < f.ndim; ++d) {
    GW_CHECK(im.shape[d] >= 0, "from_dlpack: shape ", dims_str(f.shape, f.ndim),
             " has a negative size; expected sizes >= 0");
  }
  std::int64_t numel = 1;
  for (std::int64_t s : im.shape) {
    GW_CHECK(checked::mul(numel, s, &numel), "from_dlpack: shape ", dims_str(f.shape, f.ndim),
             " has more elements than fit in int64");
  }
  // Contiguous and row-major: each stride is the product of the sizes after it (a size-1
  // dimension's stride is never used to reach an element; nor is any, with no elements).
  if (f.strides && numel > 0) {
    std::int64_t expected = 1;
    for (std::int32_t d = f.ndim - 1; d >= 0; --d) {
      GW_CHECK(im.shape[d] == 1 || f.strides[d] == expected, "from_dlpack: strides ",
               dims_str(f.strides, f.ndim), " of shape ", dims_str(f.shape, f.ndim),
               " are not those of a contiguous row-major tensor; graphward's tensors are "
               "contiguous: make it contiguous first (PyTorch: .contiguous())");
      expected *= im.shape[d];
    }
  }
  std::int64_t bytes = 0;
  GW_CHECK(checked::mul(numel, static_cast<std::int64_t>(dtype_size(im.dtype)), &bytes),
           "from_dlpack: a ", dtype_name(im.dtype), dims_str(f.shape, f.ndim),
           " tensor holds more bytes than fit in int64");
  im.bytes = static_cast<std::size_t>(bytes);
  if (im.bytes == 0) return im;  // no memory is kept (Note [DLPack])
  GW_CHECK(f.data != nullptr, "from_dlpack: ", dtype_name(im.dtype), dims_str(f.shape, f.ndim),
           " with null data; expected the address of its ", numel, " elements");
  const auto base = reinterpret_cast<std::uintptr_t>(f.data);
  GW_CHECK(f.byte_offset <= UINTPTR_MAX - base, "from_dlpack: byte_offset ", f.byte_offset,
           " runs past the end of the address space");
  im.data = reinterpret_cast<void*>(base + f.byte_offset);
  GW_CHECK(reinterpret_cast<std::uintptr_t>(im.data) % dtype_size(im.dtype) == 0,
           "from_dlpack: the data (with byte_offset ", f.byte_offset,
           ") is not aligned to its elements' ", dtype_size(im.dtype), " bytes");
#if GRAPHWARD_HAS_CUDA
  // Where the memory really is, when the runtime can say: a device address labelled as host memory
  // (or memory of another device) would fault in the first kernel.
  if (cuda_available()) {
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, im.data);
    if (err != cudaSuccess) (void)cudaGetLastError();
    if (err == cudaSuccess && im.device.is_cuda()) {
      GW_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
               "from_dlpack: the tensor says ", im.device.str(),
               " but its data is not device "
               "memory (the CUDA runtime reports memory type ",
               static_cast<int>(attr.type), ")");
      GW_CHECK(attr.device == im.device.index, "from_dlpack: the tensor says ", im.device.str(),
               " but its data is memory of cuda:", attr.device);
    } else if (err == cudaSuccess) {
      GW_CHECK(attr.type != cudaMemoryTypeDevice,
               "from_dlpack: the tensor says kDLCPU but its "
               "data is memory of cuda:",
               attr.device, "; expected host memory");
    }
  }
  if (im.device.is_cuda()) {
    im.stream = stream ? stream : current_stream(im.device);
    GW_CHECK(!stream_is_capturing(im.stream),
             "from_dlpack: its stream is being captured into a "
             "CUDA graph; import the tensor before the capture");
  }
#else
  (void)stream;
#endif
  return im;
}

namespace {
// The managed tensors imported and not yet deleted (Note [DLPack]): one imported twice would have
// its deleter run twice.
std::mutex g_imported_mutex;
std::unordered_set<const void*>& imported() {
  static auto* set = new std::unordered_set<const void*>();  // never freed: deleters run late
  return *set;
}
}  // namespace

void claim_dlpack(const void* managed) {
  std::lock_guard<std::mutex> lock(g_imported_mutex);
  GW_CHECK(imported().insert(managed).second,
           "from_dlpack: this managed tensor was imported already and its tensor is still alive; "
           "a DLPack tensor is consumed once (its deleter runs once): import it once and share "
           "the graphward tensor, or export a new one");
}

void forget_dlpack(const void* managed) noexcept {
  std::lock_guard<std::mutex> lock(g_imported_mutex);
  imported().erase(managed);
}

Tensor adopt_dlpack(const DLPackImport& im, std::shared_ptr<const void> owner) {
  if (im.bytes == 0) return Tensor::empty(im.shape, {im.dtype, im.device});  // owner goes now
  return Tensor::from_storage(
      Storage::adopt(im.device, im.data, im.bytes, im.stream, std::move(owner)), im.shape,
      im.dtype);
}

std::unique_ptr<DLPackExport> export_dlpack(const Tensor& tensor, cudaStream_t stream) {
  check_capturable("to_dlpack");
  GW_CHECK(tensor.defined(), "to_dlpack: expected a tensor, got an undefined one");
  auto ex = std::make_unique<DLPackExport>();
  switch (tensor.dtype()) {
    case DType::kFloat32:
      ex->code = kDLFloat, ex->bits = 32;
      break;
    case DType::kFloat64:
      ex->code = kDLFloat, ex->bits = 64;
      break;
    case DType::kInt32:
      ex->code = kDLInt, ex->bits = 32;
      break;
    case DType::kBFloat16:
      ex->code = kDLBfloat, ex->bits = 16;
      break;
  }
  const Device device = tensor.device();
  ex->device_type = device.is_cpu() ? kDLCPU : kDLCUDA;
  ex->device_id = device.is_cpu() ? 0 : device.index;
  ex->shape = tensor.shape();
  // Contiguous row-major strides, each the product of the sizes after it: of a tensor with no
  // elements those need not fit in int64 ([0, 2^62, 2^62]), and a wrapped stride is refused here,
  // not exported.
  ex->strides.assign(ex->shape.size(), 1);
  for (std::size_t d = ex->shape.size(); d-- > 1;) {
    GW_CHECK(checked::mul(ex->strides[d], ex->shape[d], &ex->strides[d - 1]),
             "to_dlpack: ", tensor.str(), " has strides that do not fit in int64 (dimension ",
             d - 1,
             "'s is the product of the sizes after it); expected a shape whose strides fit, as "
             "a DLPack tensor carries them");
  }
  ex->data = tensor.raw_data();
#if GRAPHWARD_HAS_CUDA
  if (device.is_cuda()) {
    const cudaStream_t consumer = stream ? stream : current_stream(device);
    GW_CHECK(!stream_is_capturing(consumer),
             "to_dlpack: the consumer's stream is being captured "
             "into a CUDA graph; export the tensor before the capture");
    // The consumer may write it: its stream waits for graphward's work on it, later work waits
    // for the consumer's stream, and the memory's reuse is ordered after it (Note [DLPack]).
    DeviceGuard guard(device);
    tensor.storage()->sync_for_write(consumer);
  }
#else
  (void)stream;
#endif
  ex->tensor = tensor;
  return ex;
}

}  // namespace graphward::detail
