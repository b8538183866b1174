// CPU references of the shape kernels (shape.h).
#include "graphward/kernels/shape.h"
#include "graphward/kernels/swap_dims.h"

namespace graphward::kernels::cpu {
namespace {
template <class T>
void put(T* y, std::int64_t i, T v, bool accumulate) {
  y[i] = accumulate ? y[i] + v : v;
}
}  // namespace

template <class T>
void gather_window(T* y, const T* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                   std::int64_t len, bool accumulate) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < len; ++j) put(y, r * len + j, x[r * cols + start + j], accumulate);
  }
}

template <class T>
void scatter_window(T* y, const T* x, std::int64_t rows, std::int64_t cols, std::int64_t start,
                    std::int64_t len, bool accumulate) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < len; ++j) put(y, r * cols + start + j, x[r * len + j], accumulate);
  }
}

template <class T>
void swap_dims(T* y, const T* x, const SwapDims& dims, bool accumulate) {
  std::int64_t n = 1;
  for (int k = 0; k < dims.rank; ++k) n *= dims.in_shape[k];
  const detail::Swap5 s = detail::collapse(dims);
  for (std::int64_t i = 0; i < n; ++i) {
    put(y, i, x[s.c == 0 ? i : detail::swapped_source<std::int64_t>(s, i)], accumulate);
  }
}

template <class T>
void split_heads(T* y, const T* x, const HeadsWindow& w) {
  const std::int64_t n = w.batch * w.heads * w.seq * w.dim;
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[detail::heads_source<std::int64_t>(w, i)];
}

template <class T>
void split_heads_backward(T* dx, const T* dy, const HeadsWindow& w, bool accumulate) {
  const std::int64_t rows = w.batch * w.seq, len = w.heads * w.dim;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < w.cols; ++c) {
      const bool inside = c >= w.start && c - w.start < len;
      if (inside) {
        put(dx, r * w.cols + c, dy[detail::heads_target<std::int64_t>(w, r, c - w.start)],
            accumulate);
      } else if (!accumulate) {
        dx[r * w.cols + c] = T(0);
      }
    }
  }
}

#define GW_INSTANTIATE(T)                                                                 \
  template void gather_window<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t,  \
                                 std::int64_t, bool);                                     \
  template void scatter_window<T>(T*, const T*, std::int64_t, std::int64_t, std::int64_t, \
                                  std::int64_t, bool);                                    \
  template void swap_dims<T>(T*, const T*, const SwapDims&, bool);                        \
  template void split_heads<T>(T*, const T*, const HeadsWindow&);                         \
  template void split_heads_backward<T>(T*, const T*, const HeadsWindow&, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
