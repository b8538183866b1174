#pragma once
// graphward errors. Every failure the library reports is a graphward::Error (or a subclass) whose
// message says what was wrong and what was expected, followed by where it was detected.
//
// This header is the leaf of the runtime: it includes nothing else of graphward, which is why
// kernels/ (below engine/ in the dependency order) may include it for its launch checks.
//
//   GW_CHECK(cond, parts...)  precondition; the parts are streamed into the message.
//   GW_CUDA_CHECK(expr)       a CUDA runtime call; throws CudaError naming the expression.
//   GW_CUBLAS_CHECK(expr)     a cuBLAS call.
//   GW_CUDNN_CHECK(expr)      a cuDNN call.
//   GW_LAUNCH_CHECK()         the last kernel launch (cudaGetLastError).
//
// Destructors never throw: they report through detail::log_error.
#include <sstream>
#include <stdexcept>
#include <string>

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

namespace detail {

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
