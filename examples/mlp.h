#pragma once
// A classifier MLP trained on synthetic data, in three modes — the model, data and loop shared by
// examples/train_mlp.cpp, its tests and bench/models_bench.cpp.
//
// Model: `layers` hidden layers of linear + GELU (one fused cuBLASLt kernel each, Activation::kGelu),
// then a linear to `classes` logits and the fused cross-entropy. Data: `batches` fixed batches of
// Gaussian inputs labelled by a random linear "teacher" (argmax of x·Tᵀ), made once on the host and
// uploaded. Optimizer: AdamW (state on the device).
//
// Modes:
//   kEager          forward, backward() and opt.step() eagerly every step;
//   kBackwardGraph  the forward eager in a StepScope, the backward a BackwardGraph replay;
//   kStepGraph      the whole step (forward, backward, optimizer) one StepGraph replay, the batch
//                   copied into static input slots first.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/backward_graph.h"
#include "capture/step_graph.h"
#include "engine/graphward.h"

namespace graphward::examples {

enum class Mode { kEager, kBackwardGraph, kStepGraph };

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kBackwardGraph:
      return "backward graph";
    case Mode::kStepGraph:
      return "full-step graph";
    case Mode::kEager:
      break;
  }
  return "eager";
}

struct MlpConfig {
  std::int64_t in = 64, hidden = 256, classes = 10, batch = 128;
  int layers = 3;
  int batches = 4;
  double lr = 2e-3;
  std::uint64_t seed = 1;
};

class MlpModel {
 public:
  MlpModel(const MlpConfig& c, Device device) {
    std::uint64_t seed = c.seed * 1000;
    const TensorOptions opt{DType::kFloat32, device};
    std::int64_t fan_in = c.in;
    for (int l = 0; l <= c.layers; ++l) {
      const std::int64_t out = l < c.layers ? c.hidden : c.classes;
      const double s = 1.0 / std::sqrt(static_cast<double>(fan_in));
      w_.push_back(uniform({out, fan_in}, -s, s, seed++, opt).set_requires_grad(true));
      b_.push_back(zeros({out}, opt).set_requires_grad(true));
      fan_in = out;
    }
  }
  Tensor logits(const Tensor& x) const {
    Tensor h = x;
    for (std::size_t l = 0; l + 1 < w_.size(); ++l) h = linear(h, w_[l], b_[l], Activation::kGelu);
    return linear(h, w_.back(), b_.back());
  }
  Tensor loss(const Tensor& x, const Tensor& targets) const {
    return cross_entropy(logits(x), targets);
  }
  std::vector<Tensor> params() const {
    std::vector<Tensor> p;
    for (std::size_t l = 0; l < w_.size(); ++l) {
      p.push_back(w_[l]);
      p.push_back(b_[l]);
    }
    return p;
  }

 private:
  std::vector<Tensor> w_, b_;
};

// The fixed batches: inputs [batch, in] and int32 targets [batch], labelled by a random teacher.
struct MlpData {
  std::vector<Tensor> x, t;
  MlpData(const MlpConfig& c, Device device) {
    const Tensor teacher = randn({c.classes, c.in}, c.seed * 7919 + 1);
    const std::vector<float> tw = teacher.to_vector<float>();
    for (int b = 0; b < c.batches; ++b) {
      const Tensor xb = randn({c.batch, c.in}, c.seed * 7919 + 2 + static_cast<std::uint64_t>(b));
      const std::vector<float> xv = xb.to_vector<float>();
      std::vector<std::int32_t> labels(static_cast<std::size_t>(c.batch));
      for (std::int64_t i = 0; i < c.batch; ++i) {
        double best = -INFINITY;
        for (std::int64_t k = 0; k < c.classes; ++k) {
          double v = 0;
          for (std::int64_t j = 0; j < c.in; ++j) v += double(xv[i * c.in + j]) * tw[k * c.in + j];
          if (v > best) {
            best = v;
            labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(k);
          }
        }
      }
      x.push_back(xb.to(device));
      t.push_back(from_vector(labels, {c.batch}, device));
    }
  }
};

// One training run's state: model, data, optimizer and the mode's machinery; step() runs one
// training step on batch `i % batches` and returns its loss (a device tensor; not read here).
class MlpTrainer {
 public:
  MlpTrainer(const MlpConfig& c, Device device, Mode mode)
      : config_(c), device_(device), mode_(mode), model_(c, device), data_(c, device),
        opt_(model_.params(), AdamWOptions{.lr = c.lr, .weight_decay = 0.0}) {
    if (mode == Mode::kBackwardGraph) {
      arena_ = std::make_unique<StepArena>(device);
      bw_ = std::make_unique<BackwardGraph>(device);
    }
    if (mode == Mode::kStepGraph) {
      x_ = zeros({c.batch, c.in}, {DType::kFloat32, device});
      t_ = zeros({c.batch}, {DType::kInt32, device});
      step_graph_ = std::make_unique<StepGraph>(device, std::vector<Tensor>{x_, t_});
    }
  }

  Tensor step(int i) {
    const std::size_t b = static_cast<std::size_t>(i % config_.batches);
    const Tensor& x = data_.x[b];
    const Tensor& t = data_.t[b];
    switch (mode_) {
      case Mode::kEager: {
        const Tensor loss = model_.loss(x, t);
        backward(loss, {.grad_write = GradWrite::kOverwrite});
        opt_.step();
        return loss;
      }
      case Mode::kBackwardGraph: {
        Tensor loss;
        {
          StepScope scope(*arena_);
          loss = model_.loss(x, t);
          bw_->backward(loss, GradWrite::kOverwrite);
          if (device_.is_cuda()) arena_->record_step_end(current_stream(device_));
        }
        opt_.step();
        return loss;
      }
      case Mode::kStepGraph: {
        {
          NoGradGuard no_grad;
          copy_(x_, x);
          copy_(t_, t);
        }
        return step_graph_->run([&] {
          const Tensor loss = model_.loss(x_, t_);
          backward(loss, {.grad_write = GradWrite::kOverwrite});
          opt_.step();
          return loss;
        });
      }
    }
    return {};
  }

  const MlpModel& model() const { return model_; }
  std::uint64_t captures() const {
    if (bw_) return bw_->counters().captures;
    if (step_graph_) return step_graph_->counters().captures;
    return 0;
  }

 private:
  MlpConfig config_;
  Device device_;
  Mode mode_;
  MlpModel model_;
  MlpData data_;
  AdamW opt_;
  std::unique_ptr<StepArena> arena_;
  std::unique_ptr<BackwardGraph> bw_;
  Tensor x_, t_;  // the StepGraph's static input slots
  std::unique_ptr<StepGraph> step_graph_;
};

struct TrainResult {
  double first_loss = 0, last_loss = 0;
  double ms_per_step = 0;  // wall time of the steps after the first 5, synchronized at the end
  std::uint64_t captures = 0;
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

inline TrainResult train_mlp(const MlpConfig& c, Device device, Mode mode, int steps) {
  MlpTrainer trainer(c, device, mode);
  TrainResult r;
  Tensor loss;
  const int untimed = steps > 10 ? 5 : 1;
  for (int i = 0; i < untimed; ++i) {
    loss = trainer.step(i);
    if (i == 0) r.first_loss = loss.item();
  }
  synchronize_device(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = untimed; i < steps; ++i) loss = trainer.step(i);
  synchronize_device(device);
  const auto t1 = std::chrono::steady_clock::now();
  r.last_loss = loss.item();
  const int timed = steps - untimed;
  r.ms_per_step =
      timed > 0 ? std::chrono::duration<double, std::milli>(t1 - t0).count() / timed : 0.0;
  r.captures = trainer.captures();
  return r;
}

}  // namespace graphward::examples
