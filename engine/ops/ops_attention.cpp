// scaled_dot_product_attention: fused through cuDNN (Note [Fused attention], engine/runtime/dnn.h), or
// composed of recorded ops (ops.h): bmm, softmax or causal_softmax, dropout, bmm.
#include <cmath>

#include "graphward/engine/ops/autocast.h"
#include "graphward/engine/ops/ops.h"
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/dnn.h"
#include "graphward/engine/runtime/generator.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/dropout.h"
#include "graphward/kernels/elementwise.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;

namespace {

// q, k, v as [n, T, d] batches of matrices, and the output's shape.
struct AttentionDims {
  std::int64_t n = 1, tq = 0, tk = 0, d = 0, dv = 0;
  Shape out_shape;
};

void check_attention_options(const char* op, const AttentionOptions& o, const Tensor& q,
                             const char* q_name) {
  if (o.scale) check_finite_scalar(op, *o.scale, q);
  GW_CHECK(std::isfinite(o.dropout) && o.dropout >= 0 && o.dropout < 1, op, ": dropout is ",
           o.dropout, "; expected a probability of dropping in [0, 1)");
  GW_CHECK(o.dropout == 0 || o.generator != nullptr, op, ": dropout is ", o.dropout,
           " and no generator is given; expected AttentionOptions::generator where dropout > 0");
  GW_CHECK(o.dropout == 0 || o.generator->device() == q.device(), op,
           ": the dropout's generator is on ", o.generator->device().str(), " and ", q_name,
           " on ", q.device().str(), "; expected one device");
}

// Every check before the first op runs (Note [Check, then write]): nothing is recorded or written
// by a call that is refused.
AttentionDims check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& o) {
  check_inputs(op, {{"q", &q}, {"k", &k}, {"v", &v}}, Bf16::kEverywhere);
  GW_CHECK(q.dim() >= 3, op, ": q has shape ", shape_str(q.shape()),
           "; expected [..., Tq, d] with at least one leading dimension (batch, heads)");
  GW_CHECK(k.dim() == q.dim() && v.dim() == q.dim(), op, ": q, k and v have shapes ",
           shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()),
           "; expected the same number of dimensions");
  AttentionDims d;
  for (std::int64_t i = 0; i < q.dim() - 2; ++i) {
    GW_CHECK(k.size(i) == q.size(i) && v.size(i) == q.size(i), op, ": q, k and v have shapes ",
             shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()),
             "; expected the same leading dimensions (all but the last two)");
    d.n *= q.size(i);
  }
  d.tq = q.size(-2);
  d.d = q.size(-1);
  d.tk = k.size(-2);
  d.dv = v.size(-1);
  GW_CHECK(k.size(-1) == d.d, op, ": q has shape ", shape_str(q.shape()), " and k ",
           shape_str(k.shape()), "; expected k's last dimension (the head dimension) to be q's, ",
           d.d);
  GW_CHECK(v.size(-2) == d.tk, op, ": k has shape ", shape_str(k.shape()), " and v ",
           shape_str(v.shape()), "; expected a value for each key: v's second-to-last dimension ",
           d.tk);
  check_attention_options(op, o, q, "q");
  d.out_shape = q.shape();
  d.out_shape.back() = d.dv;
  return d;
}

double attention_scale(const AttentionOptions& o, const AttentionDims& d) {
  return o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(d.d));
}

dnn::SdpaGeom sdpa_geom(const AttentionDims& d, const AttentionOptions& o) {
  return {.n = d.n, .tq = d.tq, .tk = d.tk, .d = d.d, .dv = d.dv, .causal = o.causal,
          .scale = static_cast<float>(attention_scale(o, d)),
          .dropout = static_cast<float>(o.dropout)};
}

// self_attention's qkv [b · seq, 3 · dim] as heads: the attention of [n = b · heads, seq, head]
// (AttentionDims), the output [b · seq, dim].
struct SelfAttentionDims {
  AttentionDims a;
  std::int64_t batch = 0, seq = 0, heads = 0, dim = 0;
};
SelfAttentionDims check_self_attention(const char* op, const Tensor& qkv, std::int64_t seq,
                                       std::int64_t heads, const AttentionOptions& o) {
  check_inputs(op, {{"qkv", &qkv}}, Bf16::kEverywhere);
  GW_CHECK(qkv.dim() == 2, op, ": qkv has shape ", shape_str(qkv.shape()),
           "; expected [batch · seq, 3 · dim] (one row a position: its q, k and v side by side)");
  GW_CHECK(seq >= 1 && heads >= 1, op, ": seq is ", seq, " and heads ", heads,
           "; expected both at least 1");
  GW_CHECK(qkv.size(0) % seq == 0, op, ": qkv has ", qkv.size(0), " rows and seq is ", seq,
           "; expected batch · seq rows (a whole number of sequences)");
  GW_CHECK(qkv.size(1) % (3 * heads) == 0, op, ": qkv has ", qkv.size(1),
           " columns and heads is ", heads, "; expected 3 · dim columns, dim a multiple of heads");
  check_attention_options(op, o, qkv, "qkv");
  SelfAttentionDims d;
  d.seq = seq;
  d.heads = heads;
  d.batch = qkv.size(0) / seq;
  d.dim = qkv.size(1) / 3;
  d.a.n = d.batch * heads;
  d.a.tq = d.a.tk = seq;
  d.a.d = d.a.dv = d.dim / heads;
  d.a.out_shape = {d.batch * seq, d.dim};
  return d;
}

dnn::SdpaGeom self_sdpa_geom(const SelfAttentionDims& d, const AttentionOptions& o) {
  dnn::SdpaGeom g = sdpa_geom(d.a, o);
  g.heads = d.heads;
  return g;
}

// The path for checked arguments (attention_path's contract).
AttentionPath choose_path(const Tensor& q, const dnn::SdpaGeom& geom) {
  if (!q.is_cuda()) return {false, "composed: the CPU backend"};
  if (q.dtype() != DType::kBFloat16) {
    return {false, std::string("composed: ") + dtype_name(q.dtype()) +
                       " (cuDNN's fused attention takes bfloat16)"};
  }
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
  CudaScope scope(q.device());
  std::string why;
  if (!dnn::sdpa_supported(q.device(), scope.stream(), geom, &why)) {
    return {false, "composed: cuDNN refuses the shape: " + why};
  }
  return {true, geom.heads > 0 ? "fused: cuDNN SDPA, q, k and v read in place"
                               : "fused: cuDNN SDPA"};
#else
  (void)geom;
  return {false, "composed: built without cudnn-frontend (base/config.h: "
                 "GRAPHWARD_HAS_CUDNN_FRONTEND 0)"};
#endif
}

#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
// A gradient written by cuDNN (which only overwrites): into the slot, or — accumulating — into a
// scratch tensor added to it after.
struct SdpaGrad {
  bf16* target = nullptr;
  Tensor scratch;
  GradSlot slot;
  bool accumulate = false;
};
SdpaGrad open_sdpa_grad(GradSlot slot, const Tensor& like, cudaStream_t stream) {
  SdpaGrad g;
  if (!slot.tensor) {  // not wanted: cuDNN writes all three, into scratch
    g.scratch = Tensor::empty(like.shape(), {like.dtype(), like.device()});
    g.target = g.scratch.data<bf16>();
    return g;
  }
  g.slot = slot;
  g.accumulate = open_slot(slot, like, stream);
  if (g.accumulate) {
    g.scratch = Tensor::empty(like.shape(), {like.dtype(), like.device()});
    g.target = g.scratch.data<bf16>();
  } else {
    g.target = slot.tensor->data<bf16>();
  }
  return g;
}

// The dropout's seed and offset as cuDNN reads them: int64[2] over a generator state's int32[4]
// copy (engine/runtime/generator.h: the seed's words, then the offset's, low first).
const std::int64_t* rng_words(const Tensor& rng) {
  return static_cast<const std::int64_t*>(rng.raw_data());
}

// A scratch-written gradient added to its slot.
void finish_sdpa_grad(const SdpaGrad& g, cudaStream_t stream) {
  if (!g.accumulate) return;
  bf16* dst = g.slot.tensor->data<bf16>();
  const std::int64_t n = g.scratch.numel();
  kernels::binary_forward(kernels::BinaryOp::kAdd, dst, static_cast<const bf16*>(dst), n,
                          static_cast<const bf16*>(g.scratch.data<bf16>()), n, n, stream);
}

void fused_backward(const Tensor& grad_out, const std::vector<Tensor>& s, const dnn::SdpaGeom& geom,
                    std::span<GradSlot> grads) {
  const char* op = "scaled_dot_product_attention_backward";
  const Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &stats = s[4];
  const std::int64_t* rng = s.size() > 5 ? rng_words(s[5]) : nullptr;
  check_inputs(op, {{"grad_out", &grad_out}, {"q", &q}, {"k", &k}, {"v", &v}, {"output", &o}},
               Bf16::kCuda);
  check_same_shape(op, {"grad_out", &grad_out}, {"output", &o});
  const bool want[3] = {check_slot(op, "grad_q", grads[0], q),
                        check_slot(op, "grad_k", grads[1], k),
                        check_slot(op, "grad_v", grads[2], v)};
  if (!want[0] && !want[1] && !want[2]) return;
  CudaScope scope(q.device());
  scope.read({&grad_out, &q, &k, &v, &o, &stats});
  if (rng) scope.read({&s[5]});
  SdpaGrad g[3];
  const Tensor* like[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    g[i] = open_sdpa_grad(want[i] ? grads[i] : GradSlot{}, *like[i], scope.stream());
  }
  dnn::sdpa_backward(q.device(), scope.stream(), geom, g[0].target, g[1].target, g[2].target,
                     q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), o.data<bf16>(),
                     grad_out.data<bf16>(), stats.data<float>(), rng);
  for (const SdpaGrad& x : g) finish_sdpa_grad(x, scope.stream());
}

// self_attention's backward: cuDNN writes dq, dk and dv into their windows of qkv's gradient,
// which they cover.
void fused_self_backward(const Tensor& grad_out, const std::vector<Tensor>& s,
                         const dnn::SdpaGeom& geom, std::span<GradSlot> grads) {
  const char* op = "self_attention_backward";
  const Tensor &qkv = s[0], &o = s[1], &stats = s[2];
  const std::int64_t* rng = s.size() > 3 ? rng_words(s[3]) : nullptr;
  check_inputs(op, {{"grad_out", &grad_out}, {"qkv", &qkv}, {"output", &o}}, Bf16::kCuda);
  check_same_shape(op, {"grad_out", &grad_out}, {"output", &o});
  if (!check_slot(op, "grad_qkv", grads[0], qkv)) return;
  CudaScope scope(qkv.device());
  scope.read({&grad_out, &qkv, &o, &stats});
  if (rng) scope.read({&s[3]});
  const SdpaGrad g = open_sdpa_grad(grads[0], qkv, scope.stream());
  const std::int64_t window = geom.heads * geom.d;
  const bf16* x = qkv.data<bf16>();
  dnn::sdpa_backward(qkv.device(), scope.stream(), geom, g.target, g.target + window,
                     g.target + 2 * window, x, x + window, x + 2 * window, o.data<bf16>(),
                     grad_out.data<bf16>(), stats.data<float>(), rng);
  finish_sdpa_grad(g, scope.stream());
}

// The fused forward of `geom` from q, k and v (pointers into `like`'s device): the output of
// `out_shape`, the softmax statistics and — dropping — the generator's seed and offset as the
// draw found them (the offset then advanced past it, as dropout's own).
struct FusedForward {
  Tensor out, stats, rng;
};
FusedForward fused_forward(const dnn::SdpaGeom& geom, const Shape& out_shape, const Tensor& like,
                           const bf16* q, const bf16* k, const bf16* v,
                           const AttentionOptions& options, CudaScope& scope) {
  FusedForward f;
  f.out = Tensor::empty(out_shape, {DType::kBFloat16, like.device()});
  f.stats = Tensor::empty({geom.n, geom.tq}, {DType::kFloat32, like.device()});
  if (geom.dropout > 0) {
    const Tensor& state = options.generator->state();
    state.storage()->sync_for_write(scope.stream());
    f.rng = Tensor::empty({4}, {DType::kInt32, like.device()});
    GW_CUDA_CHECK(cudaMemcpyAsync(f.rng.raw_data(), state.raw_data(), f.rng.nbytes(),
                                  cudaMemcpyDeviceToDevice, scope.stream()));
    kernels::advance_offset(state.data<std::int32_t>(), geom.n * geom.tq * geom.tk,
                            scope.stream());
    state.bump_version();
  }
  dnn::sdpa_forward(like.device(), scope.stream(), geom, f.out.data<bf16>(),
                    f.stats.data<float>(), q, k, v, f.rng.defined() ? rng_words(f.rng) : nullptr);
  return f;
}

double fused_backward_flops(const dnn::SdpaGeom& geom) {
  return (geom.causal ? 2.0 : 4.0) * 2.0 * static_cast<double>(geom.n) *
         static_cast<double>(geom.tq) * static_cast<double>(geom.tk) *
         static_cast<double>(geom.d + geom.dv) / 2.0;
}

// The fused op on [n, T, e] tensors: one recorded node, its backward cuDNN's.
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionDims& d,
                       const AttentionOptions& options) {
  const char* op = "scaled_dot_product_attention";
  const dnn::SdpaGeom geom = sdpa_geom(d, options);
  FusedForward f;
  {
    CudaScope scope(q.device());
    scope.read({&q, &k, &v});
    f = fused_forward(geom, {d.n, d.tq, d.dv}, q, q.data<bf16>(), k.data<bf16>(), v.data<bf16>(),
                      options, scope);
  }
  if (needs_grad({&q, &k, &v})) {
    std::vector<SavedTensor> saved{save("q", q), save("k", k), save("v", v),
                                   save("output", f.out), save("statistics", f.stats)};
    if (f.rng.defined()) saved.push_back(save("dropout_seed_offset", f.rng));
    record(op, f.out, {&q, &k, &v}, std::move(saved),
           [geom](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             fused_backward(g, s, geom, grads);
           },
           {NodeAttribute::integer(geom.causal ? 1 : 0),
            NodeAttribute::number(static_cast<double>(geom.scale)),
            NodeAttribute::number(static_cast<double>(geom.dropout))});
    f.out.grad_fn()->set_backward_flops(fused_backward_flops(geom));
  }
  return f.out;
}

// self_attention fused: cuDNN reads q, k and v in their windows of qkv and writes the heads
// merged; one recorded node (its seq and heads among its attributes: the same shapes with other
// values are another computation, Note [Node attributes]).
Tensor fused_self_attention(const Tensor& qkv, const SelfAttentionDims& d,
                            const AttentionOptions& options) {
  const char* op = "self_attention";
  const dnn::SdpaGeom geom = self_sdpa_geom(d, options);
  FusedForward f;
  {
    CudaScope scope(qkv.device());
    scope.read({&qkv});
    const bf16* x = qkv.data<bf16>();
    f = fused_forward(geom, d.a.out_shape, qkv, x, x + d.dim, x + 2 * d.dim, options, scope);
  }
  if (needs_grad({&qkv})) {
    std::vector<SavedTensor> saved{save("qkv", qkv), save("output", f.out),
                                   save("statistics", f.stats)};
    if (f.rng.defined()) saved.push_back(save("dropout_seed_offset", f.rng));
    record(op, f.out, {&qkv}, std::move(saved),
           [geom](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             fused_self_backward(g, s, geom, grads);
           },
           {NodeAttribute::integer(geom.causal ? 1 : 0),
            NodeAttribute::number(static_cast<double>(geom.scale)),
            NodeAttribute::number(static_cast<double>(geom.dropout)),
            NodeAttribute::integer(d.seq), NodeAttribute::integer(d.heads)});
    f.out.grad_fn()->set_backward_flops(fused_backward_flops(geom));
  }
  return f.out;
}
#endif

}  // namespace

AttentionPath attention_path(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& options) {
  const AttentionDims d = check_attention("attention_path", q, k, v, options);
  return choose_path(q, sdpa_geom(d, options));
}

AttentionPath self_attention_path(const Tensor& qkv, std::int64_t seq, std::int64_t heads,
                                  const AttentionOptions& options) {
  const SelfAttentionDims d = check_self_attention("self_attention_path", qkv, seq, heads, options);
  const AttentionPath p = choose_path(qkv, self_sdpa_geom(d, options));
  if (p.fused) return p;
  return {false, p.reason + " (split_heads, scaled_dot_product_attention, the heads merged)"};
}

Tensor self_attention(const Tensor& qkv, std::int64_t seq, std::int64_t heads,
                      const AttentionOptions& options) {
  // Note [Autocast]: the products in bfloat16, qkv cast once.
  if (Tensor qkv16 = qkv; autocast_matrix_operands({&qkv16})) {
    return self_attention(qkv16, seq, heads, options);
  }
  const char* op = "self_attention";
  detail::NvtxRange range(op);
  const SelfAttentionDims d = check_self_attention(op, qkv, seq, heads, options);
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
  if (choose_path(qkv, self_sdpa_geom(d, options)).fused) {
    return fused_self_attention(qkv, d, options);
  }
#endif
  const Tensor q = split_heads(qkv, seq, heads, 0, d.dim),
               k = split_heads(qkv, seq, heads, d.dim, d.dim),
               v = split_heads(qkv, seq, heads, 2 * d.dim, d.dim);
  const Tensor att = scaled_dot_product_attention(q, k, v, options);
  return reshape(transpose(reshape(att, {d.batch, heads, seq, d.a.d}), 1, 2), d.a.out_shape);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  // Note [Autocast]: the products in bfloat16, q, k and v cast once.
  if (Tensor q16 = q, k16 = k, v16 = v; autocast_matrix_operands({&q16, &k16, &v16})) {
    return scaled_dot_product_attention(q16, k16, v16, options);
  }
  const char* op = "scaled_dot_product_attention";
  detail::NvtxRange range(op);
  const AttentionDims d = check_attention(op, q, k, v, options);
  // [..., T, e] as [n, T, e] (a 3-d tensor as it is: no reshape recorded).
  const auto batched = [&](const Tensor& t) {
    return t.dim() == 3 ? t : reshape(t, {d.n, t.size(-2), t.size(-1)});
  };
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
  if (choose_path(q, sdpa_geom(d, options)).fused) {
    const Tensor out = fused_attention(batched(q), batched(k), batched(v), d, options);
    return q.dim() == 3 ? out : reshape(out, d.out_shape);
  }
#endif
  const double scale = attention_scale(options, d);
  const Tensor scores = bmm(batched(q), batched(k), /*trans_a=*/false, /*trans_b=*/true, scale);
  Tensor p = options.causal ? causal_softmax(scores) : softmax(scores);
  if (options.dropout > 0) p = dropout(p, options.dropout, *options.generator);
  const Tensor out = bmm(p, batched(v));
  return q.dim() == 3 ? out : reshape(out, d.out_shape);
}

}  // namespace graphward
