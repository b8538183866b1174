#pragma once
// Devices: where a tensor lives (the CPU or CUDA device n) and what this process can see.
// A machine without a GPU (or a build without CUDA) is a normal state, reported by
// cuda_device_count() == 0 with a reason, never by a failure.
#include <cstdint>
#include <string>

namespace graphward {

struct Device {
  enum class Type : std::uint8_t { kCPU, kCUDA };
  Type type = Type::kCPU;
  int index = 0;  // the CUDA ordinal; 0 for the CPU

  static constexpr Device cpu() { return {Type::kCPU, 0}; }
  static constexpr Device cuda(int index = 0) { return {Type::kCUDA, index}; }
  constexpr bool is_cpu() const { return type == Type::kCPU; }
  constexpr bool is_cuda() const { return type == Type::kCUDA; }
  friend constexpr bool operator==(Device, Device) = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// Number of usable CUDA devices: 0 in a CPU-only build, with no driver, or with no GPU.
int cuda_device_count() noexcept;
inline bool cuda_available() noexcept {
  return cuda_device_count() > 0;
}
// Why cuda_device_count() is 0 ("" when it is not), e.g. "no CUDA-capable device is detected".
std::string cuda_unavailable_reason();
// The device's name as the driver reports it (e.g. "NVIDIA H200"); "cpu" for the CPU.
std::string device_name(Device device);
// Throws a graphward::Error naming `what` unless `device` is a CUDA device this process can use
// and this build has code for (Note [Code for the device], engine/runtime/device.cpp).
void check_cuda_device(Device device, const char* what);
namespace detail {
// The question check_cuda_device asks a device once, asked now for another build's code: `probe`
// returns the cudaError_t of cudaFuncGetAttributes on one of its kernels (on the current device),
// `built` names the CUDA architectures it was built for. Throws the error check_cuda_device
// would; nothing is kept.
void check_device_code(Device device, const char* what, int (*probe)(), const char* built);
}  // namespace detail

// What a device can do at most, for estimates that decide how work is issued (Note [Streams of an
// eager backward], engine/backward/backward_plan.h): float32 floating-point operations a microsecond,
// counted at 128 a clock and multiprocessor (the fewest of the GPUs graphward builds for, compute
// capability 8.0 on: an estimate is long rather than short), and bytes of device memory a
// microsecond (its clock × bus width × 2). Read from the driver once per device; zeros for the
// CPU and for a device that cannot be read.
struct DeviceThroughput {
  double flops_per_us = 0;
  double bytes_per_us = 0;
};
DeviceThroughput device_throughput(Device device);

// Makes `device` the current CUDA device for the scope; restores the previous one. No-op for the
// CPU and when the device is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace graphward
