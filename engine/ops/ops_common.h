#pragma once
// Shared machinery of the ops (internal to ops/): argument checks that name the op, the
// launch context of a CUDA op, and gradient slots. Every op checks everything first, then
// allocates, then launches (Note [Check, then write]).
//
// Note [Check, then write]
// A failing op must leave no trace: all validation (shapes, dtypes, devices, emptiness, gradient
// slots) runs before the first allocation or write, so an exception never leaves a half-written
// output or a gradient with some contributions added.
#include <cstdint>
#include <initializer_list>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "graphward/engine/ops/ops.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/kernels/elementwise.h"

namespace graphward::ops_detail {

struct Named {
  const char* name;
  const Tensor* tensor;
};

// Where an op takes bfloat16: nowhere, on CUDA only, or on CUDA and the CPU backend (Note
// [bfloat16 on the CPU]).
enum class Bf16 : std::uint8_t { kNo, kCuda, kEverywhere };
// Each tensor is defined and non-empty; all share the first one's device and dtype; CUDA tensors
// are float32 — or, where the op says so (`bf16`), bfloat16.
void check_inputs(const char* op, std::initializer_list<Named> inputs, Bf16 bf16 = Bf16::kNo);
void check_same_shape(const char* op, Named a, Named b);
void check_dim(const char* op, Named t, std::int64_t dim);
// `t`'s shape is the trailing part of `of`'s (of rank 1 up to of's), as [T, D] is of [B, T, D].
bool is_trailing_shape(const Tensor& t, const Tensor& of);
// Every int32 value of `indices` (ids, targets) in [0, bound), checked on the CPU backend — in an
// op's forward and in its op-level backward alike — and refused by name ("id 3 is 7; expected a
// row of the table in [0, 5)"). CUDA indices are not read back (each op says what happens there).
void check_index_values(const char* op, const char* what, const Tensor& indices, std::int64_t bound,
                        const char* expected);
// `scalar` is finite, also in the type `like` computes in (float32 unless `like` is float64).
void check_finite_scalar(const char* op, double scalar, const Tensor& like);

// Where a CUDA op runs: the device made current for the scope and its current stream.
class CudaScope {
 public:
  CudaScope(Device device);
  cudaStream_t stream() const { return stream_; }
  // Waits for the inputs' producers (rule [read after write]). Inside a capture, then checks that
  // the stream is part of it (Note [Streams inside a capture], engine/runtime/capture_mode.h).
  void read(std::initializer_list<const Tensor*> inputs) const;
  void read(std::span<const Tensor* const> inputs) const;

 private:
  DeviceGuard guard_;
  cudaStream_t stream_ = nullptr;
};

// A new output on the device of `like` (on CUDA: allocated on `stream`, which produces it).
Tensor new_output(const Shape& shape, const Tensor& like);
// The dtype of the statistics an op keeps for data of `dtype` (a layer norm's mean and rstd, a
// loss, its log-sum-exp): float32 for bfloat16 (they keep float32 math and storage), else dtype.
inline DType statistics_dtype(DType dtype) {
  return dtype == DType::kBFloat16 ? DType::kFloat32 : dtype;
}

// Validates a gradient slot for a gradient of `shape` with the dtype and device of `like`
// (Note [Check, then write]). Returns whether the gradient is wanted.
bool check_slot(const char* op, const char* name, const GradSlot& slot, const Shape& shape,
                const Tensor& like);
bool check_slot(const char* op, const char* name, const GradSlot& slot, const Shape& shape,
                TensorOptions expected);
inline bool check_slot(const char* op, const char* name, const GradSlot& slot,
                       const Tensor& input) {
  return check_slot(op, name, slot, input.shape(), input);
}
// Makes the slot's tensor ready to write on `stream` (nullptr on the CPU): allocates it if needed.
// Returns whether the write accumulates.
bool open_slot(const GradSlot& slot, const Shape& shape, const Tensor& like, cudaStream_t stream);
bool open_slot(const GradSlot& slot, const Shape& shape, TensorOptions options,
               cudaStream_t stream);
inline bool open_slot(const GradSlot& slot, const Tensor& input, cudaStream_t stream) {
  return open_slot(slot, input.shape(), input, stream);
}

// Runs f.template operator()<T>() with T = float or double per `dtype` (the CPU backend). Any
// other dtype is refused: a kernel must never write one type's elements into another's buffer.
// A CPU kernel's own scratch (an accumulator in double) that the system cannot give is an
// OutOfMemoryError, like every host allocation (Note [Host memory], engine/runtime/allocation.cpp); the
// kernels take it before they write.
template <class F>
void dispatch_cpu(DType dtype, F&& f) {
  GW_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat64, "no CPU kernel computes in ",
           dtype_name(dtype), "; expected a float32 or float64 tensor");
  try {
    if (dtype == DType::kFloat64) {
      std::forward<F>(f).template operator()<double>();
    } else {
      std::forward<F>(f).template operator()<float>();
    }
  } catch (const std::bad_alloc& e) {
    throw OutOfMemoryError(
        std::string("graphward: out of host memory for a CPU kernel's scratch (") + e.what() +
        "). Expected: less memory in use, or a smaller batch");
  }
}

// Note [bfloat16 on the CPU]
// The CPU backend computes a bfloat16 op as its CUDA kernel does: bfloat16 loads, float32
// arithmetic, each output element rounded to nearest even once, when stored (an accumulating
// store rounds the float32 sum of the old value and the new). It runs the op's float32 CPU kernel
// on float32 copies of the bfloat16 tensors (inputs widened exactly; an output widened too where
// it is read: a gradient accumulated into) and rounds the outputs back when the kernel is done.
// Saved tensors are those of the CUDA op (bfloat16 where its are), so a backward reads the
// rounded values as the CUDA one does. The copies cost memory and time the CPU backend can afford:
// it is the reference, not the fast path.
template <class T>
class CpuData {
 public:
  explicit CpuData(bool widen) : widen_(widen) {}
  CpuData(const CpuData&) = delete;
  CpuData& operator=(const CpuData&) = delete;
  // An input's elements as T.
  const T* in(const Tensor& t) { return view(t, true, false); }
  // An output's (written, never read: its old values are not widened).
  T* out(const Tensor& t) { return view(t, false, true); }
  // An output read before it is written (accumulated into).
  T* inout(const Tensor& t) { return view(t, true, true); }
  // Rounds the widened outputs back into their bfloat16 tensors (run once the kernel is done).
  void commit();

 private:
  T* view(const Tensor& t, bool read, bool output);
  struct Widened {
    Tensor target, copy;
    bool output;
  };
  bool widen_;
  std::vector<Widened> widened_;
};

// An opened gradient slot's elements through `data`: read too where the write accumulates.
template <class T>
T* slot_out(CpuData<T>& data, const GradSlot& slot, bool accumulate) {
  return accumulate ? data.inout(*slot.tensor) : data.out(*slot.tensor);
}

// Runs f.template operator()<T>(CpuData<T>& data) on the CPU backend: T = float or double per
// `dtype`, and for bfloat16, T = float on widened copies rounded back after f (Note [bfloat16 on
// the CPU]). The kernel reads and writes every tensor through `data` (in, out, inout).
template <class F>
void dispatch_cpu_data(DType dtype, F&& f) {
  const bool widen = dtype == DType::kBFloat16;
  dispatch_cpu(widen ? DType::kFloat32 : dtype, [&]<class T>() {
    CpuData<T> data(widen);
    std::forward<F>(f).template operator()<T>(data);
    data.commit();
  });
}

// Runs f.template operator()<T>() with T = float or bf16 per `dtype` (a CUDA op's storage type;
// the kernels compute in float32 either way).
template <class F>
void dispatch_cuda(DType dtype, F&& f) {
  if (dtype == DType::kBFloat16) {
    std::forward<F>(f).template operator()<bf16>();
  } else {
    std::forward<F>(f).template operator()<float>();
  }
}

// Records y = a (kind) b (computed already, by the caller) as the op `op` would: add and sub save
// nothing, mul saves both operands; add of equal shapes passes its gradient through.
void record_binary(const char* op, kernels::BinaryOp kind, const Tensor& a, const Tensor& b,
                   const Tensor& y);

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}
template <class T>
T* slot_ptr(const GradSlot& slot) {
  return slot.tensor ? static_cast<T*>(slot.tensor->raw_data()) : nullptr;
}

}  // namespace graphward::ops_detail
