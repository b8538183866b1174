#pragma once
// A classifier MLP trained on synthetic data — the model and data of examples/train_mlp.cpp, its
// tests and bench/models_bench.cpp (the modes and the trainer: examples/trainer.h).
//
// Model: `layers` hidden layers of linear + GELU (one fused cuBLASLt kernel each, Activation::kGelu),
// then a linear to `classes` logits and the fused cross-entropy. Data: `batches` fixed batches of
// Gaussian inputs labelled by a random linear "teacher" (argmax of x·Tᵀ), made once on the host and
// uploaded. Optimizer: AdamW (state on the device).
#include <cmath>
#include <cstdint>
#include <vector>

#include "examples/trainer.h"

namespace graphward::examples {

struct MlpConfig {
  std::int64_t in = 64, hidden = 256, classes = 10, batch = 128;
  int layers = 3;
  int batches = 4;
  double lr = 2e-3;
  std::uint64_t seed = 1;
  // Mixed precision (CUDA): the layers compute on bfloat16 copies of the input and the float32
  // parameters (cast, float32 accumulation in cuBLASLt); the logits go back to float32 for the
  // loss; AdamW updates the float32 parameters (their gradients come back through the casts).
  bool bf16 = false;
};

class MlpModel {
 public:
  using Config = MlpConfig;
  static Batches data(const MlpConfig& c, Device device);
  MlpModel(const MlpConfig& c, Device device) : bf16_(c.bf16) {
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
    if (bf16_) {
      const DType h16 = DType::kBFloat16;
      Tensor h = cast(x, h16);
      for (std::size_t l = 0; l + 1 < w_.size(); ++l) {
        h = linear(h, cast(w_[l], h16), cast(b_[l], h16), Activation::kGelu);
      }
      return cast(linear(h, cast(w_.back(), h16), cast(b_.back(), h16)), DType::kFloat32);
    }
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
  bool bf16_;
  std::vector<Tensor> w_, b_;
};

// The fixed batches: inputs [batch, in] and int32 targets [batch], labelled by a random teacher.
inline Batches MlpModel::data(const MlpConfig& c, Device device) {
  Batches d;
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
    d.x.push_back(xb.to(device));
    d.t.push_back(from_vector(labels, {c.batch}, device));
  }
  return d;
}

using MlpTrainer = Trainer<MlpModel>;

inline TrainResult train_mlp(const MlpConfig& c, Device device, Mode mode, int steps) {
  return train<MlpModel>(c, device, mode, steps);
}

}  // namespace graphward::examples
