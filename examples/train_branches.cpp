// A training loop: K parallel branches of (linear + relu + linear) summed into one output, fitted
// to synthetic regression data with plain SGD written with tensor ops. On a GPU each branch runs on
// its own stream in forward; tensors remember their producing stream, so the sum waits for every
// branch with no hand-written synchronization (rule [read after write]), and backward() runs each
// branch's gradient on that branch's stream and joins them back into the caller's stream (rules
// [forward stream], [cross-stream gradients] and [fork and join]). On a GPU the backward is a
// BackwardGraph: captured once after a warm-up step, replayed every step (the step's activations
// come from a StepArena, so their addresses repeat); `--eager` runs the eager backward instead.
// `--trace FILE` times one more backward step by step on the GPU — a replay of the captured graph
// (BackwardGraph::trace), or the eager backward with `--eager` — and writes it as a Chrome trace
// with a track per stream (open it in ui.perfetto.dev): the overlap, without a profiler.
//
//   train_branches [--cpu] [--eager] [--steps N] [--branches K] [--width W] [--batch B] [--lr LR]
//                  [--trace FILE] | --help      (--flag V and --flag=V alike; numbers parsed whole)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graphward/capture/backward_graph.h"
#include "examples/args.h"
#include "graphward/graphward.h"

namespace gw = graphward;

namespace {

struct Options {
  bool force_cpu = false;
  bool eager = false;
  int steps = 200;
  int branches = 4;
  std::int64_t width = 64;
  std::int64_t batch = 64;
  std::int64_t in = 16;
  std::int64_t out = 4;
  double lr = 0.05;
  std::string trace;  // --trace FILE
};

constexpr const char* kUsage =
    "usage: train_branches [--cpu] [--eager] [--steps N] [--branches K] [--width W] [--batch B] "
    "[--lr LR] [--trace FILE]\n(--flag V and --flag=V alike; defaults: 200 steps, 4 branches, "
    "width 64, batch 64, lr 0.05)";

// The command line; `help` is set (and nothing else read) when --help is asked.
Options parse(int argc, char** argv, bool* help) {
  namespace ex = gw::examples;
  Options o;
  ex::ArgReader args(argc, argv);
  while (args.next()) {
    if (args.wants_help()) {
      *help = true;
      return o;
    } else if (args.is("--cpu")) {
      args.no_value();
      o.force_cpu = true;
    } else if (args.is("--eager")) {
      args.no_value();
      o.eager = true;
    } else if (args.is("--steps")) {
      o.steps = ex::parse_count("--steps", args.value(), 1);
    } else if (args.is("--branches")) {
      o.branches = ex::parse_count("--branches", args.value(), 1);
    } else if (args.is("--width")) {
      o.width = ex::parse_int("--width", args.value(), 1);
    } else if (args.is("--batch")) {
      o.batch = ex::parse_int("--batch", args.value(), 1);
    } else if (args.is("--lr")) {
      o.lr = ex::parse_number("--lr", args.value(), 0.0);
    } else if (args.is("--trace")) {
      o.trace = args.value();
    } else {
      throw gw::Error("unknown argument " + args.name() + "; " + kUsage);
    }
  }
  return o;
}

struct Branch {
  gw::Tensor w1, b1, w2, b2;           // [width, in], [width], [out, width], [out]; leaves
  std::unique_ptr<gw::Stream> stream;  // null on the CPU
};

}  // namespace

int main(int argc, char** argv) try {
  bool help = false;
  const Options opt = parse(argc, argv, &help);
  if (help) {
    std::printf("%s\n", kUsage);
    return 0;
  }
  const bool gpu = !opt.force_cpu && gw::cuda_available();
  const gw::Device dev = gpu ? gw::Device::cuda(0) : gw::Device::cpu();
  if (gpu) {
    std::printf("backend: CUDA on %s (%s), %d branches on %d streams\n", dev.str().c_str(),
                gw::device_name(dev).c_str(), opt.branches, opt.branches);
  } else {
    std::printf("backend: CPU (%s)\n",
                opt.force_cpu
                    ? "--cpu given"
                    : ("no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str());
  }
  const bool graph = gpu && !opt.eager;
  std::printf("backward: %s\n", graph ? "captured CUDA graph (BackwardGraph), replayed every step"
                                      : "eager");
  const gw::TensorOptions f32{gw::DType::kFloat32, dev};

  // Synthetic regression: target = tanh(x · Wtrueᵀ), fixed data set of one batch.
  const gw::Tensor x = gw::randn({opt.batch, opt.in}, 1, f32);
  const gw::Tensor w_true = gw::mul(gw::randn({opt.out, opt.in}, 2, f32), 0.5);
  const gw::Tensor target = gw::tanh(gw::linear(x, w_true));

  std::vector<Branch> branches(static_cast<std::size_t>(opt.branches));
  std::uint64_t seed = 100;
  for (Branch& b : branches) {
    const double s1 = 1.0 / std::sqrt(double(opt.in)), s2 = 1.0 / std::sqrt(double(opt.width));
    b.w1 = gw::uniform({opt.width, opt.in}, -s1, s1, seed++, f32).set_requires_grad(true);
    b.b1 = gw::zeros({opt.width}, f32).set_requires_grad(true);
    b.w2 = gw::uniform({opt.out, opt.width}, -s2, s2, seed++, f32).set_requires_grad(true);
    b.b2 = gw::zeros({opt.out}, f32).set_requires_grad(true);
    if (gpu) b.stream = std::make_unique<gw::Stream>(dev);
  }
  // Runs `f` with the branch's stream current (on the GPU).
  auto on = [&](Branch& b, auto&& f) {
    if (!b.stream) return f();
    gw::StreamGuard guard(*b.stream);
    return f();
  };

  // The captured backward and the arena that gives each step's activations the same addresses.
  gw::BackwardGraph bw(dev, {.force_eager = !graph});
  std::unique_ptr<gw::StepArena> arena;
  if (graph) arena = std::make_unique<gw::StepArena>(dev);

  // forward: each branch on its stream; the sum waits for all of them (rule [read after write])
  auto forward = [&] {
    gw::Tensor y;
    for (Branch& b : branches) {
      const gw::Tensor out =
          on(b, [&] { return gw::linear(gw::relu(gw::linear(x, b.w1, b.b1)), b.w2, b.b2); });
      y = y.defined() ? gw::add(y, out) : out;
    }
    return gw::mse_loss(y, target);
  };
  if (!opt.trace.empty() && !gpu) throw gw::Error("--trace times CUDA streams: it needs a GPU");

  double first_loss = 0, loss_value = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < opt.steps; ++step) {
    std::unique_ptr<gw::StepScope> scope;
    if (arena) scope = std::make_unique<gw::StepScope>(*arena);
    const gw::Tensor loss = forward();

    // backward: each branch's gradients on its own stream; .grad overwritten (no zero_grad needed)
    bw.backward(loss, gw::GradWrite::kOverwrite);
    if (arena) arena->record_step_end(gw::current_stream(dev));
    scope.reset();

    // SGD, in place and unrecorded, on each branch's stream
    {
      gw::NoGradGuard no_grad;
      for (Branch& b : branches) {
        on(b, [&] {
          for (const gw::Tensor* p : {&b.w1, &b.b1, &b.w2, &b.b2}) gw::add_(*p, p->grad(), -opt.lr);
        });
      }
    }
    if (step == 0 || (step + 1) % 20 == 0 || step + 1 == opt.steps) {
      loss_value = loss.item();  // a host read: synchronizes
      if (step == 0) first_loss = loss_value;
      std::printf("step %4d  loss %.6f\n", step + 1, loss_value);
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (graph) {
    const auto c = bw.stats().counters;
    std::printf("graph: %llu captures, %llu updates, %llu replays, %llu eager warm-up steps\n",
                static_cast<unsigned long long>(c.captures),
                static_cast<unsigned long long>(c.updates),
                static_cast<unsigned long long>(c.replays),
                static_cast<unsigned long long>(bw.stats().eager_backwards));
  }
  if (!opt.trace.empty()) {  // one more step, timed step by step (Note [Timeline])
    std::vector<gw::StepTiming> steps;
    std::vector<std::string> names;
    const gw::Tensor loss = forward();
    if (graph) {
      steps = bw.trace(loss, gw::GradWrite::kOverwrite);
      names = bw.trace_stream_names();
    } else {
      names = gw::stream_names(gw::plan_for({loss}, gw::GradWrite::kOverwrite));
      gw::backward(loss, {.grad_write = gw::GradWrite::kOverwrite, .timings = &steps});
    }
    gw::write_chrome_trace(opt.trace, steps, names,
                           graph ? "train_branches: a traced replay" : "train_branches: eager");
    float end = 0;
    std::set<int> used;  // an eager backward too short for its streams runs on the caller's alone
    for (const gw::StepTiming& t : steps) {
      end = std::max({end, t.end_ms, t.side_end_ms});
      used.insert(t.stream);
      if (t.side_stream >= 0) used.insert(t.side_stream);
    }
    std::printf(
        "timeline: %s (%zu backward steps on %zu streams, %.3f ms; open in "
        "ui.perfetto.dev)\n",
        opt.trace.c_str(), steps.size(), used.size(), static_cast<double>(end));
  }
  std::printf("loss %.6f -> %.6f (%.1f%% of the start) in %d steps, %.3f ms/step (%s)\n",
              first_loss, loss_value, 100.0 * loss_value / first_loss, opt.steps,
              1e3 * secs / opt.steps, gpu ? "CUDA" : "CPU");
  if (!(loss_value < first_loss)) {
    std::fprintf(stderr, "train_branches: the loss did not go down\n");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_branches: %s\n", e.what());
  return 2;
}
