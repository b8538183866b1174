#include "engine/blas.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/error.h"
#include "engine/memory.h"

namespace graphward {

#if GRAPHWARD_HAS_CUDA
namespace {

// Move-only owner of a cublasHandle_t.
class BlasHandle {
 public:
  explicit BlasHandle(Device device) : device_(device) {
    DeviceGuard guard(device);
    GW_CUBLAS_CHECK(cublasCreate(&handle_));
    const cublasStatus_t mode = cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH);  // no TF32
    if (mode != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle_);
      GW_CUBLAS_CHECK(mode);
    }
  }
  ~BlasHandle() {
    if (handle_) {
      DeviceGuard guard(device_);
      const cublasStatus_t st = cublasDestroy(handle_);
      if (st != CUBLAS_STATUS_SUCCESS) {
        detail::log_error(__FILE__, __LINE__, "cublasDestroy failed while releasing a handle");
      }
    }
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  Device device_;
  cublasHandle_t handle_ = nullptr;
};

// One handle per stream, bound once to that stream and its own workspace.
struct StreamBlas {
  StreamBlas(Device device, cudaStream_t stream)
      : handle(device), workspace(device, kBlasWorkspaceBytes) {
    GW_CUBLAS_CHECK(cublasSetStream(handle.get(), stream));
    GW_CUBLAS_CHECK(cublasSetWorkspace(handle.get(), workspace.data(), workspace.bytes()));
  }
  BlasHandle handle;
  DeviceBuffer workspace;
};

struct DeviceBlas {
  std::unordered_map<cudaStream_t, std::unique_ptr<StreamBlas>> streams;
  cudaStream_t last_stream = nullptr;  // one-entry cache in front of the map
  StreamBlas* last = nullptr;
};

// Per thread: one entry per device touched. Destroyed at thread exit (before the runtime unloads
// for the main thread, since thread_local destructors run before atexit handlers).
thread_local std::vector<std::unique_ptr<DeviceBlas>> t_blas;

DeviceBlas& device_blas(Device device) {
  check_cuda_device(device, "blas_context");
  if (t_blas.size() <= static_cast<std::size_t>(device.index)) t_blas.resize(device.index + 1);
  auto& slot = t_blas[device.index];
  if (!slot) slot = std::make_unique<DeviceBlas>();
  return *slot;
}

}  // namespace

kernels::BlasContext blas_context(Device device, cudaStream_t stream) {
  DeviceBlas& blas = device_blas(device);
  if (blas.last_stream != stream || !blas.last) {
    auto it = blas.streams.find(stream);
    if (it == blas.streams.end()) {
      it = blas.streams.emplace(stream, std::make_unique<StreamBlas>(device, stream)).first;
    }
    blas.last_stream = stream;
    blas.last = it->second.get();
  }
  StreamBlas& sb = *blas.last;
  return {sb.handle.get(), sb.workspace.data(), sb.workspace.bytes(), stream};
}

#endif

}  // namespace graphward
