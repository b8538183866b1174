// bmm: batched matrix products, one cuBLASLt launch on CUDA (engine/runtime/blas.h gemm_batched), the
// reference on the CPU.
#include <optional>

#include "graphward/engine/ops/autocast.h"
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/gemm.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {
struct BmmDims {
  std::int64_t batch, m, k, n;
};
BmmDims check_bmm(const char* op, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_inputs(op, {{"a", &a}, {"b", &b}}, Bf16::kEverywhere);
  check_dim(op, {"a", &a}, 3);
  check_dim(op, {"b", &b}, 3);
  GW_CHECK(a.size(0) == b.size(0), op, ": a is ", shape_str(a.shape()), " and b is ",
           shape_str(b.shape()), "; expected one batch size (dimension 0)");
  const std::int64_t m = ta ? a.size(2) : a.size(1), ka = ta ? a.size(1) : a.size(2);
  const std::int64_t kb = tb ? b.size(2) : b.size(1), n = tb ? b.size(1) : b.size(2);
  GW_CHECK(ka == kb, op, ": inner dimensions differ: op(a) is [", m, ", ", ka, "] and op(b) is [",
           kb, ", ", n, "] (a ", shape_str(a.shape()), ta ? " transposed" : "", ", b ",
           shape_str(b.shape()), tb ? " transposed" : "", "); expected equal inner dimensions");
  return {a.size(0), m, ka, n};
}

// c[i] (=|+=) alpha·op(x[i])·op(y[i]) for every matrix i of the batch; `stream`: the CUDA op's
// (unused on the CPU). alpha is rounded to the element type on both backends (float32 for
// bfloat16 storage).
void batched([[maybe_unused]] cudaStream_t stream, bool tx, bool ty, std::int64_t batch,
             std::int64_t m, std::int64_t n, std::int64_t kk, double alpha, const Tensor& x,
             const Tensor& y, bool accumulate, const Tensor& c) {
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    dispatch_cuda(x.dtype(), [&]<class T>() {
      gemm_batched(x.device(), stream, tx, ty, m, n, kk, batch, static_cast<float>(alpha),
                   ptr<T>(x), ptr<T>(y), accumulate ? 1.f : 0.f, ptr<T>(c));
    });
    return;
#endif
  }
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    T* out = accumulate ? d.inout(c) : d.out(c);
    k::cpu::gemm_batched<T>(tx, ty, m, n, kk, batch, static_cast<T>(alpha), d.in(x), d.in(y),
                            accumulate ? T(1) : T(0), out);
  });
}
}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  if (Tensor a16 = a, b16 = b; autocast_matrix_operands({&a16, &b16})) {  // Note [Autocast]
    return bmm(a16, b16, trans_a, trans_b, alpha);
  }
  const char* op = "bmm";
  detail::NvtxRange range(op);
  const BmmDims d = check_bmm(op, a, b, trans_a, trans_b);
  check_finite_scalar(op, alpha, a);
  Tensor c;
  if (a.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(a.device());
    scope.read({&a, &b});
    c = new_output({d.batch, d.m, d.n}, a);
    batched(scope.stream(), trans_a, trans_b, d.batch, d.m, d.n, d.k, alpha, a, b, false, c);
#endif
  } else {
    c = new_output({d.batch, d.m, d.n}, a);
    batched(nullptr, trans_a, trans_b, d.batch, d.m, d.n, d.k, alpha, a, b, false, c);
  }
  if (needs_grad({&a, &b})) {
    record(op, c, {&a, &b}, {save("a", a), save("b", b)},
           [trans_a, trans_b, alpha](const Tensor& g, const std::vector<Tensor>& s,
                                     std::span<GradSlot> grads) {
             bmm_backward(g, s[0], s[1], trans_a, trans_b, grads[0], grads[1], alpha);
           },
           // Note [Node attributes]: the transposes and the scale.
           {NodeAttribute::integer(trans_a), NodeAttribute::integer(trans_b),
            NodeAttribute::number(alpha)});
    c.grad_fn()->set_backward_flops(4.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) *
                                    static_cast<double>(d.n) * static_cast<double>(d.k));
  }
  return c;
}

void bmm_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, bool trans_a,
                  bool trans_b, GradSlot grad_a, GradSlot grad_b, double alpha) {
  const char* op = "bmm_backward";
  const BmmDims d = check_bmm(op, a, b, trans_a, trans_b);
  check_inputs(op, {{"a", &a}, {"grad_out", &grad_out}}, Bf16::kEverywhere);
  check_finite_scalar(op, alpha, a);
  GW_CHECK(grad_out.shape() == Shape({d.batch, d.m, d.n}), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ",
           shape_str({d.batch, d.m, d.n}));
  const bool want_a = check_slot(op, "grad_a", grad_a, a);
  const bool want_b = check_slot(op, "grad_b", grad_b, b);
  cudaStream_t stream = nullptr;
#if GRAPHWARD_HAS_CUDA
  std::optional<CudaScope> scope;
  if (a.is_cuda()) {
    scope.emplace(a.device());
    scope->read({&grad_out, &a, &b});
    stream = scope->stream();
  }
#endif
  // C = alpha·op(A)·op(B). As stored: dA = alpha·dC·op(B)ᵀ (A plain) or alpha·op(B)·dCᵀ (A
  // transposed); dB = alpha·op(A)ᵀ·dC (B plain) or alpha·dCᵀ·op(A) (B transposed).
  if (want_a) {
    const bool acc = open_slot(grad_a, a, stream);
    if (!trans_a) {
      batched(stream, false, !trans_b, d.batch, d.m, d.k, d.n, alpha, grad_out, b, acc,
              *grad_a.tensor);
    } else {
      batched(stream, trans_b, true, d.batch, d.k, d.m, d.n, alpha, b, grad_out, acc,
              *grad_a.tensor);
    }
  }
  if (want_b) {
    const bool acc = open_slot(grad_b, b, stream);
    if (!trans_b) {
      batched(stream, !trans_a, false, d.batch, d.k, d.n, d.m, alpha, a, grad_out, acc,
              *grad_b.tensor);
    } else {
      batched(stream, true, trans_a, d.batch, d.n, d.k, d.m, alpha, grad_out, a, acc,
              *grad_b.tensor);
    }
  }
}

}  // namespace graphward
