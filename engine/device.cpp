#include "engine/device.h"

#include <mutex>
#include <vector>

#include <cfloat>
#include <cmath>

#include "engine/checked.h"
#include "engine/cuda.h"
#include "base/dtype.h"
#include "base/error.h"

namespace graphward {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 8;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      break;
  }
  return 4;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      break;
  }
  return "float32";
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::int64_t shape_numel(const Shape& shape) {
  bool empty = false;
  for (std::int64_t d : shape) {
    GW_CHECK(d >= 0, "shape ", shape_str(shape), " has a negative dimension; expected sizes >= 0");
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    GW_CHECK(checked::mul(n, d, &n), "shape ", shape_str(shape),
             " has more elements than fit in int64");
  }
  return n;
}

std::size_t shape_nbytes(const Shape& shape, DType dtype) {
  const std::int64_t n = shape_numel(shape);
  const std::int64_t size = static_cast<std::int64_t>(dtype_size(dtype));
  std::int64_t bytes = 0;
  GW_CHECK(checked::mul(n, size, &bytes), "a ", dtype_name(dtype), shape_str(shape),
           " tensor would hold ", n, " elements of ", size,
           " bytes: more bytes than fit in int64; "
           "expected a size an allocation can hold");
  return static_cast<std::size_t>(bytes);
}

bool finite_as(double value, DType dtype) {
  return dtype == DType::kFloat64 || dtype == DType::kInt32 ||
         std::fabs(value) <= static_cast<double>(FLT_MAX);
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

namespace {

struct CudaProbe {
  int count = 0;
  std::string reason;
};

const CudaProbe& probe() {
  static const CudaProbe result = [] {
    CudaProbe p;
#if GRAPHWARD_HAS_CUDA
    const cudaError_t err = cudaGetDeviceCount(&p.count);
    if (err != cudaSuccess) {
      p.count = 0;
      p.reason = detail::concat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
      (void)cudaGetLastError();  // the probe's failure is an answer, not a sticky error
    } else if (p.count == 0) {
      p.reason = "the CUDA runtime reports 0 devices";
    }
#else
    p.reason = "graphward was built without CUDA (no CUDA toolkit at configure time)";
#endif
    return p;
  }();
  return result;
}

}  // namespace

int cuda_device_count() noexcept {
  try {
    return probe().count;
  } catch (...) {
    return 0;
  }
}

std::string cuda_unavailable_reason() {
  return probe().reason;
}

void check_cuda_device(Device device, const char* what) {
  GW_CHECK(device.is_cuda(), what, ": expected a CUDA device, got ", device.str());
  const int count = cuda_device_count();
  GW_CHECK(count > 0, what, ": needs ", device.str(), " but no CUDA device is usable (",
           cuda_unavailable_reason(), ")");
  GW_CHECK(device.index >= 0 && device.index < count, what, ": device ", device.str(),
           " does not exist; this process sees ", count, " CUDA device(s)");
}

std::string device_name(Device device) {
  if (device.is_cpu()) return "cpu";
  check_cuda_device(device, "device_name");
#if GRAPHWARD_HAS_CUDA
  cudaDeviceProp prop{};
  GW_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  return prop.name;
#else
  return "";
#endif
}

DeviceThroughput device_throughput(Device device) {
#if GRAPHWARD_HAS_CUDA
  // Every device's, read once (the first call; a thread-safe static).
  static const std::vector<DeviceThroughput> known = [] {
    std::vector<DeviceThroughput> all(static_cast<std::size_t>(cuda_device_count()));
    for (int d = 0; d < static_cast<int>(all.size()); ++d) {
      auto attribute = [d](cudaDeviceAttr a) {
        int v = 0;
        return cudaDeviceGetAttribute(&v, a, d) == cudaSuccess ? static_cast<double>(v) : 0.0;
      };
      // kHz × 1e-3 = cycles a microsecond.
      all[d] = {.flops_per_us = 128.0 * attribute(cudaDevAttrMultiProcessorCount) *
                                attribute(cudaDevAttrClockRate) * 1e-3,
                .bytes_per_us = 2.0 * attribute(cudaDevAttrMemoryClockRate) * 1e-3 *
                                attribute(cudaDevAttrGlobalMemoryBusWidth) / 8.0};
    }
    (void)cudaGetLastError();  // a failed read is an unknown rate, not a sticky error
    return all;
  }();
  if (!device.is_cuda() || device.index < 0 || device.index >= static_cast<int>(known.size())) {
    return {};
  }
  return known[static_cast<std::size_t>(device.index)];
#else
  (void)device;
  return {};
#endif
}

DeviceGuard::DeviceGuard(Device device) {
#if GRAPHWARD_HAS_CUDA
  if (!device.is_cuda()) return;
  check_cuda_device(device, "DeviceGuard");
  int current = 0;
  GW_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index) {
    GW_CUDA_CHECK(cudaSetDevice(device.index));
    previous_ = current;
  }
#else
  (void)device;
#endif
}

DeviceGuard::~DeviceGuard() {
#if GRAPHWARD_HAS_CUDA
  if (previous_ >= 0) GW_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
#endif
}

}  // namespace graphward
