#pragma once
// graphward errors. Every failure the library reports is a graphward::Error (or a subclass) whose
// message says what was wrong and what was expected, followed by where it was detected.
//
// This header is the leaf of the runtime: it includes nothing else of graphward, which is why
// kernels/ (below runtime/ in the dependency order) may include it for its launch checks.
//
//   GW_CHECK(cond, parts...)  precondition; the parts are streamed into the message.
//   GW_CUDA_CHECK(expr)       a CUDA runtime call; throws CudaError naming the expression.
//   GW_CUBLAS_CHECK(expr)     a cuBLAS call.
//   GW_CUDNN_CHECK(expr)      a cuDNN call.
//   GW_LAUNCH_CHECK()         the last kernel launch (cudaGetLastError).
//
// Destructors never throw: they report through detail::log_error.
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include "graphward/base/config.h"

namespace graphward {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An error returned by the CUDA runtime, cuBLAS or cuDNN; code() is the library's status value.
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// Out of device memory (code() is cudaErrorMemoryAllocation): the message says what needed how
// much, on which device, and what graphward and the device held. Nothing is left half-made: the
// allocation did not happen, and a capture that needed it was abandoned.
class OutOfMemoryError : public CudaError {
 public:
  explicit OutOfMemoryError(const std::string& what)
      : CudaError(what, 2 /*cudaErrorMemoryAllocation*/) {}
};

// Note [Kernel faults]
// A kernel that faults (an illegal address, a trap, a device-side assert) leaves the CUDA context
// of the process unusable: every later CUDA call returns that error ("sticky"). graphward cannot
// undo that; it says so. A CudaError with such a code says that the context is lost and that the
// process must be restarted, and names the last CUDA graph graphward launched on the thread (a
// replayed backward or step): a fault is reported by the first CUDA call after it, often in later
// work, so the graph is the first suspect. To name the node, run the backward eagerly with a
// synchronize after each node: BackwardGraphOptions::localize_faults / BackwardOptions, or the
// environment variable GRAPHWARD_LOCALIZE_FAULTS=1 (engine/backward/backward.h).
// Whether `code` (a cudaError_t) is a sticky error: the context is lost.
bool is_sticky_cuda_error(int code) noexcept;

namespace detail {

// The CUDA graph graphward launched last on this thread (Note [Kernel faults]), described.
void note_graph_launch(const std::shared_ptr<const std::string>& what) noexcept;

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition,
                                      const std::string& message);
[[noreturn]] void throw_cuda_failure(const char* file, int line, const char* expression, int code);
[[noreturn]] void throw_cublas_failure(const char* file, int line, const char* expression,
                                       int code);
[[noreturn]] void throw_cudnn_failure(const char* file, int line, const char* expression, int code);
// Refuses a path a file cannot be written at as given: empty, or holding a NUL byte (the file of
// its prefix would be written instead).
void check_output_path(const char* what, const std::string& path);
// For destructors and other places that must not throw.
void log_error(const char* file, int line, const std::string& message) noexcept;
void log_cuda_failure(const char* file, int line, const char* expression, int code) noexcept;

}  // namespace detail
}  // namespace graphward

#define GW_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      ::graphward::detail::throw_check_failure(__FILE__, __LINE__, #cond,                 \
                                               ::graphward::detail::concat(__VA_ARGS__)); \
    }                                                                                     \
  } while (0)

#define GW_CUDA_CHECK(expr)                                                           \
  do {                                                                                \
    const int gw_status_ = static_cast<int>(expr);                                    \
    if (gw_status_ != 0) [[unlikely]] {                                               \
      ::graphward::detail::throw_cuda_failure(__FILE__, __LINE__, #expr, gw_status_); \
    }                                                                                 \
  } while (0)

// Checks in destructors: log, never throw.
#define GW_CUDA_CHECK_NOTHROW(expr)                                                 \
  do {                                                                              \
    const int gw_status_ = static_cast<int>(expr);                                  \
    if (gw_status_ != 0) {                                                          \
      ::graphward::detail::log_cuda_failure(__FILE__, __LINE__, #expr, gw_status_); \
    }                                                                               \
  } while (0)

#define GW_CUBLAS_CHECK(expr)                                                           \
  do {                                                                                  \
    const int gw_status_ = static_cast<int>(expr);                                      \
    if (gw_status_ != 0) [[unlikely]] {                                                 \
      ::graphward::detail::throw_cublas_failure(__FILE__, __LINE__, #expr, gw_status_); \
    }                                                                                   \
  } while (0)

#define GW_CUDNN_CHECK(expr)                                                           \
  do {                                                                                 \
    const int gw_status_ = static_cast<int>(expr);                                     \
    if (gw_status_ != 0) [[unlikely]] {                                                \
      ::graphward::detail::throw_cudnn_failure(__FILE__, __LINE__, #expr, gw_status_); \
    }                                                                                  \
  } while (0)

#define GW_LAUNCH_CHECK() GW_CUDA_CHECK(cudaGetLastError())
