#pragma once
// What the example models share: the three training modes, a trainer over any model with fixed
// synthetic batches, and the timed training loop. Used by examples/mlp.h, convnet.h,
// transformer.h (and the loop by rnn.h), their tests and bench/models_bench.cpp.
//
// Modes:
//   kEager          forward, backward() and opt.step() eagerly every step;
//   kBackwardGraph  the forward eager in a StepScope, the backward a BackwardGraph replay;
//   kStepGraph      the whole step (forward, backward, optimizer) one StepGraph replay, the batch
//                   passed to run() (copied into the graph's slots, Note [Step inputs]);
//   kStepGraphInBackward  the same with the optimizer stepped inside the backward, each layer's
//                   parameters once their gradients are final (StepInBackward, Note [Optimizer
//                   steps in the backward] in engine/backward/optim.h).
// With `autocast`, each mode computes the model's loss inside an Autocast scope (Note [Autocast],
// engine/ops/autocast.h): matrix products in bfloat16, the parameters float32 masters cast once a step,
// all in one launch at its start (Autocast(parameters)).
// Every mode hands the model each step's own batch tensor, as a training loop does (the batches
// are different tensors: a replayed backward reads them through its input slots, Note [Input
// slots] in capture/backward_graph.h).
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "graphward/capture/backward_graph.h"
#include "graphward/capture/step_graph.h"
#include "graphward/graphward.h"

namespace graphward::examples {

enum class Mode { kEager, kBackwardGraph, kStepGraph, kStepGraphInBackward };

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kBackwardGraph:
      return "backward graph";
    case Mode::kStepGraph:
      return "full-step graph";
    case Mode::kStepGraphInBackward:
      return "full-step graph, optimizer in the backward";
    case Mode::kEager:
      break;
  }
  return "eager";
}

// Fixed batches: inputs and int32 targets, made once and kept on the training device.
struct Batches {
  std::vector<Tensor> x, t;
};

// A model is a class with
//   using Config = ...;        // with `double lr` and `int batches`
//   Model(const Config&, Device);
//   Tensor loss(const Tensor& x, const Tensor& targets) const;
//   std::vector<Tensor> params() const;
//   static Batches data(const Config&, Device);
// One training run's state: model, data, AdamW and the mode's machinery. step(i) trains on batch
// i % batches and returns the loss (a device tensor; not read here).
template <class Model>
class Trainer {
 public:
  using Config = typename Model::Config;
  // fuse_epilogues: BackwardOptions::fuse_activation_epilogues in every mode; split_weight_grads:
  // BackwardOptions::split_weight_grads (unset: the default where it runs). For comparisons.
  Trainer(const Config& c, Device device, Mode mode, bool fuse_epilogues = true,
          std::optional<bool> split_weight_grads = std::nullopt, bool autocast = false)
      : config_(c), device_(device), mode_(mode), fuse_(fuse_epilogues),
        split_(split_weight_grads), autocast_(autocast), model_(c, device),
        data_(Model::data(c, device)),
        opt_(model_.params(), AdamWOptions{.lr = c.lr, .weight_decay = 0.0}) {
    if (mode == Mode::kBackwardGraph) {
      arena_ = std::make_unique<StepArena>(device);
      bw_ = std::make_unique<BackwardGraph>(
          device, BackwardGraphOptions{.backward = {.split_weight_grads = split_,
                                                    .fuse_activation_epilogues = fuse_epilogues}});
    }
    if (mode == Mode::kStepGraph || mode == Mode::kStepGraphInBackward) {
      step_graph_ = std::make_unique<StepGraph>(device);
    }
    if (mode == Mode::kStepGraphInBackward) in_backward_ = std::make_unique<StepInBackward>(opt_);
    if (autocast) {  // which parameters the forward casts: one forward, nothing recorded
      NoGradGuard no_grad;
      Autocast probe;
      (void)model_.loss(data_.x.front(), data_.t.front());
      cast_parameters_ = probe.cast_parameters();
    }
  }

  Tensor step(int i) {
    const std::size_t b = static_cast<std::size_t>(i) % data_.x.size();
    const Tensor& x = data_.x[b];
    const Tensor& t = data_.t[b];
    switch (mode_) {
      case Mode::kEager: {
        const Tensor loss = loss_of(x, t);
        backward(loss, {.grad_write = GradWrite::kOverwrite,
                        .split_weight_grads = split_,
                        .fuse_activation_epilogues = fuse_});
        opt_.step();
        return loss;
      }
      case Mode::kBackwardGraph: {
        Tensor loss;
        {
          StepScope scope(*arena_);
          loss = loss_of(x, t);
          bw_->backward(loss, GradWrite::kOverwrite);
          if (device_.is_cuda()) arena_->record_step_end(current_stream(device_));
        }
        opt_.step();
        return loss;
      }
      case Mode::kStepGraph: {
        return step_graph_->run({x, t}, [&](const std::vector<Tensor>& in) {
          const Tensor loss = loss_of(in[0], in[1]);
          backward(loss, {.grad_write = GradWrite::kOverwrite,
                        .split_weight_grads = split_,
                        .fuse_activation_epilogues = fuse_});
          opt_.step();
          return loss;
        });
      }
      case Mode::kStepGraphInBackward: {
        return step_graph_->run({x, t}, [&](const std::vector<Tensor>& in) {
          const Tensor loss = loss_of(in[0], in[1]);
          backward(loss, {.grad_write = GradWrite::kOverwrite,
                          .split_weight_grads = split_,
                          .fuse_activation_epilogues = fuse_,
                          .reduce_gradients = in_backward_.get()});
          return loss;
        });
      }
    }
    return {};
  }

  const Model& model() const { return model_; }
  // Under autocast, the parameters the forward casts to bfloat16 (Autocast::cast_parameters of
  // one forward at construction), which each step's scope casts at once.
  const std::vector<Tensor>& cast_parameters() const { return cast_parameters_; }
  std::uint64_t captures() const {
    if (bw_) return bw_->stats().counters.captures;
    if (step_graph_) return step_graph_->counters().captures;
    return 0;
  }
  // Executables updated in place (a BackwardGraph's; a StepGraph captures again instead).
  std::uint64_t updates() const { return bw_ ? bw_->stats().counters.updates : 0; }
  const BackwardGraph* backward_graph() const { return bw_.get(); }

 private:
  // The model's loss, inside an Autocast scope where asked (the scope ends with the forward).
  Tensor loss_of(const Tensor& x, const Tensor& t) const {
    if (!autocast_) return model_.loss(x, t);
    Autocast scope(cast_parameters_);  // the step's parameter casts at once
    return model_.loss(x, t);
  }

  Config config_;
  Device device_;
  Mode mode_;
  bool fuse_ = true;
  std::optional<bool> split_;
  bool autocast_ = false;
  Model model_;
  Batches data_;
  AdamW opt_;
  std::vector<Tensor> cast_parameters_;
  std::unique_ptr<StepArena> arena_;
  std::unique_ptr<BackwardGraph> bw_;
  std::unique_ptr<StepGraph> step_graph_;
  std::unique_ptr<StepInBackward> in_backward_;
};

struct TrainResult {
  double first_loss = 0, last_loss = 0;
  double ms_per_step = 0;  // wall time of the steps after the first 5, synchronized at the end
  std::uint64_t captures = 0, updates = 0;
};

inline void synchronize_device(Device device) {
#if GRAPHWARD_HAS_CUDA
  if (device.is_cuda()) {
    DeviceGuard guard(device);
    GW_CUDA_CHECK(cudaDeviceSynchronize());
  }
#else
  (void)device;
#endif
}

// Runs `steps` steps of any trainer (step(i) -> loss, captures()): the first loss, the last, and
// the time per step after the first 5 (1 for short runs).
template <class AnyTrainer>
TrainResult run_steps(AnyTrainer& trainer, Device device, int steps) {
  TrainResult r;
  Tensor loss;
  const int untimed = steps > 10 ? 5 : 1;
  for (int i = 0; i < untimed; ++i) {
    loss = trainer.step(i);
    if (i == 0) r.first_loss = loss.item();
  }
  synchronize_device(device);
  const auto t0 = std::chrono::steady_clock::now();
  auto reported = t0;
  for (int i = untimed; i < steps; ++i) {
    loss = trainer.step(i);
    // A long run says where it is every few seconds (the loss read here synchronizes, once).
    const auto now = std::chrono::steady_clock::now();
    if (now - reported > std::chrono::seconds(5) && i + 1 < steps) {
      reported = now;
      std::printf("    step %d/%d, loss %.4f, %.3f ms/step so far\n", i + 1, steps, loss.item(),
                  std::chrono::duration<double, std::milli>(now - t0).count() / (i + 1 - untimed));
      std::fflush(stdout);
    }
  }
  synchronize_device(device);
  const auto t1 = std::chrono::steady_clock::now();
  r.last_loss = loss.item();
  const int timed = steps - untimed;
  r.ms_per_step =
      timed > 0 ? std::chrono::duration<double, std::milli>(t1 - t0).count() / timed : 0.0;
  r.captures = trainer.captures();
  r.updates = trainer.updates();
  return r;
}

template <class Model>
TrainResult train(const typename Model::Config& c, Device device, Mode mode, int steps,
                  bool autocast = false) {
  Trainer<Model> trainer(c, device, mode, true, std::nullopt, autocast);
  return run_steps(trainer, device, steps);
}

}  // namespace graphward::examples
