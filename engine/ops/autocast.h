#pragma once
// Note [Autocast]
// A scope, on the calling thread, under which a forward runs in mixed precision as it does under
// PyTorch's torch.autocast("cuda", torch.bfloat16):
//   * matrix products — linear, matmul, bmm, scaled_dot_product_attention, conv2d — cast their
//     float32 operands to bfloat16 and compute in bfloat16 (products accumulated in float32);
//     their outputs are bfloat16;
//   * a parameter (a leaf that requires grad) is cast once per scope, at its first use: later uses
//     read the same bfloat16 copy. A linear layer records the float32 parameter itself as its
//     input and writes its weight and bias gradients in float32 (the GEMM's and the column sum's
//     float32 sums stored unrounded, no widening kernel); any other op's gradient comes back
//     through the recorded cast into the parameter's .grad (rounded to bfloat16, then widened);
//   * an op given float32 and bfloat16 operands together — add, sub, mul, add_layer_norm,
//     layer_norm with float32 parameters — computes in float32, the bfloat16 ones widened (PyTorch
//     promotes so): a residual stream kept in float32 stays float32. add_layer_norm widens a
//     bfloat16 residual as its kernel reads it and rounds the residual's gradient in the add's
//     backward: one add node, no cast node or kernel either way (the same bits);
//   * the numerically sensitive ops — softmax, log_softmax, the layer norms, cross-entropy, sum,
//     mean, mse_loss — keep float32 math in whatever dtype they are given (bfloat16 storage,
//     float32 statistics; a sum or loss is float32), and every other op runs in its input's dtype;
//   * a layer norm of float32 operands (layer_norm, add_layer_norm's normalized output; not its
//     sum) returns bfloat16: float32 statistics and math, rounded once when stored — the matrix
//     product it feeds would cast it, so the cast and its backward's widening are folded into the
//     layer norm's kernels (bitwise the float32 op and a cast; PyTorch returns float32 here).
// Parameters stay float32 — master weights, which the optimizer updates in float32 — and the
// casts are recorded ops: a captured step replays them with the rest, and its tape signature
// holds them (a step with the scope and one without are different structures). Open the scope
// inside the step (inside the StepScope, or inside a StepGraph's step function), so that each
// step casts its parameters once, after the optimizer's last update. The copies a scope made are
// released when it ends; a parameter written during the scope (its version bumped) is cast anew.
// A scope may be given the parameters up front (Autocast(parameters)): it casts them all at once,
// one launch on CUDA, where lazily each cast is a kernel of its own at its first use.
// float16 is out of scope: it needs loss scaling, which graphward does not do.
#include <cstdint>
#include <vector>

#include "graphward/base/dtype.h"
#include "graphward/engine/runtime/tensor.h"

namespace graphward {

class Autocast {
 public:
  // dtype: the matrix products' (bfloat16, the only one; float16 is refused). enabled = false
  // opens a scope that turns an enclosing one off.
  explicit Autocast(DType dtype = DType::kBFloat16, bool enabled = true);
  // The same, with `parameters` cast now, all of them (on CUDA in one launch per device and 48
  // parameters), each as its first use in the scope would cast it: a step's casts in one kernel
  // instead of one a parameter, at the step's start. Those that are not float32 parameters (a
  // leaf that requires grad) are skipped.
  Autocast(const std::vector<Tensor>& parameters, DType dtype = DType::kBFloat16);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  // Parameters cast so far in this scope (one each, whatever their uses).
  std::size_t parameter_casts() const { return cache_.size(); }
  // Those parameters, in the order of their first use.
  std::vector<Tensor> cast_parameters() const;

 private:
  friend struct AutocastAccess;
  struct Copy {
    Tensor source;  // held: its storage cannot be reused while the copy is cached
    std::uint64_t version;
    bool recorded;  // cast with grad mode on (the copy has a grad_fn)
    Tensor copy;
  };
  DType dtype_;
  bool enabled_;
  Autocast* previous_;
  std::vector<Copy> cache_;
};

// Whether an enabled Autocast scope is open on this thread.
bool autocast_enabled();

namespace ops_detail {
// Inside an enabled scope, a matrix product's float32 operands as bfloat16, in place (a
// parameter's cached copy, anything else cast); whether any changed (the op then runs on the
// bfloat16 operands). Undefined tensors, other dtypes and calls outside a scope change nothing.
bool autocast_matrix_operands(std::initializer_list<Tensor*> operands);
// Inside an enabled scope, where `operands` hold float32 and bfloat16 tensors together, the
// bfloat16 ones widened to float32 in place (casts recorded); nothing otherwise. Undefined
// tensors are skipped.
void autocast_promote(std::initializer_list<Tensor*> operands);
// cast(x, bfloat16) of each x, recorded as cast records it; the float32 CUDA ones of a device in
// one launch per kernels::kCastBatchMax (kernels/cast.h). (engine/ops/ops_cast.cpp)
std::vector<Tensor> cast_to_bf16_batched(const std::vector<Tensor>& xs);
}  // namespace ops_detail

}  // namespace graphward
