// The fused LSTM and GRU cells (engine/ops/rnn.h): their GEMMs through cuBLAS on CUDA and the
// reference GEMM on the CPU, their pointwise work in kernels/rnn.h.
#include <array>

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

namespace ops_detail {
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

std::array<bool, 6> check_lstm_slots(const char* op, std::span<GradSlot> grads, const Tensor& x,
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
}  // namespace ops_detail

namespace {

struct LstmOut {
  Tensor out;    // [2, B, H]
  Tensor gates;  // [B, 4H]: the activations i, f, g, o
};

LstmOut lstm_forward(const LstmDims& d, const Tensor& x, const Tensor& state, const Tensor& w_ih,
                     const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  LstmOut o;
  const std::int64_t B = d.batch, H = d.hidden, G = 4 * d.hidden;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    if (d.bias) {
      scope.read({&x, &state, &w_ih, &w_hh, &b_ih, &b_hh});
    } else {
      scope.read({&x, &state, &w_ih, &w_hh});
    }
    o.gates = new_output({B, G}, x);
    o.out = new_output({2, B, H}, x);
    float* gates = ptr<float>(o.gates);
    const float* s = ptr<float>(state);
    // gates = x·W_ihᵀ, then += h·W_hhᵀ (the state's first B·H elements are h).
    graphward::gemm(x.device(), scope.stream(), false, true, B, G, d.in, 1.f, ptr<float>(x),
                    ptr<float>(w_ih), 0.f, gates);
    graphward::gemm(x.device(), scope.stream(), false, true, B, G, H, 1.f, s, ptr<float>(w_hh), 1.f,
                    gates);
    k::lstm_cell_forward(gates, ptr<float>(o.out), ptr<float>(o.out) + B * H, s + B * H,
                         d.bias ? ptr<float>(b_ih) : nullptr, d.bias ? ptr<float>(b_hh) : nullptr,
                         B, H, scope.stream());
    return o;
#endif
  }
  o.gates = new_output({B, G}, x);
  o.out = new_output({2, B, H}, x);
  dispatch_cpu(x.dtype(), [&]<class T>() {
    T* gates = ptr<T>(o.gates);
    const T* s = ptr<T>(state);
    k::cpu::gemm<T>(false, true, B, G, d.in, T(1), ptr<T>(x), ptr<T>(w_ih), T(0), gates);
    k::cpu::gemm<T>(false, true, B, G, H, T(1), s, ptr<T>(w_hh), T(1), gates);
    k::cpu::lstm_cell_forward<T>(gates, ptr<T>(o.out), ptr<T>(o.out) + B * H, s + B * H,
                                 d.bias ? ptr<T>(b_ih) : nullptr, d.bias ? ptr<T>(b_hh) : nullptr,
                                 B, H);
  });
  return o;
}
}  // namespace

Tensor fused_lstm_cell(const Tensor& x, const Tensor& state, const Tensor& w_ih, const Tensor& w_hh,
                       const Tensor& b_ih, const Tensor& b_hh) {
  const char* op = "fused_lstm_cell";
  detail::NvtxRange range(op);
  const LstmDims d = check_lstm(op, x, state, w_ih, w_hh, b_ih, b_hh);
  const bool grad = d.bias ? needs_grad({&x, &state, &w_ih, &w_hh, &b_ih, &b_hh})
                           : needs_grad({&x, &state, &w_ih, &w_hh});
  LstmOut o = lstm_forward(d, x, state, w_ih, w_hh, b_ih, b_hh);
  if (grad) {
    std::vector<SavedTensor> saved{save("x", x),           save("state", state),
                                   save("w_ih", w_ih),     save("w_hh", w_hh),
                                   save("gates", o.gates), save("output", o.out)};
    auto backward = [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
      fused_lstm_cell_backward(g, s[0], s[1], s[2], s[3], s[4], s[5], grads);
    };
    if (d.bias) {
      record(op, o.out, {&x, &state, &w_ih, &w_hh, &b_ih, &b_hh}, std::move(saved), backward);
    } else {
      record(op, o.out, {&x, &state, &w_ih, &w_hh}, std::move(saved), backward);
    }
    // Four GEMMs back: the input's and the state's gradients and the two weights'.
    o.out.grad_fn()->set_backward_flops(4.0 * static_cast<double>(d.batch) *
                                        static_cast<double>(d.in + d.hidden) *
                                        static_cast<double>(4 * d.hidden));
  }
  return o.out;
}

void fused_lstm_cell_backward(const Tensor& grad_out, const Tensor& x, const Tensor& state,
                              const Tensor& w_ih, const Tensor& w_hh, const Tensor& act,
                              const Tensor& out, std::span<GradSlot> grads) {
  const char* op = "fused_lstm_cell_backward";
  // Every check before anything is allocated or written (Note [Check, then write]).
  const LstmDims d = check_lstm(op, x, state, w_ih, w_hh, Tensor(), Tensor());
  const std::int64_t B = d.batch, H = d.hidden, G = 4 * d.hidden, in = d.in;
  check_inputs(op, {{"x", &x}, {"grad_out", &grad_out}, {"gates", &act}, {"output", &out}});
  GW_CHECK(grad_out.shape() == state.shape() && out.shape() == state.shape() &&
               act.shape() == Shape({B, G}),
           op, ": grad_out is ", shape_str(grad_out.shape()), ", the output ",
           shape_str(out.shape()), ", the gates ", shape_str(act.shape()),
           "; expected the state's shape ", shape_str(state.shape()), " twice and [", B, ", ", G,
           "]");
  const std::array<bool, 6> want = check_lstm_slots(op, grads, x, state, w_ih, w_hh);
  bool any = false;
  for (bool w : want) any = any || w;
  if (!any) return;
  const std::int64_t xs = B * in;  // the elements of x read (its h where x is a state)
  // dgates, then: d(state) = [dgates·W_hh ; dc], dx = dgates·W_ih, dW_ih = dgatesᵀ·x,
  // dW_hh = dgatesᵀ·h, db = Σ_rows dgates (both biases).
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&grad_out, &x, &state, &w_ih, &w_hh, &act, &out});
    const cudaStream_t st = scope.stream();
    const Device dev = x.device();
    const Tensor dgates = new_output({B, G}, x);
    float* dg = ptr<float>(dgates);
    const float* s = ptr<float>(state);
    const bool acc_state = want[1] && open_slot(grads[1], state, st);
    float* ds = want[1] ? slot_ptr<float>(grads[1]) : nullptr;
    const float* g = ptr<float>(grad_out);
    k::lstm_cell_backward(dg, ds ? ds + B * H : nullptr, g, nullptr, g + B * H, nullptr,
                          ptr<float>(act), s + B * H, ptr<float>(out) + B * H, B, H, acc_state, st);
    if (want[1]) {
      graphward::gemm(dev, st, false, false, B, H, G, 1.f, dg, ptr<float>(w_hh),
                      acc_state ? 1.f : 0.f, ds);
    }
    if (want[0]) {
      const bool acc = open_slot(grads[0], x, st);
      float* dx = slot_ptr<float>(grads[0]);
      graphward::gemm(dev, st, false, false, B, in, G, 1.f, dg, ptr<float>(w_ih), acc ? 1.f : 0.f,
                      dx);
      if (d.packed_x && !acc) k::fill(dx + xs, 0.f, xs, st);  // the layer below's c: no gradient
    }
    if (want[2]) {
      const bool acc = open_slot(grads[2], w_ih, st);
      graphward::gemm(dev, st, true, false, G, in, B, 1.f, dg, ptr<float>(x), acc ? 1.f : 0.f,
                      slot_ptr<float>(grads[2]));
    }
    if (want[3]) {
      const bool acc = open_slot(grads[3], w_hh, st);
      graphward::gemm(dev, st, true, false, G, H, B, 1.f, dg, s, acc ? 1.f : 0.f,
                      slot_ptr<float>(grads[3]));
    }
    for (std::size_t i = 4; i < grads.size(); ++i) {
      if (!want[i]) continue;
      const bool acc = open_slot(grads[i], {G}, x, st);
      k::column_sum<float>(slot_ptr<float>(grads[i]), dg, nullptr, 1.f, B, G, acc, st);
    }
    return;
#endif
  }
  dispatch_cpu(x.dtype(), [&]<class T>() {
    const Tensor dgates = new_output({B, G}, x);
    T* dg = ptr<T>(dgates);
    const T* s = ptr<T>(state);
    const bool acc_state = want[1] && open_slot(grads[1], state, nullptr);
    T* ds = want[1] ? slot_ptr<T>(grads[1]) : nullptr;
    const T* g = ptr<T>(grad_out);
    k::cpu::lstm_cell_backward<T>(dg, ds ? ds + B * H : nullptr, g, nullptr, g + B * H, nullptr,
                                  ptr<T>(act), s + B * H, ptr<T>(out) + B * H, B, H, acc_state);
    if (want[1]) {
      k::cpu::gemm<T>(false, false, B, H, G, T(1), dg, ptr<T>(w_hh), acc_state ? T(1) : T(0), ds);
    }
    if (want[0]) {
      const bool acc = open_slot(grads[0], x, nullptr);
      T* dx = slot_ptr<T>(grads[0]);
      k::cpu::gemm<T>(false, false, B, in, G, T(1), dg, ptr<T>(w_ih), acc ? T(1) : T(0), dx);
      if (d.packed_x && !acc) {
        for (std::int64_t i = 0; i < xs; ++i) dx[xs + i] = T(0);
      }
    }
    if (want[2]) {
      const bool acc = open_slot(grads[2], w_ih, nullptr);
      k::cpu::gemm<T>(true, false, G, in, B, T(1), dg, ptr<T>(x), acc ? T(1) : T(0),
                      slot_ptr<T>(grads[2]));
    }
    if (want[3]) {
      const bool acc = open_slot(grads[3], w_hh, nullptr);
      k::cpu::gemm<T>(true, false, G, H, B, T(1), dg, s, acc ? T(1) : T(0), slot_ptr<T>(grads[3]));
    }
    for (std::size_t i = 4; i < grads.size(); ++i) {
      if (!want[i]) continue;
      const bool acc = open_slot(grads[i], {G}, x, nullptr);
      k::cpu::column_sum<T>(slot_ptr<T>(grads[i]), dg, nullptr, T(1), B, G, acc);
    }
  });
}

namespace {
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
}  // namespace

Tensor fused_gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                      const Tensor& b_ih, const Tensor& b_hh) {
  const char* op = "fused_gru_cell";
  detail::NvtxRange range(op);
  const GruDims d = check_gru(op, x, h, w_ih, w_hh, b_ih, b_hh);
  const bool grad = d.bias ? needs_grad({&x, &h, &w_ih, &w_hh, &b_ih, &b_hh})
                           : needs_grad({&x, &h, &w_ih, &w_hh});
  const std::int64_t B = d.batch, H = d.hidden, G = 3 * d.hidden;
  Tensor out, act;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    if (d.bias) {
      scope.read({&x, &h, &w_ih, &w_hh, &b_ih, &b_hh});
    } else {
      scope.read({&x, &h, &w_ih, &w_hh});
    }
    const Tensor gx = new_output({B, G}, x), gh = new_output({B, G}, x);
    out = new_output({B, H}, x);
    act = new_output({B, 4 * H}, x);
    graphward::gemm(x.device(), scope.stream(), false, true, B, G, d.in, 1.f, ptr<float>(x),
                    ptr<float>(w_ih), 0.f, ptr<float>(gx));
    graphward::gemm(x.device(), scope.stream(), false, true, B, G, H, 1.f, ptr<float>(h),
                    ptr<float>(w_hh), 0.f, ptr<float>(gh));
    k::gru_cell_forward(ptr<float>(out), ptr<float>(act), ptr<float>(gx), ptr<float>(gh),
                        ptr<float>(h), d.bias ? ptr<float>(b_ih) : nullptr,
                        d.bias ? ptr<float>(b_hh) : nullptr, B, H, scope.stream());
#endif
  } else {
    const Tensor gx = new_output({B, G}, x), gh = new_output({B, G}, x);
    out = new_output({B, H}, x);
    act = new_output({B, 4 * H}, x);
    dispatch_cpu(x.dtype(), [&]<class T>() {
      k::cpu::gemm<T>(false, true, B, G, d.in, T(1), ptr<T>(x), ptr<T>(w_ih), T(0), ptr<T>(gx));
      k::cpu::gemm<T>(false, true, B, G, H, T(1), ptr<T>(h), ptr<T>(w_hh), T(0), ptr<T>(gh));
      k::cpu::gru_cell_forward<T>(ptr<T>(out), ptr<T>(act), ptr<T>(gx), ptr<T>(gh), ptr<T>(h),
                                  d.bias ? ptr<T>(b_ih) : nullptr, d.bias ? ptr<T>(b_hh) : nullptr,
                                  B, H);
    });
  }
  if (grad) {
    std::vector<SavedTensor> saved{save("x", x), save("h", h), save("w_ih", w_ih),
                                   save("w_hh", w_hh), save("gates", act)};
    auto backward = [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
      fused_gru_cell_backward(g, s[0], s[1], s[2], s[3], s[4], grads);
    };
    if (d.bias) {
      record(op, out, {&x, &h, &w_ih, &w_hh, &b_ih, &b_hh}, std::move(saved), backward);
    } else {
      record(op, out, {&x, &h, &w_ih, &w_hh}, std::move(saved), backward);
    }
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
  GW_CHECK(grads.size() == 4 || grads.size() == 6, op, ": ", grads.size(),
           " gradient slots; expected 4 (x, h, W_ih, W_hh) or 6 (and b_ih, b_hh)");
  static constexpr std::array<const char*, 6> kNames{"grad_x",    "grad_h",    "grad_w_ih",
                                                     "grad_w_hh", "grad_b_ih", "grad_b_hh"};
  const std::array<const Tensor*, 4> operands{&x, &h, &w_ih, &w_hh};
  std::array<bool, 6> want{};
  bool any = false;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    want[i] = i < 4 ? check_slot(op, kNames[i], grads[i], *operands[i])
                    : check_slot(op, kNames[i], grads[i], {G}, x);
    any = any || want[i];
  }
  if (!any) return;
  // dgx, dgh and h's direct part, then: dh += dgh·W_hh, dx = dgx·W_ih, dW_ih = dgxᵀ·x,
  // dW_hh = dghᵀ·h, db_ih = Σ_rows dgx, db_hh = Σ_rows dgh.
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&grad_out, &x, &h, &w_ih, &w_hh, &act});
    const cudaStream_t st = scope.stream();
    const Device dev = x.device();
    const Tensor dgx = new_output({B, G}, x), dgh = new_output({B, G}, x);
    const bool acc_h = want[1] && open_slot(grads[1], h, st);
    float* dh = want[1] ? slot_ptr<float>(grads[1]) : nullptr;
    k::gru_cell_backward(ptr<float>(dgx), ptr<float>(dgh), dh, ptr<float>(grad_out),
                         ptr<float>(act), ptr<float>(h), B, H, acc_h, st);
    if (want[1]) {
      graphward::gemm(dev, st, false, false, B, H, G, 1.f, ptr<float>(dgh), ptr<float>(w_hh), 1.f,
                      dh);
    }
    if (want[0]) {
      const bool acc = open_slot(grads[0], x, st);
      graphward::gemm(dev, st, false, false, B, in, G, 1.f, ptr<float>(dgx), ptr<float>(w_ih),
                      acc ? 1.f : 0.f, slot_ptr<float>(grads[0]));
    }
    if (want[2]) {
      const bool acc = open_slot(grads[2], w_ih, st);
      graphward::gemm(dev, st, true, false, G, in, B, 1.f, ptr<float>(dgx), ptr<float>(x),
                      acc ? 1.f : 0.f, slot_ptr<float>(grads[2]));
    }
    if (want[3]) {
      const bool acc = open_slot(grads[3], w_hh, st);
      graphward::gemm(dev, st, true, false, G, H, B, 1.f, ptr<float>(dgh), ptr<float>(h),
                      acc ? 1.f : 0.f, slot_ptr<float>(grads[3]));
    }
    for (std::size_t i = 4; i < grads.size(); ++i) {
      if (!want[i]) continue;
      const bool acc = open_slot(grads[i], {G}, x, st);
      k::column_sum<float>(slot_ptr<float>(grads[i]), ptr<float>(i == 4 ? dgx : dgh), nullptr, 1.f,
                           B, G, acc, st);
    }
    return;
#endif
  }
  dispatch_cpu(x.dtype(), [&]<class T>() {
    const Tensor dgx = new_output({B, G}, x), dgh = new_output({B, G}, x);
    const bool acc_h = want[1] && open_slot(grads[1], h, nullptr);
    T* dh = want[1] ? slot_ptr<T>(grads[1]) : nullptr;
    k::cpu::gru_cell_backward<T>(ptr<T>(dgx), ptr<T>(dgh), dh, ptr<T>(grad_out), ptr<T>(act),
                                 ptr<T>(h), B, H, acc_h);
    if (want[1]) {
      k::cpu::gemm<T>(false, false, B, H, G, T(1), ptr<T>(dgh), ptr<T>(w_hh), T(1), dh);
    }
    if (want[0]) {
      const bool acc = open_slot(grads[0], x, nullptr);
      k::cpu::gemm<T>(false, false, B, in, G, T(1), ptr<T>(dgx), ptr<T>(w_ih), acc ? T(1) : T(0),
                      slot_ptr<T>(grads[0]));
    }
    if (want[2]) {
      const bool acc = open_slot(grads[2], w_ih, nullptr);
      k::cpu::gemm<T>(true, false, G, in, B, T(1), ptr<T>(dgx), ptr<T>(x), acc ? T(1) : T(0),
                      slot_ptr<T>(grads[2]));
    }
    if (want[3]) {
      const bool acc = open_slot(grads[3], w_hh, nullptr);
      k::cpu::gemm<T>(true, false, G, H, B, T(1), ptr<T>(dgh), ptr<T>(h), acc ? T(1) : T(0),
                      slot_ptr<T>(grads[3]));
    }
    for (std::size_t i = 4; i < grads.size(); ++i) {
      if (!want[i]) continue;
      const bool acc = open_slot(grads[i], {G}, x, nullptr);
      k::cpu::column_sum<T>(slot_ptr<T>(grads[i]), ptr<T>(i == 4 ? dgx : dgh), nullptr, T(1), B, G,
                            acc);
    }
  });
}

}  // namespace graphward
