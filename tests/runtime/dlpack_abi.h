#pragma once
// DLPack's C structs as its ABI lays them out (DLPack 1.x: DLManagedTensor and
// DLManagedTensorVersioned), written out for the tests: graphward reads and writes them by field
// name (Note [DLPack], engine/runtime/dlpack.h), so a test makes its capsules by hand with these.
#include <cstdint>

namespace graphward::testing::dl {

enum DeviceType : std::int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,
  kOpenCL = 4,
  kROCM = 10,
  kCUDAManaged = 13,
};
struct Device {
  DeviceType device_type;
  std::int32_t device_id;
};
struct DataType {
  std::uint8_t code;  // 0 int, 1 uint, 2 float, 3 opaque handle, 4 bfloat, 5 complex, 6 bool
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
struct PackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
struct ManagedTensorVersioned {
  PackVersion version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  std::uint64_t flags;  // bit 0: read-only; bit 1: a copy
  Tensor dl_tensor;
};

}  // namespace graphward::testing::dl
