#pragma once
// Optimizers whose whole state lives with the parameters, on their device — the step count and the
// learning rate included — so that an optimizer step can be captured into a CUDA graph and
// replayed: nothing is read back to the host, nothing is allocated after construction, and every
// replay advances the device step count (bias corrections and momentum's first step follow it).
// Semantics follow torch.optim.SGD and torch.optim.AdamW (decoupled weight decay), with parameter
// groups for the weight decay (ParamGroup).
//
// Note [Master weights]
// Parameters are float32 (or float64 on the CPU), or all bfloat16. bfloat16 parameters are
// updated through float32 masters the optimizer keeps (made from the parameters' values when it
// is made; master()), with float32 state: each step reads the bfloat16 gradient, updates the
// master in float32 as for a float32 parameter, and writes the parameter as the master rounded to
// nearest even — in the same multi-tensor launch (kernels/optim.h), so a model held in bfloat16
// (llm.c's layout: no cast in the forward) learns at float32's resolution. A bfloat16 parameter
// written other than by the optimizer after it is made is not seen by its master: write the
// master (master(i), in place) and step, or make the optimizer after.
//
// A step runs on the current stream of the parameters' device (rule [current stream]), after the
// streams that wrote the .grads and used the parameters (rule [read after write]); it updates the
// parameters in place, bumping their versions (a tape that saved a parameter refuses its backward
// afterwards, as in PyTorch). Parameters whose .grad is undefined are skipped — in a captured step
// the set must stay the same (make the .grads first: zero_grad() never undefines them). Parameters
// are distinct leaves (checked when the optimizer is made). Calls from several threads run one at
// a time (each takes the optimizer's lock); what a step reads and writes is ordered on the calling
// thread's current stream as above.
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "graphward/base/config.h"

#include "graphward/engine/backward/backward.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/runtime/tensor.h"
#include "graphward/kernels/optim.h"

namespace graphward {

// The learning rate as llm.c and nanoGPT schedule it (Note [Learning-rate schedule],
// kernels/optim.h): linear warm-up over warmup_steps to the optimizer's lr, then a cosine decay to
// final_lr_fraction · lr at total_steps, held after. Computed on the device from each parameter's
// step count at every step, so a captured step replays the schedule with no host work; lr (and
// set_lr) is the peak.
struct LrSchedule {
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  // > warmup_steps
  double final_lr_fraction = 0.0;  // in [0, 1]
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  std::optional<LrSchedule> schedule = std::nullopt;  // unset: lr at every step
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  std::optional<LrSchedule> schedule = std::nullopt;  // unset: lr at every step
};

// Parameters with hyperparameters of their own, as torch.optim's param_groups: the weight decay,
// where the optimizer's is not wanted (biases and layer norms' weights are usually not decayed:
// decay_matrices_only). A group may be empty; the groups together hold at least one parameter,
// each once.
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> weight_decay = std::nullopt;  // unset: the optimizer's
};
// The two groups GPT-2's training makes (nanoGPT, llm.c): the matrices and filters (2-d and up)
// decayed with the optimizer's weight decay, the vectors (biases, norms' weights) and scalars not.
std::vector<ParamGroup> decay_matrices_only(const std::vector<Tensor>& params);

// What SGD and AdamW share: the parameters, the device scalars (lr, step) and zero_grad.
class Optimizer {
 public:
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  virtual ~Optimizer() = default;

  virtual void step() = 0;
  // One step over the parameters `which` (indices into params(), each at most once) alone: each
  // updated and counted as step() would (a parameter's update is its own, Note [Multi-tensor
  // step]). What StepInBackward runs for a bucket of gradients.
  void step_params(const std::vector<std::size_t>& which);
  // Writes zeros into every defined .grad, in place (addresses kept: a captured backward writes
  // the same buffers). On the current stream, ordered after the .grads' other users. A .grad of
  // another shape, dtype or device than its parameter is refused by name, nothing written.
  void zero_grad();
  // The learning rate for the next steps: a stream-ordered write of the device scalar that every
  // step reads (a captured step replayed after it uses the new rate).
  void set_lr(double lr);
  double lr() const { return lr_value_; }
  // The rate a parameter whose step count is `step` is updated with at its next step: lr() where
  // there is no schedule (LrSchedule), else the schedule's value at that count (in double; the
  // update uses it rounded to the parameters' type).
  double lr_at(std::int64_t step) const;
  // Step counts are per parameter, as in PyTorch: a step counts for the parameters it updated
  // (those with a .grad), and AdamW's bias correction follows each parameter's own count, so a
  // parameter that had no gradient for a while (a frozen layer) starts where it left off. Read
  // from the device (synchronizes; not inside a capture): parameter `param`'s count, or the most
  // any parameter took (the number of steps when every step had every gradient).
  std::int64_t steps(std::size_t param) const;
  std::int64_t steps() const;
  // Sets parameter `param`'s step count (resuming from a checkpoint); a stream-ordered write of
  // the device count, as set_lr(). Counts are exact to 2^53.
  void set_steps(std::size_t param, std::int64_t count);
  const std::vector<Tensor>& params() const { return params_; }
  // Parameter `param`'s float32 master where the parameters are bfloat16 (Note [Master weights]),
  // else the parameter itself.
  const Tensor& master(std::size_t param) const;
  // Parameter `param`'s weight decay: its group's, else the optimizer's.
  double weight_decay(std::size_t param) const;
  // What a step reads besides the parameters, their gradients and lr(), by name, for checkpoints:
  // "step" (every parameter's count), each parameter's state ("exp_avg.i" and "exp_avg_sq.i" for
  // AdamW, "momentum_buffer.i" for SGD with momentum) and, for bfloat16 parameters, "master.i".
  // The live tensors: copy_ into them (in place, the addresses a captured step reads kept), and
  // set_lr, restore the optimizer.
  std::vector<std::pair<std::string, Tensor>> state() const;

 protected:
  // The groups' parameters in order, their weight decays checked and kept (weight_decay_).
  Optimizer(const char* name, std::vector<ParamGroup> groups, double lr, double weight_decay,
            const std::optional<LrSchedule>& schedule);
  // One step over the parameters (Note [Multi-tensor step], kernels/optim.h): each parameter with
  // a .grad is ordered after its .grad's, its own and its state's users on the current stream of
  // the parameters' CUDA device and its versions bumped; then all of them are updated and the step
  // counted in one launch_cuda (or update_cpu each, then the count).
  void run_step(const char* what, const std::vector<std::size_t>* which = nullptr);
  // state_[0][i], state_[1][i]: parameter i's state (undefined where an optimizer keeps none),
  // named state_names_[0] and [1] in state().
  std::vector<Tensor> state_[2];
  const char* state_names_[2] = {"state0", "state1"};

  const char* name_;
  std::vector<Tensor> params_;
  Tensor lr_;    // [1], on the parameters' device
  Tensor step_;  // float64 [number of parameters]: each parameter's step count (exact to 2^53)
  DType dtype_ = DType::kFloat32;  // the parameters' math: float32 for bfloat16 parameters
  std::vector<Tensor> masters_;    // bfloat16 parameters' float32 masters (else empty)
  double lr_value_;
  kernels::LrSchedule schedule_;      // total 0: none
  std::vector<double> weight_decay_;  // each parameter's
  Device device_;

 private:
#if GRAPHWARD_HAS_CUDA
  virtual void launch_cuda(const std::vector<kernels::ParamSlice>& slices, unsigned* done,
                           cudaStream_t stream) = 0;
#endif
  virtual void update_cpu(std::size_t i) = 0;

  Tensor done_;  // CUDA: int32 [1], the blocks of a step that finished (Note [Multi-tensor step])
  mutable std::mutex mutex_;
  std::vector<kernels::ParamSlice> slices_;  // the step's, reused
};

class Sgd : public Optimizer {
 public:
  explicit Sgd(std::vector<Tensor> params, SgdOptions options = {});
  explicit Sgd(std::vector<ParamGroup> groups, SgdOptions options = {});
  void step() override;

 private:
#if GRAPHWARD_HAS_CUDA
  void launch_cuda(const std::vector<kernels::ParamSlice>& slices, unsigned* done,
                   cudaStream_t stream) override;
#endif
  void update_cpu(std::size_t i) override;
  kernels::SgdParams hp_;  // state_[0]: the momentum buffers (undefined without momentum)
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  void step() override;

 private:
#if GRAPHWARD_HAS_CUDA
  void launch_cuda(const std::vector<kernels::ParamSlice>& slices, unsigned* done,
                   cudaStream_t stream) override;
#endif
  void update_cpu(std::size_t i) override;
  kernels::AdamWParams hp_;  // state_[0], state_[1]: the first and second moments
};

// Note [Optimizer steps in the backward]
// An optimizer step after the backward waits for the last gradient, though most were final long
// before (the last layers' first). StepInBackward is a GradientReducer (engine/backward/backward.h) handed
// to backward() instead of calling opt.step() after it:
//   backward(loss, {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &in_backward});
// The backward hands it its leaves' gradients in buckets, each as soon as the backward has written
// them all, and it steps those gradients' parameters then, on a stream of its own, while the
// backward goes on: in a captured step (StepGraph) the updates run beside the rest of the backward
// (memory-bound updates under the backward's GEMMs). The parameters come out bitwise as backward()
// then opt.step() leaves them: a parameter's update is its own (Note [Multi-tensor step],
// kernels/optim.h). The backward's plan orders its own work with events (Note [Planned
// synchronization], engine/runtime/memory.h) but not these writes: each step orders itself as any write
// does, after the parameter's readers so far — its layer's input gradient reads it, and that was
// issued before the bucket. A gradient whose parameter is not the optimizer's is left as it is.
// Not with what needs every gradient first (clip_grad_norm), nor with data parallelism (a backward
// has one reducer); and every backward is then a step (accumulate micro-batches without it).
class StepInBackward final : public GradientReducer {
 public:
  // `optimizer` must outlive this. `bucket_bytes`: the gradient bytes a bucket collects before its
  // parameters are stepped (small: about a layer at a time).
  explicit StepInBackward(Optimizer& optimizer, std::size_t bucket_bytes = std::size_t{1} << 20);
  std::size_t bucket_bytes() const override { return bucket_bytes_; }
  cudaStream_t stream() const override;
  // One process: every bucket layout agrees with itself.
  void agree(std::uint64_t, const std::string&, bool) override {}
  // Steps the parameters of `grads` (Optimizer::step_params) on stream().
  void reduce(const std::vector<Tensor>& grads) override;
  // Refuses a backward that accumulates (see above: each backward is then a step, and the .grads
  // it steps would hold more than this backward's gradients).
  double begin_backward(GradWrite grad_write) override;

 private:
  Optimizer& optimizer_;
  std::size_t bucket_bytes_;
  std::optional<Stream> stream_;  // on the parameters' CUDA device; none on the CPU
};

// Scales the .grads of `params` (the defined ones) in place so that their global L2 norm is at
// most max_norm (torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at
// 1). The norm is computed and applied on the device, deterministically, with no host read;
// returns it (before clipping) as a 0-d tensor on the parameters' device.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace graphward
