#include "graphward/base/error.h"

#include <atomic>
#include <cstdio>

#if GRAPHWARD_HAS_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif
#if GRAPHWARD_HAS_CUDNN
#include <cudnn.h>
#endif

namespace graphward {

bool is_sticky_cuda_error(int code) noexcept {
#if GRAPHWARD_HAS_CUDA
  switch (static_cast<cudaError_t>(code)) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
#else
  (void)code;
  return false;
#endif
}

namespace detail {
namespace {
thread_local std::shared_ptr<const std::string> t_last_graph_launch;

std::string where(const char* file, int line) {
  return concat(" [at ", file, ":", line, "]");
}

#if GRAPHWARD_HAS_CUDA
const char* cublas_status_name(int code) {
  switch (static_cast<cublasStatus_t>(code)) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_<unknown>";
}
#endif

std::string cuda_message(const char* expression, int code) {
#if GRAPHWARD_HAS_CUDA
  const auto err = static_cast<cudaError_t>(code);
  return concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in `",
                expression, "`");
#else
  return concat("CUDA error ", code, " in `", expression, "`");
#endif
}

}  // namespace

void throw_check_failure(const char* file, int line, const char* condition,
                         const std::string& message) {
  throw Error(
      concat("graphward: ", message, where(file, line), " (failed check: ", condition, ")"));
}

void note_graph_launch(const std::shared_ptr<const std::string>& what) noexcept {
  t_last_graph_launch = what;
}

void throw_cuda_failure(const char* file, int line, const char* expression, int code) {
#if GRAPHWARD_HAS_CUDA
  if (code == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: a later launch check must not see it again
    throw OutOfMemoryError(concat(
        "graphward: out of device memory: ", cuda_message(expression, code), where(file, line),
        "; expected: less memory in use (free tensors you keep, "
        "empty_cache(), a smaller batch)"));
  }
#endif
  if (is_sticky_cuda_error(code)) {  // Note [Kernel faults]
    throw CudaError(
        concat("graphward: ", cuda_message(expression, code), where(file, line),
               ": a kernel faulted earlier (reported by the first CUDA call after it). The CUDA "
               "context of this process is lost: every later CUDA call fails, and graphward "
               "cannot be used again in this process. ",
               t_last_graph_launch ? concat("The last CUDA graph graphward launched on this "
                                            "thread, the first suspect: ",
                                            *t_last_graph_launch, ". ")
                                   : std::string(),
               "Expected: fix the fault and restart the process; to name the failing node, "
               "run with GRAPHWARD_LOCALIZE_FAULTS=1 (each backward eager, synchronized after "
               "every node), or under compute-sanitizer"),
        code);
  }
  throw CudaError(concat("graphward: ", cuda_message(expression, code), where(file, line)), code);
}

void throw_cublas_failure(const char* file, int line, const char* expression, int code) {
#if GRAPHWARD_HAS_CUDA
  const char* name = cublas_status_name(code);
  const char* text = cublasGetStatusString(static_cast<cublasStatus_t>(code));
#else
  const char* name = "cuBLAS status";
  const char* text = "cuBLAS is not available in this build";
#endif
  throw CudaError(concat("graphward: cuBLAS error ", name, " (", text, ") in `", expression, "`",
                         where(file, line)),
                  code);
}

void throw_cudnn_failure(const char* file, int line, const char* expression, int code) {
#if GRAPHWARD_HAS_CUDNN
  const char* text = cudnnGetErrorString(static_cast<cudnnStatus_t>(code));
#else
  const char* text = "cuDNN is not available in this build";
#endif
  throw CudaError(concat("graphward: cuDNN error ", code, " (", text, ") in `", expression, "`",
                         where(file, line)),
                  code);
}

void log_error(const char* file, int line, const std::string& message) noexcept {
  std::fprintf(stderr, "graphward: error (not thrown): %s%s\n", message.c_str(),
               where(file, line).c_str());
}

void log_cuda_failure(const char* file, int line, const char* expression, int code) noexcept {
#if GRAPHWARD_HAS_CUDA
  // At process exit the runtime may already be unloaded; freeing then is harmless and not news.
  if (code == cudaErrorCudartUnloading) return;
#endif
  // Note [Kernel faults]: once the context is lost every destructor's free fails the same way;
  // the first says so, the rest are not news.
  static std::atomic<bool> lost_reported{false};
  if (is_sticky_cuda_error(code)) {
    if (lost_reported.exchange(true)) return;
    log_error(file, line,
              cuda_message(expression, code) +
                  " — the CUDA context is lost (Note [Kernel faults]); graphward's later failures "
                  "to free memory or destroy events are not reported");
    return;
  }
  log_error(file, line, cuda_message(expression, code));
}

void check_output_path(const char* what, const std::string& path) {
  GW_CHECK(!path.empty(), what, ": the path is empty; expected a file to write");
  const std::size_t nul = path.find('\0');
  GW_CHECK(nul == std::string::npos, what, ": the path holds a NUL byte at ", nul, " (after \"",
           path.substr(0, nul),
           "\"); expected a path without one (the file of the part before it "
           "would be written instead)");
}

}  // namespace detail
}  // namespace graphward
