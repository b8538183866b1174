// A training loop: K parallel branches of (linear + relu + linear) summed into one output, fitted to
// synthetic regression data with plain SGD written with tensor ops. On a GPU each branch runs on its
// own stream; tensors remember their producing stream, so the sum waits for every branch with no
// hand-written synchronization (DESIGN.md rule 6).
//
// The backward is written by hand with the ops' backward functions for now; the autograd tape
// replaces it next (issue: stream-aware eager autograd).
//
//   train_branches [--cpu] [--steps N] [--branches K] [--width W] [--batch B] [--lr LR]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/graphward.h"

namespace gw = graphward;

namespace {

struct Options {
  bool force_cpu = false;
  int steps = 200;
  int branches = 4;
  std::int64_t width = 64;
  std::int64_t batch = 64;
  std::int64_t in = 16;
  std::int64_t out = 4;
  double lr = 0.05;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) throw gw::Error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--cpu") o.force_cpu = true;
    else if (a == "--steps") o.steps = std::atoi(next());
    else if (a == "--branches") o.branches = std::atoi(next());
    else if (a == "--width") o.width = std::atoll(next());
    else if (a == "--batch") o.batch = std::atoll(next());
    else if (a == "--lr") o.lr = std::atof(next());
    else throw gw::Error("unknown argument " + a + " (see the comment at the top of train_branches.cpp)");
  }
  if (o.steps < 1 || o.branches < 1 || o.width < 1 || o.batch < 1) {
    throw gw::Error("steps, branches, width and batch must be positive");
  }
  return o;
}

struct Branch {
  gw::Tensor w1, b1, w2, b2;  // [width, in], [width], [out, width], [out]
  std::unique_ptr<gw::Stream> stream;  // null on the CPU
  gw::Tensor h, y;                     // saved by forward for backward
};

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  const bool gpu = !opt.force_cpu && gw::cuda_available();
  const gw::Device dev = gpu ? gw::Device::cuda(0) : gw::Device::cpu();
  if (gpu) {
    std::printf("backend: CUDA on %s (%s), %d branches on %d streams\n", dev.str().c_str(),
                gw::device_name(dev).c_str(), opt.branches, opt.branches);
  } else {
    std::printf("backend: CPU (%s)\n", opt.force_cpu ? "--cpu given"
                                                     : ("no usable CUDA device: " +
                                                        gw::cuda_unavailable_reason()).c_str());
  }
  const gw::TensorOptions f32{gw::DType::kFloat32, dev};

  // Synthetic regression: target = tanh(x · Wtrueᵀ), fixed data set of one batch.
  const gw::Tensor x = gw::randn({opt.batch, opt.in}, 1, f32);
  const gw::Tensor w_true = gw::mul(gw::randn({opt.out, opt.in}, 2, f32), 0.5);
  const gw::Tensor target = gw::tanh(gw::linear(x, w_true));

  std::vector<Branch> branches(static_cast<std::size_t>(opt.branches));
  std::uint64_t seed = 100;
  for (Branch& b : branches) {
    const double s1 = 1.0 / std::sqrt(double(opt.in)), s2 = 1.0 / std::sqrt(double(opt.width));
    b.w1 = gw::uniform({opt.width, opt.in}, -s1, s1, seed++, f32);
    b.b1 = gw::zeros({opt.width}, f32);
    b.w2 = gw::uniform({opt.out, opt.width}, -s2, s2, seed++, f32);
    b.b2 = gw::zeros({opt.out}, f32);
    if (gpu) b.stream = std::make_unique<gw::Stream>(dev);
  }
  // Runs `f` with the branch's stream current (on the GPU).
  auto on = [&](Branch& b, auto&& f) {
    if (!b.stream) return f();
    gw::StreamGuard guard(*b.stream);
    return f();
  };

  const gw::Tensor one = gw::ones({}, f32);
  double first_loss = 0, loss_value = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < opt.steps; ++step) {
    // forward: each branch on its stream; the sum waits for all of them (rule 6)
    gw::Tensor y;
    for (Branch& b : branches) {
      on(b, [&] {
        b.h = gw::relu(gw::linear(x, b.w1, b.b1));
        b.y = gw::linear(b.h, b.w2, b.b2);
      });
      y = y.defined() ? gw::add(y, b.y) : b.y;
    }
    const gw::Tensor loss = gw::mse_loss(y, target);

    // backward by hand, each branch on the stream its forward used, then SGD
    gw::Tensor dy;
    gw::mse_loss_backward(one, y, target, {&dy});
    for (Branch& b : branches) {
      on(b, [&] {
        gw::Tensor dh, dz, dw1, db1, dw2, db2;
        gw::linear_backward(dy, b.h, b.w2, {&dh}, {&dw2}, {&db2});
        gw::relu_backward(dh, b.h, {&dz});
        gw::linear_backward(dz, x, b.w1, {}, {&dw1}, {&db1});
        b.w1 = gw::sub(b.w1, gw::mul(dw1, opt.lr));
        b.b1 = gw::sub(b.b1, gw::mul(db1, opt.lr));
        b.w2 = gw::sub(b.w2, gw::mul(dw2, opt.lr));
        b.b2 = gw::sub(b.b2, gw::mul(db2, opt.lr));
      });
    }
    if (step == 0 || (step + 1) % 20 == 0 || step + 1 == opt.steps) {
      loss_value = loss.item();  // a host read: synchronizes
      if (step == 0) first_loss = loss_value;
      std::printf("step %4d  loss %.6f\n", step + 1, loss_value);
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("loss %.6f -> %.6f (%.1f%% of the start) in %d steps, %.3f ms/step (%s)\n", first_loss,
              loss_value, 100.0 * loss_value / first_loss, opt.steps, 1e3 * secs / opt.steps,
              gpu ? "CUDA" : "CPU");
  if (!(loss_value < first_loss)) {
    std::fprintf(stderr, "train_branches: the loss did not go down\n");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_branches: %s\n", e.what());
  return 2;
}
