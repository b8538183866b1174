// The fused LSTM layer (engine/ops/rnn.h): a whole sequence as one op, its steps written once for
// both devices (LayerSteps: cuBLAS and kernels/rnn.h on CUDA, the reference GEMM and kernels on the
// CPU).
#include <type_traits>

#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/ops/rnn.h"
#include "graphward/engine/ops/rnn_detail.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/gemm.h"
#include "graphward/kernels/reduce.h"
#include "graphward/kernels/rnn.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {

// The layer's building blocks on one device: on CUDA (T = float) on `stream`, else on the CPU.
template <class T>
struct LayerSteps {
  bool cuda;
  Device device;
  cudaStream_t stream;

  // C [m, n] (=|+=) op(A) · op(B), row-major as kernels/gemm.h.
  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t kk, const T* a,
            const T* b, bool accumulate, T* c) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        graphward::gemm(device, stream, ta, tb, m, n, kk, 1.f, a, b, accumulate ? 1.f : 0.f, c);
        return;
      }
    }
#endif
    k::cpu::gemm<T>(ta, tb, m, n, kk, T(1), a, b, accumulate ? T(1) : T(0), c);
  }
  void cell_forward(T* gates, T* h_out, T* c_out, const T* c, const T* b_ih, const T* b_hh,
                    std::int64_t batch, std::int64_t hidden) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        k::lstm_cell_forward(gates, h_out, c_out, c, b_ih, b_hh, batch, hidden, stream);
        return;
      }
    }
#endif
    k::cpu::lstm_cell_forward<T>(gates, h_out, c_out, c, b_ih, b_hh, batch, hidden);
  }
  void cell_backward(T* dgates, T* dc, const T* dh, const T* dh_more, const T* dc_in,
                     const T* dc_more, const T* act, const T* c, const T* c_new, std::int64_t batch,
                     std::int64_t hidden, bool accumulate) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        k::lstm_cell_backward(dgates, dc, dh, dh_more, dc_in, dc_more, act, c, c_new, batch, hidden,
                              accumulate, stream);
        return;
      }
    }
#endif
    k::cpu::lstm_cell_backward<T>(dgates, dc, dh, dh_more, dc_in, dc_more, act, c, c_new, batch,
                                  hidden, accumulate);
  }
  void column_sum(T* dst, const T* src, std::int64_t rows, std::int64_t cols,
                  bool accumulate) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        k::column_sum<float>(dst, src, nullptr, 1.f, rows, cols, accumulate, stream);
        return;
      }
    }
#endif
    k::cpu::column_sum<T>(dst, src, nullptr, T(1), rows, cols, accumulate);
  }
  void zero(T* dst, std::int64_t n) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        k::fill(dst, 0.f, n, stream);
        return;
      }
    }
#endif
    for (std::int64_t i = 0; i < n; ++i) dst[i] = T(0);
  }
};

// The operands as pointers: x's rows (its h's where it is a layer's output), the state [2, B, H],
// the weights and biases (null: none), the activations [T·B, 4H] and the output [2, T·B, H].
template <class T>
struct LayerData {
  const T *x, *state, *w_ih, *w_hh, *b_ih, *b_hh;
  T* act;
  T* out;
};

// P = X·W_ihᵀ for every step at once (into `act`), then per step t: P_t += h_{t−1}·W_hhᵀ and the
// cell's kernel (h_t, c_t into the output; P_t becomes the activations).
template <class T>
void layer_forward(const LayerSteps<T>& s, const LstmDims& d, const LayerData<T>& p) {
  const std::int64_t B = d.batch, H = d.hidden, G = 4 * d.hidden, BH = B * H;
  const std::int64_t n = d.steps * BH;  // the output's c half starts here
  s.gemm(false, true, d.steps * B, G, d.in, p.x, p.w_ih, false, p.act);
  for (std::int64_t t = 0; t < d.steps; ++t) {
    const T* h_prev = t > 0 ? p.out + (t - 1) * BH : p.state;
    const T* c_prev = t > 0 ? p.out + n + (t - 1) * BH : p.state + BH;
    T* gates = p.act + t * B * G;
    s.gemm(false, true, B, G, H, h_prev, p.w_hh, true, gates);
    s.cell_forward(gates, p.out + t * BH, p.out + n + t * BH, c_prev, p.b_ih, p.b_hh, B, H);
  }
}

// A gradient slot's pointer (null: not wanted) and whether it accumulates.
template <class T>
struct Grad {
  T* ptr = nullptr;
  bool accumulate = false;
};

// Per step t, last to first: the cell's gradient (what reaches h_t and c_t from the layer's
// consumers plus, from step t + 1, dh_rec = dgates_{t+1}·W_hh and dc_rec) into dgates_t; then
// dh_rec = dgates_t·W_hh — at t = 0 into the state's gradient, with dc_rec's. Then every step's
// dX, dW_ih, dW_hh and the biases' in one GEMM (column sum) each.
template <class T>
void layer_backward(const LayerSteps<T>& s, const LstmDims& d, const LayerData<T>& p, const T* grad,
                    T* dgates, T* dh_rec, T* dc_rec, Grad<T> dx, Grad<T> dstate, Grad<T> dw_ih,
                    Grad<T> dw_hh, Grad<T> db_ih, Grad<T> db_hh) {
  const std::int64_t B = d.batch, H = d.hidden, G = 4 * d.hidden, BH = B * H, TB = d.steps * B;
  const std::int64_t n = d.steps * BH;
  for (std::int64_t t = d.steps - 1; t >= 0; --t) {
    const bool last = t == d.steps - 1;
    const T* c_prev = t > 0 ? p.out + n + (t - 1) * BH : p.state + BH;
    T* dg = dgates + t * B * G;
    T* dc_out = t > 0 ? dc_rec : (dstate.ptr ? dstate.ptr + BH : nullptr);
    s.cell_backward(dg, dc_out, grad + t * BH, last ? nullptr : dh_rec, grad + n + t * BH,
                    last ? nullptr : dc_rec, p.act + t * B * G, c_prev, p.out + n + t * BH, B, H,
                    t == 0 && dstate.accumulate);
    if (t > 0) {
      s.gemm(false, false, B, H, G, dg, p.w_hh, false, dh_rec);
    } else if (dstate.ptr) {
      s.gemm(false, false, B, H, G, dg, p.w_hh, dstate.accumulate, dstate.ptr);
    }
  }
  if (dx.ptr) {
    s.gemm(false, false, TB, d.in, G, dgates, p.w_ih, dx.accumulate, dx.ptr);
    if (d.packed_x && !dx.accumulate) s.zero(dx.ptr + TB * d.in, TB * d.in);  // the c's: none
  }
  if (dw_ih.ptr) s.gemm(true, false, G, d.in, TB, dgates, p.x, dw_ih.accumulate, dw_ih.ptr);
  if (dw_hh.ptr) {  // Σ_t dgates_tᵀ · h_{t−1}: steps 1.. against the output's h's, step 0 the
                    // state's
    if (d.steps > 1) {
      s.gemm(true, false, G, H, TB - B, dgates + B * G, p.out, dw_hh.accumulate, dw_hh.ptr);
    }
    s.gemm(true, false, G, H, B, dgates, p.state, d.steps > 1 || dw_hh.accumulate, dw_hh.ptr);
  }
  if (db_ih.ptr) s.column_sum(db_ih.ptr, dgates, TB, G, db_ih.accumulate);
  if (db_hh.ptr) s.column_sum(db_hh.ptr, dgates, TB, G, db_hh.accumulate);
}

template <class T>
LayerData<T> layer_data(const LstmDims& d, const Tensor& x, const Tensor& state, const Tensor& w_ih,
                        const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh,
                        const Tensor& act, const Tensor& out) {
  return {ptr<T>(x),
          ptr<T>(state),
          ptr<T>(w_ih),
          ptr<T>(w_hh),
          d.bias ? ptr<T>(b_ih) : nullptr,
          d.bias ? ptr<T>(b_hh) : nullptr,
          ptr<T>(act),
          ptr<T>(out)};
}

}  // namespace

Tensor fused_lstm_layer(const Tensor& xs, const Tensor& state, const Tensor& w_ih,
                        const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  const char* op = "fused_lstm_layer";
  detail::NvtxRange range(op);
  const LstmDims d = check_lstm(op, xs, state, w_ih, w_hh, b_ih, b_hh, /*layer=*/true);
  const bool grad = d.bias ? needs_grad({&xs, &state, &w_ih, &w_hh, &b_ih, &b_hh})
                           : needs_grad({&xs, &state, &w_ih, &w_hh});
  const std::int64_t TB = d.steps * d.batch;
  Tensor act, out;
  if (xs.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(xs.device());
    if (d.bias) {
      scope.read({&xs, &state, &w_ih, &w_hh, &b_ih, &b_hh});
    } else {
      scope.read({&xs, &state, &w_ih, &w_hh});
    }
    act = new_output({TB, 4 * d.hidden}, xs);
    out = new_output({2, TB, d.hidden}, xs);
    layer_forward<float>({true, xs.device(), scope.stream()}, d,
                         layer_data<float>(d, xs, state, w_ih, w_hh, b_ih, b_hh, act, out));
#endif
  } else {
    act = new_output({TB, 4 * d.hidden}, xs);
    out = new_output({2, TB, d.hidden}, xs);
    dispatch_cpu(xs.dtype(), [&]<class T>() {
      layer_forward<T>({false, xs.device(), nullptr}, d,
                       layer_data<T>(d, xs, state, w_ih, w_hh, b_ih, b_hh, act, out));
    });
  }
  if (grad) {
    std::vector<SavedTensor> saved{save("x", xs),      save("state", state), save("w_ih", w_ih),
                                   save("w_hh", w_hh), save("gates", act),   save("output", out)};
    auto backward = [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
      fused_lstm_layer_backward(g, s[0], s[1], s[2], s[3], s[4], s[5], grads);
    };
    if (d.bias) {
      record(op, out, {&xs, &state, &w_ih, &w_hh, &b_ih, &b_hh}, std::move(saved), backward);
    } else {
      record(op, out, {&xs, &state, &w_ih, &w_hh}, std::move(saved), backward);
    }
    // Four GEMMs' worth back: the input's, the recurrent gradient's and the two weights'.
    out.grad_fn()->set_backward_flops(4.0 * static_cast<double>(TB) *
                                      static_cast<double>(d.in + d.hidden) *
                                      static_cast<double>(4 * d.hidden));
  }
  return out;
}

void fused_lstm_layer_backward(const Tensor& grad_out, const Tensor& xs, const Tensor& state,
                               const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                               const Tensor& out, std::span<GradSlot> grads) {
  const char* op = "fused_lstm_layer_backward";
  // Every check before anything is allocated or written (Note [Check, then write]).
  const LstmDims d = check_lstm(op, xs, state, w_ih, w_hh, Tensor(), Tensor(), /*layer=*/true);
  const std::int64_t B = d.batch, H = d.hidden, TB = d.steps * d.batch;
  check_inputs(op, {{"x", &xs}, {"grad_out", &grad_out}, {"gates", &act}, {"output", &out}});
  GW_CHECK(grad_out.shape() == Shape({2, TB, H}) && out.shape() == Shape({2, TB, H}) &&
               act.shape() == Shape({TB, 4 * H}),
           op, ": grad_out is ", shape_str(grad_out.shape()), ", the output ",
           shape_str(out.shape()), ", the gates ", shape_str(act.shape()), "; expected [2, ", TB,
           ", ", H, "] twice and [", TB, ", ", 4 * H, "]");
  const std::array<bool, 6> want = check_lstm_slots(op, grads, xs, state, w_ih, w_hh);
  bool any = false;
  for (bool w : want) any = any || w;
  if (!any) return;
  const std::array<const Tensor*, 4> operands{&xs, &state, &w_ih, &w_hh};
  // Opens the wanted slots on `stream` (nullptr: the CPU) and runs the backward.
  auto run = [&]<class T>(const LayerSteps<T>& s) {
    const Tensor dgates = new_output({TB, 4 * H}, xs);
    const Tensor dh_rec = new_output({B, H}, xs), dc_rec = new_output({B, H}, xs);
    std::array<Grad<T>, 6> g{};
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!want[i]) continue;
      g[i].accumulate = i < 4 ? open_slot(grads[i], *operands[i], s.stream)
                              : open_slot(grads[i], {4 * H}, xs, s.stream);
      g[i].ptr = slot_ptr<T>(grads[i]);
    }
    layer_backward<T>(s, d, layer_data<T>(d, xs, state, w_ih, w_hh, Tensor(), Tensor(), act, out),
                      ptr<T>(grad_out), ptr<T>(dgates), ptr<T>(dh_rec), ptr<T>(dc_rec), g[0], g[1],
                      g[2], g[3], g[4], g[5]);
  };
  if (xs.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(xs.device());
    scope.read({&grad_out, &xs, &state, &w_ih, &w_hh, &act, &out});
    run(LayerSteps<float>{true, xs.device(), scope.stream()});
    return;
#endif
  }
  dispatch_cpu(xs.dtype(), [&]<class T>() { run(LayerSteps<T>{false, xs.device(), nullptr}); });
}

}  // namespace graphward
