// The fused recurrent ops (engine/ops/rnn.h): the LSTM cell and layer, the GRU cell. Each written
// once for both devices over Steps (cuBLAS and kernels/rnn.h on CUDA, the reference GEMM and
// kernels on the CPU); a cell is a layer of one step.
#include <algorithm>
#include <array>
#include <type_traits>

#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/ops/rnn.h"
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

Tensor lstm_state(const Tensor& h, const Tensor& c) {
  GW_CHECK(h.defined() && c.defined() && h.dim() == 2 && c.shape() == h.shape(),
           "lstm_state: h is ", h.defined() ? h.str() : "undefined", ", c ",
           c.defined() ? c.str() : "undefined", "; expected h and c of one shape [B, H]");
  const Shape one{1, h.size(0), h.size(1)};
  return concat({reshape(h, one), reshape(c, one)}, 0);
}

Tensor lstm_hidden(const Tensor& state) {
  GW_CHECK(state.defined() && state.dim() == 3 && state.size(0) == 2, "lstm_hidden: the state is ",
           state.defined() ? state.str() : "undefined", "; expected a fused LSTM state [2, B, H]");
  const std::int64_t rows = state.size(1), hidden = state.size(2);
  return reshape(narrow(reshape(state, {1, 2 * rows * hidden}), 0, rows * hidden), {rows, hidden});
}

namespace {

struct LstmDims {
  std::int64_t batch, in, hidden;
  bool packed_x;  // x is a state [2, B, in] (a layer's output [2, T·B, in]): its h is read
  bool bias;
  std::int64_t steps = 1;  // T: the time steps of a layer
};

// A cell's operands, or with `layer` a layer's (x of T·B rows), each refused by name (Note
// [Check, then write]).
LstmDims check_lstm(const char* op, const Tensor& x, const Tensor& state, const Tensor& w_ih,
                    const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh, bool layer) {
  GW_CHECK(b_ih.defined() == b_hh.defined(), op, ": b_ih is ",
           b_ih.defined() ? b_ih.str() : "undefined", " and b_hh ",
           b_hh.defined() ? b_hh.str() : "undefined", "; expected both biases or neither");
  const bool bias = b_ih.defined();
  if (bias) {
    check_inputs(op, {{"x", &x},
                      {"state", &state},
                      {"w_ih", &w_ih},
                      {"w_hh", &w_hh},
                      {"b_ih", &b_ih},
                      {"b_hh", &b_hh}});
  } else {
    check_inputs(op, {{"x", &x}, {"state", &state}, {"w_ih", &w_ih}, {"w_hh", &w_hh}});
  }
  // check_inputs leaves float32 and float64 on the CPU, float32 on CUDA; bfloat16 has no kernel.
  GW_CHECK(x.dtype() != DType::kBFloat16, op, ": x is ", x.str(),
           "; expected float32 (or float64 on the CPU): the fused cell has no bfloat16 kernel, the "
           "composed lstm_cell takes bfloat16");
  GW_CHECK(state.dim() == 3 && state.size(0) == 2, op, ": the state is ", state.str(),
           "; expected [2, B, H] (h then c; lstm_state packs them)");
  const std::int64_t batch = state.size(1), hidden = state.size(2);
  const bool packed_x = x.dim() == 3;
  const std::int64_t rows = packed_x ? x.size(1) : x.size(0);
  const bool rows_ok = layer ? rows % batch == 0 : rows == batch;
  GW_CHECK((x.dim() == 2 || (packed_x && x.size(0) == 2)) && rows_ok, op, ": x is ", x.str(),
           layer ? "; expected [T·B, in] or a layer's output [2, T·B, in] with B = "
                 : "; expected [B, in] or a layer's state [2, B, in] with B = ",
           batch, " (the state's batch)");
  const std::int64_t in = x.size(-1);
  GW_CHECK(w_ih.shape() == Shape({4 * hidden, in}), op, ": W_ih is ", shape_str(w_ih.shape()),
           "; expected [4·H, in] = [", 4 * hidden, ", ", in, "] (H = ", hidden,
           ", the state's last dimension; in = x's)");
  GW_CHECK(w_hh.shape() == Shape({4 * hidden, hidden}), op, ": W_hh is ", shape_str(w_hh.shape()),
           "; expected [4·H, H] = [", 4 * hidden, ", ", hidden, "]");
  if (bias) {
    GW_CHECK(b_ih.shape() == Shape({4 * hidden}) && b_hh.shape() == Shape({4 * hidden}), op,
             ": the biases are ", shape_str(b_ih.shape()), " and ", shape_str(b_hh.shape()),
             "; expected [4·H] = [", 4 * hidden, "] each");
  }
  return {batch, in, hidden, packed_x, bias, rows / batch};
}

// The slots of x, the state (h for a GRU), W_ih, W_hh and the biases (4 or 6): which gradients
// are wanted.
std::array<bool, 6> check_rnn_slots(const char* op, std::span<GradSlot> grads, const Tensor& x,
                                    const Tensor& state, const Tensor& w_ih, const Tensor& w_hh) {
  GW_CHECK(grads.size() == 4 || grads.size() == 6, op, ": ", grads.size(),
           " gradient slots; expected 4 (x, state, W_ih, W_hh) or 6 (and b_ih, b_hh)");
  static constexpr std::array<const char*, 6> kNames{"grad_x",    "grad_state", "grad_w_ih",
                                                     "grad_w_hh", "grad_b_ih",  "grad_b_hh"};
  const std::array<const Tensor*, 4> operands{&x, &state, &w_ih, &w_hh};
  std::array<bool, 6> want{};
  for (std::size_t i = 0; i < grads.size(); ++i) {
    want[i] = i < 4 ? check_slot(op, kNames[i], grads[i], *operands[i])
                    : check_slot(op, kNames[i], grads[i], {w_hh.size(0)}, x);
  }
  return want;
}

struct GruDims {
  std::int64_t batch, in, hidden;
  bool bias;
};

GruDims check_gru(const char* op, const Tensor& x, const Tensor& h, const Tensor& w_ih,
                  const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  GW_CHECK(b_ih.defined() == b_hh.defined(), op, ": b_ih is ",
           b_ih.defined() ? b_ih.str() : "undefined", " and b_hh ",
           b_hh.defined() ? b_hh.str() : "undefined", "; expected both biases or neither");
  const bool bias = b_ih.defined();
  if (bias) {
    check_inputs(
        op,
        {{"x", &x}, {"h", &h}, {"w_ih", &w_ih}, {"w_hh", &w_hh}, {"b_ih", &b_ih}, {"b_hh", &b_hh}});
  } else {
    check_inputs(op, {{"x", &x}, {"h", &h}, {"w_ih", &w_ih}, {"w_hh", &w_hh}});
  }
  GW_CHECK(x.dtype() != DType::kBFloat16, op, ": x is ", x.str(),
           "; expected float32 (or float64 on the CPU): the fused cell has no bfloat16 kernel, the "
           "composed gru_cell takes bfloat16");
  GW_CHECK(x.dim() == 2 && h.dim() == 2 && h.size(0) == x.size(0), op, ": x is ", x.str(), ", h ",
           h.str(), "; expected x [B, in] and h [B, H] of the same batch B");
  const std::int64_t batch = x.size(0), in = x.size(1), hidden = h.size(1);
  GW_CHECK(w_ih.shape() == Shape({3 * hidden, in}), op, ": W_ih is ", shape_str(w_ih.shape()),
           "; expected [3·H, in] = [", 3 * hidden, ", ", in, "] (H = ", hidden,
           ", h's last dimension; in = x's)");
  GW_CHECK(w_hh.shape() == Shape({3 * hidden, hidden}), op, ": W_hh is ", shape_str(w_hh.shape()),
           "; expected [3·H, H] = [", 3 * hidden, ", ", hidden, "]");
  if (bias) {
    GW_CHECK(b_ih.shape() == Shape({3 * hidden}) && b_hh.shape() == Shape({3 * hidden}), op,
             ": the biases are ", shape_str(b_ih.shape()), " and ", shape_str(b_hh.shape()),
             "; expected [3·H] = [", 3 * hidden, "] each");
  }
  return {batch, in, hidden, bias};
}

// The ops' building blocks on one device: on CUDA (T = float) on `stream`, else on the CPU.
template <class T>
struct Steps {
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
  void gru_forward(T* out, T* act, const T* gx, const T* gh, const T* h, const T* b_ih,
                   const T* b_hh, std::int64_t batch, std::int64_t hidden) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        k::gru_cell_forward(out, act, gx, gh, h, b_ih, b_hh, batch, hidden, stream);
        return;
      }
    }
#endif
    k::cpu::gru_cell_forward<T>(out, act, gx, gh, h, b_ih, b_hh, batch, hidden);
  }
  void gru_backward(T* dgx, T* dgh, T* dh, const T* grad, const T* act, const T* h,
                    std::int64_t batch, std::int64_t hidden, bool accumulate) const {
#if GRAPHWARD_HAS_CUDA
    if constexpr (std::is_same_v<T, float>) {
      if (cuda) {
        k::gru_cell_backward(dgx, dgh, dh, grad, act, h, batch, hidden, accumulate, stream);
        return;
      }
    }
#endif
    k::cpu::gru_cell_backward<T>(dgx, dgh, dh, grad, act, h, batch, hidden, accumulate);
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
void layer_forward(const Steps<T>& s, const LstmDims& d, const LayerData<T>& p) {
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
void layer_backward(const Steps<T>& s, const LstmDims& d, const LayerData<T>& p, const T* grad,
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

// Runs f(steps) with the operands' device's Steps: on CUDA in a scope that first waits for
// `inputs`' producers (rule [read after write]), on the CPU per the dtype.
template <class F>
void on_device(const Tensor& like, std::span<const Tensor* const> inputs, F&& f) {
  if (like.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(like.device());
    scope.read(inputs);
    f(Steps<float>{true, like.device(), scope.stream()});
    return;
#endif
  }
  (void)inputs;  // the CPU backend runs in order
  dispatch_cpu(like.dtype(), [&]<class T>() { f(Steps<T>{false, like.device(), nullptr}); });
}

// The inputs a recurrent op reads: x, the state, the weights, the biases where defined.
std::vector<const Tensor*> rnn_inputs(const Tensor& x, const Tensor& state, const Tensor& w_ih,
                                      const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  std::vector<const Tensor*> v{&x, &state, &w_ih, &w_hh};
  if (b_ih.defined()) {
    v.push_back(&b_ih);
    v.push_back(&b_hh);
  }
  return v;
}

void lstm_op_backward(const char* op, bool layer, const Tensor& grad_out, const Tensor& xs,
                      const Tensor& state, const Tensor& w_ih, const Tensor& w_hh,
                      const Tensor& act, const Tensor& out, std::span<GradSlot> grads);

// fused_lstm_cell (a layer of one step) and fused_lstm_layer: `op` names it, `layer` says which.
Tensor lstm_op(const char* op, bool layer, const Tensor& xs, const Tensor& state,
               const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  detail::NvtxRange range(op);
  const LstmDims d = check_lstm(op, xs, state, w_ih, w_hh, b_ih, b_hh, layer);
  const std::vector<const Tensor*> inputs = rnn_inputs(xs, state, w_ih, w_hh, b_ih, b_hh);
  const bool grad = needs_grad(std::span<const Tensor* const>(inputs));
  const std::int64_t TB = d.steps * d.batch;
  Tensor act, out;
  on_device(xs, inputs, [&]<class T>(const Steps<T>& s) {
    act = new_output({TB, 4 * d.hidden}, xs);
    out = new_output({2, TB, d.hidden}, xs);
    layer_forward<T>(s, d, layer_data<T>(d, xs, state, w_ih, w_hh, b_ih, b_hh, act, out));
  });
  if (grad) {
    std::vector<SavedTensor> saved{save("x", xs),      save("state", state), save("w_ih", w_ih),
                                   save("w_hh", w_hh), save("gates", act),   save("output", out)};
    const char* backward_op = layer ? "fused_lstm_layer_backward" : "fused_lstm_cell_backward";
    record(op, out, std::span<const Tensor* const>(inputs), std::move(saved),
           [backward_op, layer](const Tensor& g, const std::vector<Tensor>& s,
                                std::span<GradSlot> grads) {
             lstm_op_backward(backward_op, layer, g, s[0], s[1], s[2], s[3], s[4], s[5], grads);
           });
    // Four GEMMs' worth back: the input's, the recurrent gradient's and the two weights'.
    out.grad_fn()->set_backward_flops(4.0 * static_cast<double>(TB) *
                                      static_cast<double>(d.in + d.hidden) *
                                      static_cast<double>(4 * d.hidden));
  }
  return out;
}

void lstm_op_backward(const char* op, bool layer, const Tensor& grad_out, const Tensor& xs,
                      const Tensor& state, const Tensor& w_ih, const Tensor& w_hh,
                      const Tensor& act, const Tensor& out, std::span<GradSlot> grads) {
  // Every check before anything is allocated or written (Note [Check, then write]).
  const LstmDims d = check_lstm(op, xs, state, w_ih, w_hh, Tensor(), Tensor(), layer);
  const std::int64_t B = d.batch, H = d.hidden, TB = d.steps * d.batch;
  check_inputs(op, {{"x", &xs}, {"grad_out", &grad_out}, {"gates", &act}, {"output", &out}});
  GW_CHECK(grad_out.numel() == 2 * TB * H && grad_out.shape() == out.shape() &&
               out.numel() == 2 * TB * H && act.shape() == Shape({TB, 4 * H}),
           op, ": grad_out is ", shape_str(grad_out.shape()), ", the output ",
           shape_str(out.shape()), ", the gates ", shape_str(act.shape()),
           "; expected the output's shape (", 2 * TB * H, " elements) twice and [", TB, ", ", 4 * H,
           "]");
  const std::array<bool, 6> want = check_rnn_slots(op, grads, xs, state, w_ih, w_hh);
  if (std::none_of(want.begin(), want.end(), [](bool w) { return w; })) return;
  const std::array<const Tensor*, 4> operands{&xs, &state, &w_ih, &w_hh};
  const std::array<const Tensor*, 7> reads{&grad_out, &xs, &state, &w_ih, &w_hh, &act, &out};
  on_device(xs, reads, [&]<class T>(const Steps<T>& s) {
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
  });
}

}  // namespace

Tensor fused_lstm_cell(const Tensor& x, const Tensor& state, const Tensor& w_ih, const Tensor& w_hh,
                       const Tensor& b_ih, const Tensor& b_hh) {
  return lstm_op("fused_lstm_cell", false, x, state, w_ih, w_hh, b_ih, b_hh);
}

void fused_lstm_cell_backward(const Tensor& grad_out, const Tensor& x, const Tensor& state,
                              const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                              const Tensor& out, std::span<GradSlot> grads) {
  lstm_op_backward("fused_lstm_cell_backward", false, grad_out, x, state, w_ih, w_hh, act, out,
                   grads);
}

Tensor fused_lstm_layer(const Tensor& xs, const Tensor& state, const Tensor& w_ih,
                        const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  return lstm_op("fused_lstm_layer", true, xs, state, w_ih, w_hh, b_ih, b_hh);
}

void fused_lstm_layer_backward(const Tensor& grad_out, const Tensor& xs, const Tensor& state,
                               const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                               const Tensor& out, std::span<GradSlot> grads) {
  lstm_op_backward("fused_lstm_layer_backward", true, grad_out, xs, state, w_ih, w_hh, act, out,
                   grads);
}

Tensor fused_gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                      const Tensor& b_ih, const Tensor& b_hh) {
  const char* op = "fused_gru_cell";
  detail::NvtxRange range(op);
  const GruDims d = check_gru(op, x, h, w_ih, w_hh, b_ih, b_hh);
  const std::vector<const Tensor*> inputs = rnn_inputs(x, h, w_ih, w_hh, b_ih, b_hh);
  const bool grad = needs_grad(std::span<const Tensor* const>(inputs));
  const std::int64_t B = d.batch, H = d.hidden, G = 3 * d.hidden;
  Tensor out, act;
  // gx = x·W_ihᵀ, gh = h·W_hhᵀ, then the gates with the biases in one kernel.
  on_device(x, inputs, [&]<class T>(const Steps<T>& s) {
    const Tensor gx = new_output({B, G}, x), gh = new_output({B, G}, x);
    out = new_output({B, H}, x);
    act = new_output({B, 4 * H}, x);
    s.gemm(false, true, B, G, d.in, ptr<T>(x), ptr<T>(w_ih), false, ptr<T>(gx));
    s.gemm(false, true, B, G, H, ptr<T>(h), ptr<T>(w_hh), false, ptr<T>(gh));
    s.gru_forward(ptr<T>(out), ptr<T>(act), ptr<T>(gx), ptr<T>(gh), ptr<T>(h),
                  d.bias ? ptr<T>(b_ih) : nullptr, d.bias ? ptr<T>(b_hh) : nullptr, B, H);
  });
  if (grad) {
    std::vector<SavedTensor> saved{save("x", x), save("h", h), save("w_ih", w_ih),
                                   save("w_hh", w_hh), save("gates", act)};
    record(op, out, std::span<const Tensor* const>(inputs), std::move(saved),
           [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             fused_gru_cell_backward(g, s[0], s[1], s[2], s[3], s[4], grads);
           });
    out.grad_fn()->set_backward_flops(4.0 * static_cast<double>(B) * static_cast<double>(d.in + H) *
                                      static_cast<double>(G));
  }
  return out;
}

void fused_gru_cell_backward(const Tensor& grad_out, const Tensor& x, const Tensor& h,
                             const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                             std::span<GradSlot> grads) {
  const char* op = "fused_gru_cell_backward";
  // Every check before anything is allocated or written (Note [Check, then write]).
  const GruDims d = check_gru(op, x, h, w_ih, w_hh, Tensor(), Tensor());
  const std::int64_t B = d.batch, H = d.hidden, G = 3 * d.hidden, in = d.in;
  check_inputs(op, {{"x", &x}, {"grad_out", &grad_out}, {"gates", &act}});
  GW_CHECK(grad_out.shape() == h.shape() && act.shape() == Shape({B, 4 * H}), op, ": grad_out is ",
           shape_str(grad_out.shape()), ", the gates ", shape_str(act.shape()),
           "; expected h's shape ", shape_str(h.shape()), " and [", B, ", ", 4 * H, "]");
  const std::array<bool, 6> want = check_rnn_slots(op, grads, x, h, w_ih, w_hh);
  if (std::none_of(want.begin(), want.end(), [](bool w) { return w; })) return;
  const std::array<const Tensor*, 4> operands{&x, &h, &w_ih, &w_hh};
  // dgx, dgh and h's direct part, then: dh += dgh·W_hh, dx = dgx·W_ih, dW_ih = dgxᵀ·x,
  // dW_hh = dghᵀ·h, db_ih = Σ_rows dgx, db_hh = Σ_rows dgh.
  const std::array<const Tensor*, 6> reads{&grad_out, &x, &h, &w_ih, &w_hh, &act};
  on_device(x, reads, [&]<class T>(const Steps<T>& s) {
    const Tensor dgx = new_output({B, G}, x), dgh = new_output({B, G}, x);
    std::array<Grad<T>, 6> g{};
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!want[i]) continue;
      g[i].accumulate = i < 4 ? open_slot(grads[i], *operands[i], s.stream)
                              : open_slot(grads[i], {G}, x, s.stream);
      g[i].ptr = slot_ptr<T>(grads[i]);
    }
    T* gx = ptr<T>(dgx);
    T* gh = ptr<T>(dgh);
    s.gru_backward(gx, gh, g[1].ptr, ptr<T>(grad_out), ptr<T>(act), ptr<T>(h), B, H,
                   g[1].accumulate);
    if (g[1].ptr) s.gemm(false, false, B, H, G, gh, ptr<T>(w_hh), true, g[1].ptr);
    if (g[0].ptr) s.gemm(false, false, B, in, G, gx, ptr<T>(w_ih), g[0].accumulate, g[0].ptr);
    if (g[2].ptr) s.gemm(true, false, G, in, B, gx, ptr<T>(x), g[2].accumulate, g[2].ptr);
    if (g[3].ptr) s.gemm(true, false, G, H, B, gh, ptr<T>(h), g[3].accumulate, g[3].ptr);
    if (g[4].ptr) s.column_sum(g[4].ptr, gx, B, G, g[4].accumulate);
    if (g[5].ptr) s.column_sum(g[5].ptr, gh, B, G, g[5].accumulate);
  });
}

}  // namespace graphward
