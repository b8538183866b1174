// scaled_dot_product_attention composed of recorded ops (ops.h): bmm, softmax or causal_softmax,
// dropout, bmm.
#include <cmath>

#include "ops/autocast.h"
#include "ops/ops.h"
#include "ops/ops_common.h"
#include "runtime/generator.h"
#include "runtime/nvtx.h"

namespace graphward {
using namespace ops_detail;

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

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  if (autocast_enabled()) {  // Note [Autocast]: the products in bfloat16, q, k and v cast once
    const Tensor q16 = autocast_matrix_operand(q), k16 = autocast_matrix_operand(k),
                 v16 = autocast_matrix_operand(v);
    if (q16.dtype() != q.dtype() || k16.dtype() != k.dtype() || v16.dtype() != v.dtype()) {
      return scaled_dot_product_attention(q16, k16, v16, options);
    }
  }
  const char* op = "scaled_dot_product_attention";
  detail::NvtxRange range(op);
  const AttentionDims d = check_attention(op, q, k, v, options);
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(d.d));
  // [..., T, e] as [n, T, e] (a 3-d tensor as it is: no reshape recorded).
  const auto batched = [&](const Tensor& t) {
    return t.dim() == 3 ? t : reshape(t, {d.n, t.size(-2), t.size(-1)});
  };
  const Tensor scores = bmm(batched(q), batched(k), /*trans_a=*/false, /*trans_b=*/true, scale);
  Tensor p = options.causal ? causal_softmax(scores) : softmax(scores);
  if (options.dropout > 0) p = dropout(p, options.dropout, *options.generator);
  const Tensor out = bmm(p, batched(v));
  return q.dim() == 3 ? out : reshape(out, d.out_shape);
}

}  // namespace graphward
