// dropout with a device-held generator (engine/runtime/generator.h, kernels/dropout.h).
#include <cmath>

#include "graphward/engine/ops/ops_common.h"
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
namespace k = kernels;

Generator::Generator(Device device, std::uint64_t seed) : seed_(seed) {
  const std::vector<std::int32_t> words{
      static_cast<std::int32_t>(static_cast<std::uint32_t>(seed)),
      static_cast<std::int32_t>(static_cast<std::uint32_t>(seed >> 32)), 0, 0};
  state_ = from_vector(words, {4}, device);
}

std::uint64_t Generator::offset() const {
  const std::vector<std::int32_t> w = state_.to_vector<std::int32_t>();
  return static_cast<std::uint64_t>(static_cast<std::uint32_t>(w[2])) |
         (static_cast<std::uint64_t>(static_cast<std::uint32_t>(w[3])) << 32);
}

namespace {
// The mask of a dropout of x: x's dtype, float32 for bfloat16 x (its kept elements' 1/(1 − p)
// rounded to bfloat16 would scale every gradient wrong by up to 2^-9).
Tensor new_mask(const Tensor& x) {
  return Tensor::empty(x.shape(), {statistics_dtype(x.dtype()), x.device()});
}
}  // namespace

Tensor dropout(const Tensor& x, double p, Generator& gen) {
  const char* op = "dropout";
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  GW_CHECK(std::isfinite(p) && p >= 0 && p < 1, op, ": p is ", p,
           "; expected a probability of dropping in [0, 1)");
  GW_CHECK(gen.device() == x.device(), op, ": the generator is on ", gen.device().str(),
           " and x on ", x.device().str(), "; expected one device");
  const std::int64_t n = x.numel();
  Tensor y, mask;
  const Tensor& state = gen.state();
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(x.device());
    scope.read({&x});
    state.storage()->sync_for_write(scope.stream());
    y = new_output(x.shape(), x);
    mask = new_mask(x);
    dispatch_cuda(x.dtype(), [&]<class T>() {
      k::dropout_forward(ptr<T>(y), mask.data<float>(), ptr<T>(x), state.data<std::int32_t>(), n,
                         static_cast<float>(p), scope.stream());
    });
    state.bump_version();
#endif
  } else {
    y = new_output(x.shape(), x);
    mask = new_mask(x);
    dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
      k::cpu::dropout_forward<T>(d.out(y), d.out(mask), d.in(x), state.data<std::int32_t>(), n,
                                 static_cast<float>(p));
    });
    state.bump_version();
  }
  if (needs_grad({&x})) {
    record(op, y, {&x}, {save("mask", mask)},
           [](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             dropout_backward(g, s[0], grads[0]);
           });
  }
  return y;
}

void dropout_backward(const Tensor& grad_out, const Tensor& mask, GradSlot grad_x) {
  const char* op = "dropout_backward";
  check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  check_inputs(op, {{"mask", &mask}});
  GW_CHECK(mask.dtype() == statistics_dtype(grad_out.dtype()) &&
               mask.device() == grad_out.device(),
           op, ": mask is ", mask.str(), "; expected ", dtype_name(statistics_dtype(grad_out.dtype())),
           " on ", grad_out.device().str(), " (the mask's dtype for grad_out ", grad_out.str(), ")");
  check_same_shape(op, {"grad_out", &grad_out}, {"mask", &mask});
  if (!check_slot(op, "grad_x", grad_x, grad_out)) return;
  const std::int64_t n = mask.numel();
  if (mask.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(mask.device());
    scope.read({&grad_out, &mask});
    const bool acc = open_slot(grad_x, grad_out, scope.stream());
    if (grad_out.dtype() == DType::kBFloat16) {
      k::dropout_backward(slot_ptr<bf16>(grad_x), ptr<bf16>(grad_out), mask.data<float>(), n, acc,
                          scope.stream());
    } else {
      k::mul_backward(grad_x.tensor->data<float>(), grad_out.data<float>(), mask.data<float>(), n,
                      n, acc, scope.stream());
    }
    return;
#endif
  }
  const bool acc = open_slot(grad_x, grad_out, nullptr);
  dispatch_cpu_data(grad_out.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::mul_backward<T>(slot_out(d, grad_x, acc), d.in(grad_out), d.in(mask), n, n, acc);
  });
}

}  // namespace graphward
