// scaled_dot_product_attention: fused through cuDNN (Note [Fused attention], runtime/dnn.h), or
// composed of recorded ops (ops.h): bmm, softmax or causal_softmax, dropout, bmm.
#include <cmath>

#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "ops/ops_common.h"
#include "runtime/dnn.h"
#include "runtime/generator.h"
#include "runtime/nvtx.h"
#include "tape/autograd.h"

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
  if (o.scale) check_finite_scalar(op, *o.scale, q);
  GW_CHECK(std::isfinite(o.dropout) && o.dropout >= 0 && o.dropout < 1, op, ": dropout is ",
           o.dropout, "; expected a probability of dropping in [0, 1)");
  GW_CHECK(o.dropout == 0 || o.generator != nullptr, op, ": dropout is ", o.dropout,
           " and no generator is given; expected AttentionOptions::generator where dropout > 0");
  GW_CHECK(o.dropout == 0 || o.generator->device() == q.device(), op,
           ": the dropout's generator is on ", o.generator->device().str(), " and q on ",
           q.device().str(), "; expected one device");
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

// The path for checked arguments (attention_path's contract).
AttentionPath choose_path(const Tensor& q, const AttentionDims& d, const AttentionOptions& o) {
  if (!q.is_cuda()) return {false, "composed: the CPU backend"};
  if (q.dtype() != DType::kBFloat16) {
    return {false, std::string("composed: ") + dtype_name(q.dtype()) +
                       " (cuDNN's fused attention takes bfloat16)"};
  }
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
  CudaScope scope(q.device());
  std::string why;
  if (!dnn::sdpa_supported(q.device(), scope.stream(), sdpa_geom(d, o), &why)) {
    return {false, "composed: cuDNN refuses the shape: " + why};
  }
  return {true, "fused: cuDNN SDPA"};
#else
  (void)d;
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
// copy (runtime/generator.h: the seed's words, then the offset's, low first).
const std::int64_t* rng_words(const Tensor& rng) {
  return static_cast<const std::int64_t*>(rng.raw_data());
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
  for (const SdpaGrad& x : g) {
    if (!x.accumulate) continue;
    bf16* dst = x.slot.tensor->data<bf16>();
    const std::int64_t n = x.scratch.numel();
    kernels::binary_forward(kernels::BinaryOp::kAdd, dst, static_cast<const bf16*>(dst), n,
                            static_cast<const bf16*>(x.scratch.data<bf16>()), n, n,
                            scope.stream());
  }
}

// The fused op on [n, T, e] tensors: one recorded node, its backward cuDNN's.
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionDims& d,
                       const AttentionOptions& options) {
  const char* op = "scaled_dot_product_attention";
  const dnn::SdpaGeom geom = sdpa_geom(d, options);
  Tensor out, stats, rng;
  {
    CudaScope scope(q.device());
    scope.read({&q, &k, &v});
    out = Tensor::empty({d.n, d.tq, d.dv}, {DType::kBFloat16, q.device()});
    stats = Tensor::empty({d.n, d.tq}, {DType::kFloat32, q.device()});
    if (geom.dropout > 0) {
      // The generator's seed and offset as this draw finds them, kept for the backward; then the
      // offset advanced past the draw (one number per attention weight), as dropout's own.
      const Tensor& state = options.generator->state();
      state.storage()->sync_for_write(scope.stream());
      rng = Tensor::empty({4}, {DType::kInt32, q.device()});
      GW_CUDA_CHECK(cudaMemcpyAsync(rng.raw_data(), state.raw_data(), rng.nbytes(),
                                    cudaMemcpyDeviceToDevice, scope.stream()));
      kernels::advance_offset(state.data<std::int32_t>(), d.n * d.tq * d.tk, scope.stream());
      state.bump_version();
    }
    dnn::sdpa_forward(q.device(), scope.stream(), geom, out.data<bf16>(), stats.data<float>(),
                      q.data<bf16>(), k.data<bf16>(), v.data<bf16>(),
                      rng.defined() ? rng_words(rng) : nullptr);
  }
  if (needs_grad({&q, &k, &v})) {
    std::vector<SavedTensor> saved{save("q", q), save("k", k), save("v", v),
                                   save("output", out), save("statistics", stats)};
    if (rng.defined()) saved.push_back(save("dropout_seed_offset", rng));
    record(op, out, {&q, &k, &v}, std::move(saved),
           [geom](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             fused_backward(g, s, geom, grads);
           },
           {NodeAttribute::integer(geom.causal ? 1 : 0),
            NodeAttribute::number(static_cast<double>(geom.scale)),
            NodeAttribute::number(static_cast<double>(geom.dropout))});
    out.grad_fn()->set_backward_flops(
        (geom.causal ? 2.0 : 4.0) * 2.0 * static_cast<double>(d.n) * static_cast<double>(d.tq) *
        static_cast<double>(d.tk) * static_cast<double>(d.d + d.dv) / 2.0);
  }
  return out;
}
#endif

}  // namespace

AttentionPath attention_path(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& options) {
  const AttentionDims d = check_attention("attention_path", q, k, v, options);
  return choose_path(q, d, options);
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
  if (choose_path(q, d, options).fused) {
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
