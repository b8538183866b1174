#pragma once
// Data movement for the shape ops (engine/ops/ops_shape.cpp): windows of a matrix's columns (narrow,
// concat) and a swap of two dimensions (transpose). Contract of elementwise.h: outputs first, never
// allocate, never synchronize; `accumulate` adds (+=) instead of writing (=).
#include <cstddef>
#include <cstdint>
#include "graphward/base/config.h"
#include "graphward/base/dtype.h"

#if GRAPHWARD_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace graphward::kernels {

// A tensor's shape with two of its dimensions to swap, as a kernel argument.
inline constexpr int kMaxDims = 8;
struct SwapDims {
  int rank = 0;
  std::int64_t in_shape[kMaxDims] = {};
  int d0 = 0, d1 = 0;
};

// Attention's heads (split_heads, engine/ops/ops.h): x seen as [batch · seq, cols] and the window of its
// columns [start, start + heads · dim); y [batch · heads, seq, dim], head h of sequence b at batch
// entry b · heads + h.
struct HeadsWindow {
  std::int64_t batch = 0, seq = 0, heads = 0, dim = 0, cols = 0, start = 0;
};

// Up to N byte ranges to copy in one launch, as a kernel argument. Every pointer 4-byte aligned;
// a range whose two ends are both 16-byte aligned is copied 16 bytes a thread.
template <int N>
struct SegmentList {
  static constexpr int kCapacity = N;
  int count = 0;
  const void* src[N] = {};
  void* dst[N] = {};
  std::int64_t bytes[N] = {};
};
// dist/'s gradient buckets: many small gradients into one contiguous buffer and back.
inline constexpr int kMaxSegments = 64;
using Segments = SegmentList<kMaxSegments>;
// A captured graph's input slots refreshed before its launch (capture::SlotRefresh): a few
// tensors, in a kernel argument of 200 bytes rather than Segments' 1.5 KiB.
using FewSegments = SegmentList<8>;

#if GRAPHWARD_HAS_CUDA
// dst[k][0, bytes[k]) = src[k][0, bytes[k]) for every segment k, in one kernel.
void copy_segments(const Segments& segments, cudaStream_t stream);
void copy_segments(const FewSegments& segments, cudaStream_t stream);
// Byte ranges copied N to a launch (copy_segments): add() them, then flush(); what was added and
// not flushed is not copied.
template <int N>
class SegmentCopier {
 public:
  explicit SegmentCopier(cudaStream_t stream) : stream_(stream) {}
  void add(const void* src, void* dst, std::size_t bytes) {
    segments_.src[segments_.count] = src;
    segments_.dst[segments_.count] = dst;
    segments_.bytes[segments_.count] = static_cast<std::int64_t>(bytes);
    if (++segments_.count == N) flush();
  }
  void flush() {
    if (segments_.count == 0) return;
    copy_segments(segments_, stream_);
    segments_.count = 0;
  }

 private:
  cudaStream_t stream_;
  SegmentList<N> segments_;
};
// y[r, j] (=|+=) x[r, start + j]: columns [start, start + len) of x [rows, cols] into y [rows,
// len].
template <class S>  // S: float or bf16 (storage), here and below
void gather_window(S* y, const S* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                   std::int64_t len, bool accumulate, cudaStream_t stream);
// y[r, start + j] (=|+=) x[r, j]: x [rows, len] into the window of y [rows, cols]; the columns
// outside the window are not touched.
template <class S>
void scatter_window(S* y, const S* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                    std::int64_t len, bool accumulate, cudaStream_t stream);
// y (=|+=) x with dimensions d0 and d1 swapped (y's shape: in_shape with the two exchanged).
template <class S>
void swap_dims(S* y, const S* x, const SwapDims& dims, bool accumulate, cudaStream_t stream);
// y[((b · heads + h) · seq + t) · dim + j] = x[(b · seq + t) · cols + start + h · dim + j].
template <class S>
void split_heads(S* y, const S* x, const HeadsWindow& w, cudaStream_t stream);
// Its backward: the window of dx (=|+=) dy put back in place; without accumulate, the columns of dx
// outside the window are written zeros (one kernel over all of dx).
template <class S>
void split_heads_backward(S* dx, const S* dy, const HeadsWindow& w, bool accumulate,
                          cudaStream_t stream);
#endif

namespace cpu {
template <class T>
void gather_window(T* y, const T* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                   std::int64_t len, bool accumulate);
template <class T>
void scatter_window(T* y, const T* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                    std::int64_t len, bool accumulate);
template <class T>
void swap_dims(T* y, const T* x, const SwapDims& dims, bool accumulate);
template <class T>
void split_heads(T* y, const T* x, const HeadsWindow& w);
template <class T>
void split_heads_backward(T* dx, const T* dy, const HeadsWindow& w, bool accumulate);
}  // namespace cpu

}  // namespace graphward::kernels
