#pragma once
// Differentiable ops on tensors: each op's forward and backward are declared together.
//
// Forward: inputs must share one device and one dtype; CUDA ops are float32 only, the CPU backend
// also runs float64 (for finite-difference checks). int32 tensors are indices, taken only where
// an op says so (cross_entropy's targets, embedding's ids) and never differentiated. A CUDA op
// runs on the calling thread's current stream for its device (rule [current stream]) after waiting
// for inputs produced on other streams (rule [read after write]). Every check happens before any
// memory is allocated or written: a bad call throws a graphward::Error naming the op, what it got
// and what it expected, and changes nothing.
//
// Backward: gradients go into GradSlots (one per input). A slot with a null `tensor` is not
// wanted and skipped. A slot whose tensor is undefined receives a new tensor, written (=). A slot
// holding a tensor must match the input's shape, dtype and device; it is overwritten (=) or, with
// `accumulate`, added to (+=), and its version is bumped. An undefined slot with `may_share` may
// receive grad_out itself instead of a copy where the gradient equals it (add's, sub's first
// operand): the caller promises that nothing writes the slot's tensor in place afterwards, or
// that nothing else can see grad_out once the op is done (the backward executor's slot that later
// gradients are added into, given a gradient only it holds: engine/backward/eager_executor.cpp). An
// activation's backward given such a slot and a grad_out that is the only handle on its storage
// (Tensor::is_unique) computes its gradient in place, into grad_out's memory, and stores that.
//
// Broadcasting (add, sub, mul): the operands have the same shape, or one of them is a row — shape
// [n] or [1, n] — and the other has last dimension n: the row is repeated over the other's rows;
// or one's shape is the other's trailing dimensions ([T, D] with [B, T, D]): it is repeated over
// the leading ones. The result has the larger shape; a repeated operand's gradient is summed over
// its repeats.

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "graphward/engine/runtime/tensor.h"
#include "graphward/engine/tape/grad_slot.h"

namespace graphward {

// ---- linear algebra -----------------------------------------------------------------------------
// a [m, k] · b [k, n] -> [m, n]
Tensor matmul(const Tensor& a, const Tensor& b);
void matmul_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                     GradSlot grad_b);

// Batched: a [B, m, k] and b [B, k, n] -> [B, m, n], c[i] = alpha · op(a[i]) · op(b[i]), where op
// transposes the last two dimensions when asked (trans_a: a is [B, k, m]; trans_b: b is [B, n, k]),
// without moving data: one batched GEMM, the scale included (attention's scores Q·Kᵀ/√d are
// bmm(q, k, false, true, 1/√d): no pass over the scores to scale them, forward or backward).
// alpha must be finite.
Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
           double alpha = 1.0);
void bmm_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, bool trans_a,
                  bool trans_b, GradSlot grad_a, GradSlot grad_b, double alpha = 1.0);

// x [batch, in] · weightᵀ (weight [out, in]) + bias [out] -> [batch, out]; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
void linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, GradSlot grad_x,
                     GradSlot grad_weight, GradSlot grad_bias = {});

// A linear layer with its activation fused (linear(x, weight, bias, act)). On CUDA the GEMM, the
// bias and the activation are one cuBLASLt kernel (its epilogue) where cuBLASLt offers one for the
// shape — GELU needs `out` to be a multiple of 8 — else the same three steps as separate kernels.
// GELU is the tanh approximation (gelu() below).
// (Activation: engine/tape/grad_slot.h.)
// act(x · weightᵀ + bias); bias may be undefined. Recorded as one node — "linear" (kNone),
// "linear_relu" or "linear_gelu" — saving x, weight and, for its backward, the output (ReLU) or
// the pre-activation x · weightᵀ + bias (GELU).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);
// Note [Backward epilogue fusion]
// A linear+activation layer P (linear(x, W, b, kRelu | kGelu)) whose output feeds one linear
// layer C alone gets its activation backward from C: C's input-gradient GEMM dy·W_C applies
// act'(·) in its epilogue (cuBLASLt's DRELU / DGELU), and P's own backward starts from the
// pre-activation gradient — its weight-gradient GEMM still writes its bias gradient (BGRADB), so
// no temporary and no activation kernel of graphward's own remain. The backward plan decides
// (PlanOptions::fuse_activation_epilogues, on by default: both layers on one stream, P's output
// gradient C's alone) and hands C the epilogue (GradSlot::epilogue). ReLU's derivative is read
// from the bit mask cuBLASLt wrote in P's forward (RELU_AUX), GELU's from its pre-activation.
// Where cuBLASLt declines a shape (or on the CPU) C runs the same arithmetic as two kernels, so
// the result never depends on it. cuBLASLt itself runs these epilogues as two kernels (a split-K
// GEMM and its reduction, or a GEMM, then an epilogue kernel), so the kernel count does not drop;
// what it saves, and the variants measured and rejected (the bias gradient in the same epilogue,
// the split removed from these GEMMs): docs/DECISIONS.md, "a linear+activation layer's gradient
// rides in the next layer's GEMM".
// The same machinery serves convolutions: a conv2d_relu whose output feeds one max_pool2d or
// avg_pool2d alone leaves its ReLU's backward to the pooling, whose backward then passes a
// gradient only where the ReLU's output is positive — on CUDA one kernel of graphward's own
// (kernels::pool2d_backward_relu) in place of cuDNN's pooling backward and a ReLU kernel;
// bitwise those two but for a window's equal positive maxima (cuDNN may pick another), the order
// of the sums where windows overlap, and average windows whose area is not a power of two.
// DECISIONS: "a convolution's ReLU backward in the pooling's".
// (GradEpilogue, what C is handed: engine/tape/grad_slot.h.)

// `saved`: the output (kRelu) or the pre-activation (kGelu); ignored for kNone. The activation's
// gradient dz = grad_out · act'(·) is formed once per call, then as linear_backward(dz, ...).
void linear_act_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                         const Tensor& saved, Activation act, GradSlot grad_x, GradSlot grad_weight,
                         GradSlot grad_bias = {});

// ---- elementwise --------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
void add_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                  GradSlot grad_b);
void sub_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                  GradSlot grad_b);
void mul_backward(const Tensor& grad_out, const Tensor& a, const Tensor& b, GradSlot grad_a,
                  GradSlot grad_b);

// With a scalar (which must be finite): a + s, a - s, a * s.
Tensor add(const Tensor& a, double scalar);
Tensor sub(const Tensor& a, double scalar);
Tensor mul(const Tensor& a, double scalar);
// Gradient of y = scale * a + shift: grad_a = scale * grad_out (add/sub: scale = 1; mul: s).
void scale_backward(const Tensor& grad_out, double scale, GradSlot grad_a);

// In place: a += alpha * b (same shape). Bumps a's version. Not recorded: a tensor that requires
// grad may be updated only inside a NoGradGuard scope (an optimizer step).
void add_(const Tensor& a, const Tensor& b, double alpha = 1.0);
// In place: dst = src (same shape, dtype and device), e.g. a data loader's batch into a static
// input slot whose address a captured graph keeps. Bumps dst's version. Not recorded.
void copy_(const Tensor& dst, const Tensor& src);

// Activations; their backward reads the forward's output y (GELU's: its input).
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
void relu_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x);
void tanh_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x);
void sigmoid_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x);
// GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), cuBLASLt's GELU epilogue):
// x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))). Its backward reads the input x.
Tensor gelu(const Tensor& x);
void gelu_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x);

// ---- reductions and losses (results are 0-d tensors, shape []) ---------------------------------
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
void sum_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x);
void mean_backward(const Tensor& grad_out, const Tensor& x, GradSlot grad_x);

// mean((pred - target)²) over all elements; pred and target have the same shape.
Tensor mse_loss(const Tensor& pred, const Tensor& target);
void mse_loss_backward(const Tensor& grad_out, const Tensor& pred, const Tensor& target,
                       GradSlot grad_pred, GradSlot grad_target = {});

// ---- softmax and classification losses (over the last dimension) -----------------------------
// softmax(x) / log_softmax(x) per row of the last dimension; their backward reads the output.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// Causal softmax of attention's scores x [..., Tq, Tk] (at least 2-d): row i of each [Tq, Tk]
// matrix is the softmax of its columns j <= i — a query attends to the keys up to its own
// position, aligned at the top left as PyTorch's is_causal — and 0 at the columns after (masked
// in the kernel, no -inf written or read). Recorded as its own op; its backward is
// softmax_backward's (a 0 of y has a 0 gradient).
Tensor causal_softmax(const Tensor& x);
void softmax_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x);
void log_softmax_backward(const Tensor& grad_out, const Tensor& y, GradSlot grad_x);

// mean over rows of −log softmax(logits)[target]: logits [B, C] (float), targets int32 [B] with
// values in [0, C), on the same device. Fused and numerically stable at any magnitude: one pass
// saves each row's log-sum-exp in two parts, `lse` [B, 2]: the row's maximum m and log Σ exp(x −
// m) (kernels/softmax.h); the backward is (softmax − one-hot) · dloss / B. An out-of-range target
// is refused by name on the CPU; on CUDA (no host read) it makes the loss NaN.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// The same over the first `classes` columns of each row (1 <= classes <= C): the others — a
// vocabulary's padding, as GPT-2's 50304 columns hold 50257 tokens — take no part in the softmax
// and get a zero gradient; targets in [0, classes). Reads the logits in place (no copy of the
// classes' columns).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t classes);
// `classes`: as above; unset, every column.
void cross_entropy_backward(const Tensor& grad_out, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, GradSlot grad_logits,
                            std::optional<std::int64_t> classes = std::nullopt);

// ---- normalization and lookup -----------------------------------------------------------------
// Layer normalization over the last dimension: (x − mean) / √(var + eps) · weight + bias, the
// biased variance; weight and bias [D] (bias may be undefined). Saves x, weight and each row's
// mean and rstd = 1/√(var + eps); deterministic on CUDA.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, GradSlot grad_x,
                         GradSlot grad_weight, GradSlot grad_bias = {});

// The residual add and the layer norm after it, as a pre-norm transformer block writes them:
// sum = x + residual and normed = layer_norm(sum, weight, bias, eps), in one pass over the rows
// (on CUDA one kernel for rows of up to 1024 columns: x and residual read once). The residual has
// x's shape or its trailing dimensions, repeated over the leading ones (a transformer's learned
// positions [T, D] over a batch's embeddings [B, T, D]); sum has x's shape.
// Recorded as the two ops, add then layer_norm: the same values, gradients and bits as
// add(x, residual) followed by layer_norm of it.
struct AddLayerNorm {
  Tensor sum, normed;
};
AddLayerNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                            const Tensor& bias, double eps = 1e-5);

// The rows of `table` [V, D] picked by int32 `ids` (any shape, on the table's device): shape
// ids.shape + [D]. The table's gradient is added row by row (on CUDA with atomics: for repeated
// ids the order of the additions, hence the last bits, may vary run to run). An id outside [0, V)
// is refused by name on the CPU; on CUDA (no host read) it reads a row of NaN.
Tensor embedding(const Tensor& table, const Tensor& ids);
void embedding_backward(const Tensor& grad_out, const Tensor& table, const Tensor& ids,
                        GradSlot grad_table);

// ---- shapes -----------------------------------------------------------------------------------
// The same elements in another shape (same count; one dimension may be -1: inferred). A view: no
// copy, the result shares x's storage (and its version counter), like Tensor::view. Its gradient
// is grad_out in x's shape (shared where the slot allows, else copied or added).
Tensor reshape(const Tensor& x, const Shape& shape);
void reshape_backward(const Tensor& grad_out, const Shape& input_shape, GradSlot grad_x);

// x with dimensions d0 and d1 exchanged (negative counts from the end), as a new tensor (a copy:
// tensors are contiguous). Its backward is the same exchange.
Tensor transpose(const Tensor& x, std::int64_t d0, std::int64_t d1);
void transpose_backward(const Tensor& grad_out, std::int64_t d0, std::int64_t d1, GradSlot grad_x);

// The tensors joined along dimension `dim` (negative counts from the end): every other dimension
// equal. A new tensor; input i's gradient is its window of grad_out.
Tensor concat(const std::vector<Tensor>& xs, std::int64_t dim);
void concat_backward(const Tensor& grad_out, const std::vector<Shape>& input_shapes,
                     std::int64_t dim, std::span<GradSlot> grads);

// Columns [start, start + length) of the last dimension, as a new tensor (a copy); its backward
// puts the gradient in that window (zeros elsewhere, or added there when accumulating).
Tensor narrow(const Tensor& x, std::int64_t start, std::int64_t length);
void narrow_backward(const Tensor& grad_out, const Shape& input_shape, std::int64_t start,
                     std::int64_t length, GradSlot grad_x);

// Attention's heads, in one copy: x [batch · seq, cols] (row b · seq + t: position t of sequence
// b), its columns [start, start + length) split into `heads` heads of length / heads columns, as
// [batch · heads, seq, length / heads] (head h of sequence b: batch entry b · heads + h). The same
// values as reshape(transpose(reshape(narrow(x, start, length), {batch, seq, heads, length /
// heads}), 1, 2), {batch · heads, seq, length / heads}), which copies twice. Q, K and V made by one
// linear are its three windows. Its backward puts the gradient back in the window in one kernel
// (zeros elsewhere, or added there when accumulating).
Tensor split_heads(const Tensor& x, std::int64_t seq, std::int64_t heads, std::int64_t start,
                   std::int64_t length);
void split_heads_backward(const Tensor& grad_out, const Shape& input_shape, std::int64_t seq,
                          std::int64_t heads, std::int64_t start, std::int64_t length,
                          GradSlot grad_x);

// ---- convolution and pooling (NCHW; cuDNN on CUDA) ---------------------------------------------
// Square kernels, strides and padding; dilation 1, one group. Arithmetic is fp32 (no TF32).
struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  // CUDA: only deterministic cuDNN algorithms (the default: a replayed step equals the eager one
  // bitwise, run after run). false allows the fastest, some of which add with atomics (PyTorch's
  // default, torch.backends.cudnn.deterministic = False), at a cost measured in docs/DECISIONS.md,
  // "convolutions deterministic by default".
  bool deterministic = true;
  // kRelu: relu(conv2d(...)) as one op — on CUDA the bias and the ReLU in one pass after cuDNN's
  // convolution instead of cuDNN's bias add and a ReLU apart (bitwise the same), the output saved
  // for the backward. kGelu is refused.
  Activation activation = Activation::kNone;
  // Channels last (NHWC): x [N, H, W, C], weight [K, R, S, C], output [N, OH, OW, K] — the layout
  // cuDNN's tensor-core kernels read without transposing (PyTorch's channels_last memory format,
  // here the tensors' own shapes). What bfloat16 convolutions on Hopper want (docs/DECISIONS.md,
  // "a channels-last convnet in bfloat16").
  bool channels_last = false;
};
// x [N, C, H, W] ⋆ weight [K, C, R, S] (+ bias [K]; may be undefined) -> [N, K, OH, OW] with
// OH = (H + 2·padding − R) / stride + 1 (likewise OW): PyTorch's conv2d (channels last: the
// shapes of Conv2dOptions::channels_last). On CUDA, cuDNN with its algorithms chosen once per
// shape (Note [cuDNN plans] in engine/runtime/dnn.h); saves x and weight (and its output with an
// activation).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Conv2dOptions options = {});
// The convolution's own backward (options.activation must be kNone: a conv2d_relu node applies
// ReLU's backward to grad_out first).
void conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                     Conv2dOptions options, GradSlot grad_x, GradSlot grad_weight,
                     GradSlot grad_bias = {});

struct Pool2dOptions {
  std::int64_t kernel = 2;
  std::int64_t stride = 0;   // 0: the kernel size
  std::int64_t padding = 0;  // at most kernel / 2
  bool channels_last = false;  // x [N, H, W, C] and the output [N, OH, OW, C] (else NCHW)
};
// The maximum of each window (padding never wins); saves x and the output. Its gradient goes to
// each window's maximum (the first one on the CPU; cuDNN's deterministic choice on CUDA: ties, as
// in ReLU-ed inputs, may go to another element of equal value). After a conv2d_relu whose output
// it alone reads, its backward applies the ReLU's too, as avg_pool2d's does (Note [Backward
// epilogue fusion]): grad_x may then carry an epilogue, the ReLU whose output is x.
Tensor max_pool2d(const Tensor& x, Pool2dOptions options = {});
void max_pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& y,
                         Pool2dOptions options, GradSlot grad_x);
// The mean of each window, padding counted as zeros (PyTorch's count_include_pad=True); saves
// nothing.
Tensor avg_pool2d(const Tensor& x, Pool2dOptions options = {});
void avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, Pool2dOptions options,
                         GradSlot grad_x);

// ---- element types ------------------------------------------------------------------------------
// x converted to `dtype` (float32, float64, bfloat16; on CUDA between float32 and bfloat16): a new
// tensor, or x itself when it already has that type. To bfloat16: rounded to nearest, ties to even
// (from float64 through float32). Its gradient is grad_out converted back to x's type.
Tensor cast(const Tensor& x, DType dtype);
void cast_backward(const Tensor& grad_out, DType input_dtype, GradSlot grad_x);

// ---- dropout ----------------------------------------------------------------------------------
// y = x · mask, mask = 1/(1 − p) where a Philox number of `gen` (engine/runtime/generator.h: seed and
// offset on the device, advanced by each call, also inside a replayed CUDA graph) keeps the
// element, else 0. 0 <= p < 1. Saves the mask; its backward is dy · mask.
class Generator;
Tensor dropout(const Tensor& x, double p, Generator& gen);
void dropout_backward(const Tensor& grad_out, const Tensor& mask, GradSlot grad_x);

// ---- attention --------------------------------------------------------------------------------
struct AttentionOptions {
  bool causal = false;  // query i attends to the keys j <= i (causal_softmax)
  // The scores' scale; unset: 1/√d (d: q's last dimension).
  std::optional<double> scale = std::nullopt;
  double dropout = 0.0;            // probability of dropping an attention weight, 0 <= p < 1
  Generator* generator = nullptr;  // the dropout's generator: required where dropout > 0
};
// softmax(q·kᵀ · scale) · v over the last two dimensions, each leading index (batch, head) its own
// attention: q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv], the same leading dimensions (at
// least one) -> [..., Tq, dv]; with `causal`, causal_softmax; with `dropout`, the weights dropped
// (dropout above) before v. bfloat16 on CUDA runs fused, as cuDNN's attention, where the build
// and cuDNN allow (Note [Fused attention], engine/runtime/dnn.h): one op, the scores never materialized,
// its softmax statistics saved; its dropout is cuDNN's, drawn from the same generator (a mask
// equal in distribution to the composed path's, not element by element). Otherwise composed of
// recorded ops — bmm with the scale its alpha, the softmax (the causal mask a causal_softmax),
// dropout, bmm — so its backward is theirs:
// float32 and bfloat16 on CUDA and the CPU, float64 on the CPU; the scores [..., Tq, Tk] are
// materialized and saved.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});
// Which path scaled_dot_product_attention takes for these arguments (as checked there; on CUDA,
// outside a capture, this may build the fused plans), and why: "fused: cuDNN SDPA", or
// "composed: " and the reason (float32, the CPU, a build without cudnn-frontend, or
// cuDNN's own refusal of the shape).
struct AttentionPath {
  bool fused = false;
  std::string reason;
};
AttentionPath attention_path(const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionOptions& options = {});
// Multi-head self-attention of q, k and v made by one linear layer, heads merged: qkv
// [batch · seq, 3 · dim] (row b · seq + t: position t of sequence b; columns [0, dim) its q,
// [dim, 2 · dim) its k, [2 · dim, 3 · dim) its v, each `heads` heads of dim / heads columns side by
// side) -> [batch · seq, dim] (row b · seq + t: each head's output for that position, side by
// side; the layout the output projection takes). The values of split_heads of the three windows,
// scaled_dot_product_attention and the heads merged (reshape(transpose(reshape(out, {batch,
// heads, seq, dim / heads}), 1, 2), {batch · seq, dim})) — which is what it runs, recorded,
// where it does not run fused: fused (bfloat16 on CUDA, as scaled_dot_product_attention), cuDNN
// reads q, k and v in place and writes the merged output, and its backward writes qkv's gradient
// whole: no copies either way. The same options.
Tensor self_attention(const Tensor& qkv, std::int64_t seq, std::int64_t heads,
                      const AttentionOptions& options = {});
// Which path self_attention takes for these arguments, and why (as attention_path).
AttentionPath self_attention_path(const Tensor& qkv, std::int64_t seq, std::int64_t heads,
                                  const AttentionOptions& options = {});

}  // namespace graphward
