// CPU references of convolution and pooling (conv.h): direct loops, accumulating in double.
#include <cmath>
#include <limits>
#include <vector>

#include "graphward/kernels/conv.h"

namespace graphward::kernels::cpu {
namespace {
// Calls f(n, k, oh, ow, c, ih, iw, r, s) for every product term of the convolution whose input
// element lies inside the (unpadded) image.
template <class F>
void for_each_term(const ConvGeom& g, F&& f) {
  const std::int64_t oh_n = g.out_h(), ow_n = g.out_w();
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t k = 0; k < g.k; ++k)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow)
          for (std::int64_t c = 0; c < g.c; ++c)
            for (std::int64_t r = 0; r < g.r; ++r) {
              const std::int64_t ih = oh * g.stride - g.pad + r;
              if (ih < 0 || ih >= g.h) continue;
              for (std::int64_t s = 0; s < g.s; ++s) {
                const std::int64_t iw = ow * g.stride - g.pad + s;
                if (iw < 0 || iw >= g.w) continue;
                f(n, k, oh, ow, c, ih, iw, r, s);
              }
            }
}
// Where an element lies, in either layout (g.nhwc: channels last).
std::int64_t x_at(const ConvGeom& g, std::int64_t n, std::int64_t c, std::int64_t ih,
                  std::int64_t iw) {
  return g.nhwc ? ((n * g.h + ih) * g.w + iw) * g.c + c : ((n * g.c + c) * g.h + ih) * g.w + iw;
}
std::int64_t w_at(const ConvGeom& g, std::int64_t k, std::int64_t c, std::int64_t r,
                  std::int64_t s) {
  return g.nhwc ? ((k * g.r + r) * g.s + s) * g.c + c : ((k * g.c + c) * g.r + r) * g.s + s;
}
std::int64_t y_at(const ConvGeom& g, std::int64_t n, std::int64_t k, std::int64_t oh,
                  std::int64_t ow) {
  return g.nhwc ? ((n * g.out_h() + oh) * g.out_w() + ow) * g.k + k
                : ((n * g.k + k) * g.out_h() + oh) * g.out_w() + ow;
}
// The output channel of y's element i.
std::int64_t y_channel(const ConvGeom& g, std::int64_t i) {
  return g.nhwc ? i % g.k : (i / (g.out_h() * g.out_w())) % g.k;
}
template <class T>
void store_all(T* dst, const std::vector<double>& acc, bool accumulate) {
  for (std::size_t i = 0; i < acc.size(); ++i) {
    dst[i] = static_cast<T>(accumulate ? static_cast<double>(dst[i]) + acc[i] : acc[i]);
  }
}
}  // namespace

template <class T>
void conv2d_forward(T* y, const T* x, const T* w, const T* bias, const ConvGeom& g) {
  std::vector<double> acc(static_cast<std::size_t>(g.n * g.k * g.out_h() * g.out_w()), 0.0);
  for_each_term(g, [&](auto n, auto k, auto oh, auto ow, auto c, auto ih, auto iw, auto r, auto s) {
    acc[y_at(g, n, k, oh, ow)] += double(x[x_at(g, n, c, ih, iw)]) * double(w[w_at(g, k, c, r, s)]);
  });
  if (bias) {
    for (std::size_t i = 0; i < acc.size(); ++i) {
      acc[i] += double(bias[y_channel(g, static_cast<std::int64_t>(i))]);
    }
  }
  store_all(y, acc, false);
}

template <class T>
void conv2d_backward_data(T* dx, const T* dy, const T* w, const ConvGeom& g, bool accumulate) {
  std::vector<double> acc(static_cast<std::size_t>(g.n * g.c * g.h * g.w), 0.0);
  for_each_term(g, [&](auto n, auto k, auto oh, auto ow, auto c, auto ih, auto iw, auto r, auto s) {
    acc[x_at(g, n, c, ih, iw)] += double(dy[y_at(g, n, k, oh, ow)]) * double(w[w_at(g, k, c, r, s)]);
  });
  store_all(dx, acc, accumulate);
}

template <class T>
void conv2d_backward_filter(T* dw, const T* dy, const T* x, const ConvGeom& g, bool accumulate) {
  std::vector<double> acc(static_cast<std::size_t>(g.k * g.c * g.r * g.s), 0.0);
  for_each_term(g, [&](auto n, auto k, auto oh, auto ow, auto c, auto ih, auto iw, auto r, auto s) {
    acc[w_at(g, k, c, r, s)] += double(dy[y_at(g, n, k, oh, ow)]) * double(x[x_at(g, n, c, ih, iw)]);
  });
  store_all(dw, acc, accumulate);
}

template <class T>
void conv2d_backward_bias(T* db, const T* dy, const ConvGeom& g, bool accumulate) {
  std::vector<double> acc(static_cast<std::size_t>(g.k), 0.0);
  const std::int64_t count = g.n * g.k * g.out_h() * g.out_w();
  for (std::int64_t i = 0; i < count; ++i) acc[y_channel(g, i)] += double(dy[i]);
  store_all(db, acc, accumulate);
}

namespace {
// Calls f(out_index, in_index) for every in-image element of every output's window, plane by
// plane (n, c), in row-major window order; the indices in either layout (g.nhwc).
template <class F>
void for_each_window(const PoolGeom& g, F&& f) {
  const std::int64_t oh_n = g.out_h(), ow_n = g.out_w();
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t h_n,
                std::int64_t w_n) {
    return g.nhwc ? ((n * h_n + h) * w_n + w) * g.c + c : ((n * g.c + c) * h_n + h) * w_n + w;
  };
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t c = 0; c < g.c; ++c)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const std::int64_t o = at(n, c, oh, ow, oh_n, ow_n);
          for (std::int64_t r = 0; r < g.window; ++r) {
            const std::int64_t ih = oh * g.stride - g.pad + r;
            if (ih < 0 || ih >= g.h) continue;
            for (std::int64_t s = 0; s < g.window; ++s) {
              const std::int64_t iw = ow * g.stride - g.pad + s;
              if (iw < 0 || iw >= g.w) continue;
              f(o, at(n, c, ih, iw, g.h, g.w));
            }
          }
        }
}
}  // namespace

template <class T>
void pool2d_forward(PoolMode mode, T* y, const T* x, const PoolGeom& g) {
  const std::size_t outs = static_cast<std::size_t>(g.n * g.c * g.out_h() * g.out_w());
  std::vector<double> acc(outs, mode == PoolMode::kMax ? -std::numeric_limits<double>::infinity()
                                                       : 0.0);
  // A NaN in a window makes its maximum NaN (as cuDNN's CUDNN_PROPAGATE_NAN and PyTorch give;
  // std::max dropped it).
  for_each_window(g, [&](std::int64_t o, std::int64_t i) {
    const double v = double(x[i]);
    if (mode == PoolMode::kAverage) {
      acc[o] += v;
    } else if (!std::isnan(acc[o]) && (std::isnan(v) || v > acc[o])) {
      acc[o] = v;
    }
  });
  const double area = static_cast<double>(g.window * g.window);
  for (std::size_t o = 0; o < outs; ++o) {
    y[o] = static_cast<T>(mode == PoolMode::kMax ? acc[o] : acc[o] / area);
  }
}

template <class T>
void pool2d_backward(PoolMode mode, T* dx, const T* dy, const T* x, const T* y, const PoolGeom& g,
                     bool accumulate, const T* relu_input) {
  std::vector<double> acc(static_cast<std::size_t>(g.n * g.c * g.h * g.w), 0.0);
  const double area = static_cast<double>(g.window * g.window);
  std::vector<bool> taken(static_cast<std::size_t>(g.n * g.c * g.out_h() * g.out_w()), false);
  for_each_window(g, [&](std::int64_t o, std::int64_t i) {
    if (mode == PoolMode::kAverage) {
      acc[i] += double(dy[o]) / area;
    } else if (!taken[o] && (x[i] == y[o] || (std::isnan(y[o]) && std::isnan(x[i])))) {
      // The window's first maximum takes the gradient; of a NaN maximum, its first NaN.
      acc[i] += double(dy[o]);
      taken[o] = true;
    }
  });
  if (relu_input) {
    for (std::size_t i = 0; i < acc.size(); ++i) {
      if (!(relu_input[i] > T(0))) acc[i] = 0.0;
    }
  }
  store_all(dx, acc, accumulate);
}

#define GW_INSTANTIATE(T)                                                                       \
  template void conv2d_forward<T>(T*, const T*, const T*, const T*, const ConvGeom&);           \
  template void conv2d_backward_data<T>(T*, const T*, const T*, const ConvGeom&, bool);         \
  template void conv2d_backward_filter<T>(T*, const T*, const T*, const ConvGeom&, bool);       \
  template void conv2d_backward_bias<T>(T*, const T*, const ConvGeom&, bool);                   \
  template void pool2d_forward<T>(PoolMode, T*, const T*, const PoolGeom&);                     \
  template void pool2d_backward<T>(PoolMode, T*, const T*, const T*, const T*, const PoolGeom&, \
                                   bool, const T*);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
