// dropout with a device-held generator (runtime/generator.h, kernels/dropout.h).
#include <cmath>

#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "ops/ops_common.h"
#include "runtime/generator.h"
#include "runtime/nvtx.h"
#include "tape/autograd.h"

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

Tensor dropout(const Tensor& x, double p, Generator& gen) {
  const char* op = "dropout";
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}});
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
    mask = new_output(x.shape(), x);
    k::dropout_forward(y.data<float>(), mask.data<float>(), x.data<float>(),
                       state.data<std::int32_t>(), n, static_cast<float>(p), scope.stream());
    state.bump_version();
#endif
  } else {
    y = new_output(x.shape(), x);
    mask = new_output(x.shape(), x);
    dispatch_cpu(x.dtype(), [&]<class T>() {
      k::cpu::dropout_forward<T>(ptr<T>(y), ptr<T>(mask), ptr<T>(x), state.data<std::int32_t>(), n,
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
  check_inputs(op, {{"grad_out", &grad_out}, {"mask", &mask}});
  check_same_shape(op, {"grad_out", &grad_out}, {"mask", &mask});
  if (!check_slot(op, "grad_x", grad_x, mask)) return;
  const std::int64_t n = mask.numel();
  if (mask.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(mask.device());
    scope.read({&grad_out, &mask});
    const bool acc = open_slot(grad_x, mask, scope.stream());
    k::mul_backward(grad_x.tensor->data<float>(), grad_out.data<float>(), mask.data<float>(), n, n,
                    acc, scope.stream());
    return;
#endif
  }
  const bool acc = open_slot(grad_x, mask, nullptr);
  dispatch_cpu(mask.dtype(), [&]<class T>() {
    k::cpu::mul_backward<T>(slot_ptr<T>(grad_x), ptr<T>(grad_out), ptr<T>(mask), n, n, acc);
  });
}

}  // namespace graphward
