#include "graphward/engine/runtime/device.h"

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include <cfloat>
#include <cmath>

#include "graphward/base/dtype.h"
#include "graphward/base/error.h"
#include "graphward/engine/runtime/checked.h"
#include "graphward/engine/runtime/cuda.h"
#if GRAPHWARD_HAS_CUDA
#include "graphward/kernels/code_probe.h"
#endif

namespace graphward {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 8;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
  }
  GW_CHECK(false, "dtype ", dtype_name(dtype),
           " is none of float32, float64, int32 and bfloat16 (a value cast to DType)");
  return 0;
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
      return "float32";
  }
  // A value that is no name: "DType(17)" (made once for every value the type holds).
  static const auto* names = [] {
    auto* n = new std::array<std::string, 256>();
    for (std::size_t i = 0; i < n->size(); ++i) (*n)[i] = "DType(" + std::to_string(i) + ")";
    return n;
  }();
  return (*names)[static_cast<std::uint8_t>(dtype)].c_str();
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

// Note [Code for the device]
// A build has machine code for the CUDA architectures it was built for (CMAKE_CUDA_ARCHITECTURES,
// GRAPHWARD_CUDA_ARCHITECTURES in base/config.h) and PTX the driver compiles for newer ones. On a
// GPU it has neither for, the first kernel launch fails deep inside an op with "no kernel image is
// available"; instead, the first use of each device asks the runtime whether a kernel of the
// build can run there (cudaFuncGetAttributes, kernels::code_probe) and, if not, every use of that
// device is refused with an error that names the device, its compute capability, the
// architectures built and the rebuild that fixes it. The answer is kept per device (an atomic
// load on every later check); a failure that may pass (a device busy or out of memory while the
// context is made) is reported and asked again next time.
namespace {
#if GRAPHWARD_HAS_CUDA
constexpr int kCodeDevices = 64;  // devices whose answer is kept; others are asked every time
constexpr std::uint8_t kCodeUnknown = 0, kCodeRuns = 1, kCodeRefused = 2;
std::array<std::atomic<std::uint8_t>, kCodeDevices> g_code_state{};
std::mutex g_code_mutex;
std::array<std::string, kCodeDevices> g_code_refusal;  // under g_code_mutex

// Whether `err` says the build cannot run on the device for good (rather than for now).
bool permanent_code_error(cudaError_t err) {
  switch (err) {
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidPtx:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
    case cudaErrorInvalidSource:
    case cudaErrorSharedObjectInitFailed:
      return true;
    default:
      return false;
  }
}

// Why `device` cannot run the build that `probe` belongs to ("" if it can), and whether that is
// for good.
std::string ask_device_code(Device device, int (*probe)(), const char* built, bool* permanent) {
  *permanent = false;
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device.index) err = cudaSetDevice(device.index);
  if (err == cudaSuccess) err = static_cast<cudaError_t>(probe());
  if (current >= 0 && current != device.index) (void)cudaSetDevice(current);
  if (err == cudaSuccess) return "";
  (void)cudaGetLastError();
  *permanent = permanent_code_error(err);
  cudaDeviceProp prop{};
  const bool named = cudaGetDeviceProperties(&prop, device.index) == cudaSuccess;
  (void)cudaGetLastError();
  const std::string which =
      named ? detail::concat(device.str(), " (", prop.name, ", compute capability ", prop.major,
                             ".", prop.minor, ")")
            : device.str();
  const std::string cause = detail::concat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (!*permanent) {
    return detail::concat(which, " could not be asked whether it runs graphward's kernels (", cause,
                          ")");
  }
  const std::string arch = named ? detail::concat(prop.major, prop.minor) : std::string("native");
  const bool ptx = err == cudaErrorUnsupportedPtxVersion || err == cudaErrorInvalidPtx ||
                   err == cudaErrorJitCompilerNotFound || err == cudaErrorJitCompilationDisabled;
  return detail::concat(
      which, " cannot run graphward's kernels: this build has code for CUDA architectures ",
      *built ? built : "(none)", " and ",
      ptx ? "the driver cannot compile its PTX for this GPU (" : "none of it runs here (", cause,
      "); rebuild graphward for this GPU with -DCMAKE_CUDA_ARCHITECTURES=", arch,
      " (or a list that includes it)", ptx ? ", or update the driver" : "");
}

int library_code_probe() {
  return static_cast<int>(kernels::code_probe());
}
#endif
}  // namespace

namespace detail {
void check_device_code(Device device, const char* what, int (*probe)(), const char* built) {
#if GRAPHWARD_HAS_CUDA
  bool permanent = false;
  const std::string refusal = ask_device_code(device, probe, built, &permanent);
  GW_CHECK(refusal.empty(), what, ": ", refusal);
#else
  (void)device, (void)what, (void)probe, (void)built;
#endif
}
}  // namespace detail

void check_cuda_device(Device device, const char* what) {
#if GRAPHWARD_HAS_CUDA
  // Every op asks (DeviceGuard, current_stream): a device whose code was found to run is one that
  // exists and is usable, with nothing more to ask.
  if (device.is_cuda() && device.index >= 0 && device.index < kCodeDevices &&
      g_code_state[device.index].load(std::memory_order_acquire) == kCodeRuns) {
    return;
  }
#endif
  GW_CHECK(device.is_cuda(), what, ": expected a CUDA device, got ", device.str());
  const int count = cuda_device_count();
  GW_CHECK(count > 0, what, ": needs ", device.str(), " but no CUDA device is usable (",
           cuda_unavailable_reason(), ")");
  GW_CHECK(device.index >= 0 && device.index < count, what, ": device ", device.str(),
           " does not exist; this process sees ", count, " CUDA device(s)");
#if GRAPHWARD_HAS_CUDA
  // Note [Code for the device] (the answer kept: the atomic load at the top)
  const bool kept = device.index < kCodeDevices;
  std::string refusal;
  {
    std::lock_guard<std::mutex> lock(g_code_mutex);
    const std::uint8_t state = kept ? g_code_state[device.index].load() : kCodeUnknown;
    if (state == kCodeRuns) return;
    if (state == kCodeRefused) {
      refusal = g_code_refusal[device.index];
    } else {
      bool permanent = false;
      refusal =
          ask_device_code(device, library_code_probe, GRAPHWARD_CUDA_ARCHITECTURES, &permanent);
      if (kept && refusal.empty()) {
        g_code_state[device.index].store(kCodeRuns, std::memory_order_release);
      } else if (kept && permanent) {
        g_code_refusal[device.index] = refusal;
        g_code_state[device.index].store(kCodeRefused, std::memory_order_release);
      }
    }
  }
  GW_CHECK(refusal.empty(), what, ": ", refusal);
#endif
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
