#pragma once
// A small convnet trained on synthetic images — the model and data of examples/train_convnet.cpp,
// its tests and bench/models_bench.cpp (modes and trainer: examples/trainer.h).
//
// Model: conv 3x3 (pad 1) + ReLU -> max pool 2 -> conv 3x3 (pad 1) + ReLU -> average pool 2 ->
// flatten (a reshape view) -> linear to `classes` logits -> fused cross-entropy; NCHW, or NHWC
// throughout (ConvnetConfig::channels_last). cuDNN runs the
// convolutions and pools on CUDA. Data: each class has a fixed random template image; a sample
// is its class's template plus Gaussian noise of the same scale, labels drawn at random. AdamW.
#include <cmath>
#include <cstdint>
#include <vector>

#include "examples/trainer.h"

namespace graphward::examples {

struct ConvnetConfig {
  std::int64_t batch = 64, channels = 3, image = 16, c1 = 16, c2 = 32, classes = 10;
  int batches = 4;
  double lr = 2e-3;
  double noise = 1.0;
  std::uint64_t seed = 5;
  // Conv2dOptions::deterministic: false lets cuDNN use its fastest algorithms (PyTorch's default).
  bool deterministic = true;
  // Channels last: images, activations and convolution weights NHWC (Conv2dOptions::
  // channels_last) — what bfloat16 convolutions want on Hopper; NCHW otherwise.
  bool channels_last = false;
};

class ConvnetModel {
 public:
  using Config = ConvnetConfig;
  ConvnetModel(const ConvnetConfig& c, Device device) : c_(c) {
    GW_CHECK(c.image % 4 == 0 && c.image >= 4, "ConvnetModel: image is ", c.image,
             "; expected a multiple of 4 (two 2x2 pools)");
    const TensorOptions opt{DType::kFloat32, device};
    std::uint64_t seed = c.seed * 1000;
    auto conv_weight = [&](std::int64_t out, std::int64_t in) {
      const double s = 1.0 / std::sqrt(static_cast<double>(in) * 9.0);
      const Shape shape = c.channels_last ? Shape{out, 3, 3, in} : Shape{out, in, 3, 3};
      return uniform(shape, -s, s, seed++, opt).set_requires_grad(true);
    };
    w1_ = conv_weight(c.c1, c.channels);
    b1_ = zeros({c.c1}, opt).set_requires_grad(true);
    w2_ = conv_weight(c.c2, c.c1);
    b2_ = zeros({c.c2}, opt).set_requires_grad(true);
    const std::int64_t flat = shape_numel({c.c2, c.image / 4, c.image / 4});  // refuses overflow
    const double s = 1.0 / std::sqrt(static_cast<double>(flat));
    w3_ = uniform({c.classes, flat}, -s, s, seed++, opt).set_requires_grad(true);
    b3_ = zeros({c.classes}, opt).set_requires_grad(true);
  }
  Tensor logits(const Tensor& x) const {
    // Each convolution with its bias and ReLU as one op (Conv2dOptions::activation).
    const Conv2dOptions o{.stride = 1,
                          .padding = 1,
                          .deterministic = c_.deterministic,
                          .activation = Activation::kRelu,
                          .channels_last = c_.channels_last};
    const Pool2dOptions pool{.channels_last = c_.channels_last};
    Tensor h = max_pool2d(conv2d(x, w1_, b1_, o), pool);
    h = avg_pool2d(conv2d(h, w2_, b2_, o), pool);
    return linear(reshape(h, {h.size(0), -1}), w3_, b3_);
  }
  Tensor loss(const Tensor& x, const Tensor& targets) const {
    return cross_entropy(logits(x), targets);
  }
  std::vector<Tensor> params() const { return {w1_, b1_, w2_, b2_, w3_, b3_}; }

  static Batches data(const ConvnetConfig& c, Device device) {
    const Shape image{c.channels, c.image, c.image};
    const std::int64_t pixels = shape_numel(image);
    const std::vector<float> templates =
        randn({c.classes, pixels}, c.seed * 7919 + 1).to_vector<float>();
    Batches d;
    for (int b = 0; b < c.batches; ++b) {
      const std::uint64_t s = c.seed * 7919 + 100 + 2 * static_cast<std::uint64_t>(b);
      std::vector<float> x = randn({c.batch, pixels}, s).to_vector<float>();
      const std::vector<float> pick = uniform({c.batch}, 0.0, 1.0, s + 1).to_vector<float>();
      std::vector<std::int32_t> labels(static_cast<std::size_t>(c.batch));
      for (std::int64_t i = 0; i < c.batch; ++i) {
        const auto label = std::min<std::int64_t>(
            c.classes - 1, static_cast<std::int64_t>(pick[static_cast<std::size_t>(i)] *
                                                     static_cast<float>(c.classes)));
        labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(label);
        for (std::int64_t j = 0; j < pixels; ++j) {
          float& v = x[static_cast<std::size_t>(i * pixels + j)];
          v = templates[static_cast<std::size_t>(label * pixels + j)] +
              static_cast<float>(c.noise) * v;
        }
      }
      // Channels last: the same numbers read as [N, H, W, C] (each class's template is as
      // random either way).
      const Shape shape = c.channels_last ? Shape{c.batch, c.image, c.image, c.channels}
                                          : Shape{c.batch, c.channels, c.image, c.image};
      d.x.push_back(from_vector(x, shape, device));
      d.t.push_back(from_vector(labels, {c.batch}, device));
    }
    return d;
  }

 private:
  ConvnetConfig c_;
  Tensor w1_, b1_, w2_, b2_, w3_, b3_;
};

inline TrainResult train_convnet(const ConvnetConfig& c, Device device, Mode mode, int steps) {
  return train<ConvnetModel>(c, device, mode, steps);
}

}  // namespace graphward::examples
