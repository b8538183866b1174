// StepGraph on the GPU: a whole training step (forward with fused GELU layers, backward, gradient
// clipping, AdamW) captured once and replayed gives the parameters of the same steps run eagerly,
// bitwise; refilled inputs are read by the replays; a replaced input or .grad is captured again,
// never replayed stale; a forward on several streams is captured too; capture-unsafe work is
// refused by name with no capture left open.
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>

#include "graphward/capture/step_graph.h"
#include "test_util.h"

namespace graphward {
namespace {

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

class CudaStepGraph : public testing::PoisonedCudaTest {};

struct Mlp {
  std::vector<Tensor> w;
  explicit Mlp(bool branches = false) {
    w.push_back(mul(randn({64, 32}, 1, kF32Gpu), 0.2).detach().set_requires_grad(true));
    w.push_back(zeros({64}, kF32Gpu).set_requires_grad(true));
    w.push_back(mul(randn({16, 64}, 2, kF32Gpu), 0.2).detach().set_requires_grad(true));
    w.push_back(zeros({16}, kF32Gpu).set_requires_grad(true));
    if (branches) {
      w.push_back(mul(randn({16, 32}, 3, kF32Gpu), 0.2).detach().set_requires_grad(true));
    }
  }
  // Two linears (the first with a fused GELU); with `side`, a second branch (a linear of x) on
  // another stream, added to the first.
  Tensor loss(const Tensor& x, const Tensor& t, Stream* side = nullptr) const {
    Tensor y = linear(linear(x, w[0], w[1], Activation::kGelu), w[2], w[3]);
    if (side) {
      Tensor z;
      {
        StreamGuard on(*side);
        z = linear(x, w[4]);
      }
      y = add(y, z);
    }
    return mse_loss(y, t);
  }
};

void fill_batch(const Tensor& x, const Tensor& t, int step) {
  NoGradGuard no_grad;
  copy_(x, randn(x.shape(), 100 + static_cast<std::uint64_t>(step), kF32Gpu));
  copy_(t, randn(t.shape(), 200 + static_cast<std::uint64_t>(step), kF32Gpu));
}

TEST_F(CudaStepGraph, ReplayedStepsGiveTheParametersOfEagerStepsBitwise) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, graphed;
  AdamW opt_e(eager.w, {.lr = 0.01}), opt_g(graphed.w, {.lr = 0.01});
  StepGraph step(kGpu, {x, t});
  std::vector<float> eager_losses, graph_losses;
  for (int s = 0; s < 8; ++s) {
    fill_batch(x, t, s);
    if (s == 5) {  // a learning rate changed between replays reaches the graph
      opt_e.set_lr(0.005);
      opt_g.set_lr(0.005);
    }
    {
      const Tensor l = eager.loss(x, t);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      (void)clip_grad_norm(eager.w, 1.0);
      opt_e.step();
      eager_losses.push_back(static_cast<float>(l.item()));
    }
    const Tensor l = step.run([&] {
      const Tensor loss = graphed.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      (void)clip_grad_norm(graphed.w, 1.0);
      opt_g.step();
      return loss;
    });
    graph_losses.push_back(static_cast<float>(l.item()));
  }
  EXPECT_EQ(step.counters().eager, 1u);
  EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
  EXPECT_EQ(step.counters().replays, 7u);
  EXPECT_GT(step.kernel_nodes(), 10u);
  EXPECT_EQ(graph_losses, eager_losses);  // the replays read the refilled inputs
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
  EXPECT_EQ(opt_g.steps(), 8);
  EXPECT_LT(graph_losses.back(), graph_losses.front());
}

// A backward() in a StepGraph's step splits its weight gradients onto side streams by default
// (BackwardOptions::split_weight_grads): the captured graph forks and joins where the same step
// told not to split is one chain, and both replay the eager steps' parameters bitwise.
TEST_F(CudaStepGraph, AStepsBackwardSplitsItsWeightGradientsByDefaultWithTheEagerBits) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, split, unsplit;
  AdamW opt_e(eager.w, {.lr = 0.01}), opt_s(split.w, {.lr = 0.01}), opt_u(unsplit.w, {.lr = 0.01});
  StepGraph step_s(kGpu, {x, t}), step_u(kGpu, {x, t});
  auto body = [&](const Mlp& m, AdamW& opt, std::optional<bool> split_grads) {
    return [&, split_grads] {
      const Tensor loss = m.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite, .split_weight_grads = split_grads});
      opt.step();
      return loss;
    };
  };
  for (int s = 0; s < 6; ++s) {
    fill_batch(x, t, s);
    {
      const Tensor l = eager.loss(x, t);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt_e.step();
    }
    (void)step_s.run(body(split, opt_s, std::nullopt));
    (void)step_u.run(body(unsplit, opt_u, false));
  }
  EXPECT_EQ(step_s.counters().captures, 1u) << step_s.last_reason();
  EXPECT_EQ(step_u.counters().captures, 1u) << step_u.last_reason();
  EXPECT_EQ(step_u.topology().fork_nodes, 0u) << "one stream, told not to split: one chain";
  EXPECT_GT(step_s.topology().fork_nodes, 0u) << "split by default: weight gradients beside";
  EXPECT_GE(step_s.topology().max_fan_out, 2u);
  EXPECT_LT(step_s.topology().longest_path, step_u.topology().longest_path);
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(split.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
    EXPECT_EQ(unsplit.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
}

// Note [Optimizer steps in the backward]: a StepGraph whose step hands its backward a
// StepInBackward instead of calling opt.step() after it updates each layer's parameters beside the
// rest of the backward (its graph forks more than the same step's with opt.step() after it), and
// replays the eager steps' parameters bitwise.
TEST_F(CudaStepGraph, AnOptimizerSteppedInTheBackwardRunsBesideItWithTheEagerBits) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, after, inside;
  AdamW opt_e(eager.w, {.lr = 0.01}), opt_a(after.w, {.lr = 0.01}), opt_i(inside.w, {.lr = 0.01});
  StepInBackward in_backward(opt_i, /*bucket_bytes=*/1);  // a bucket a layer
  StepGraph step_a(kGpu, {x, t}), step_i(kGpu, {x, t});
  for (int s = 0; s < 6; ++s) {
    fill_batch(x, t, s);
    {
      const Tensor l = eager.loss(x, t);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt_e.step();
    }
    (void)step_a.run([&] {
      const Tensor loss = after.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_a.step();
      return loss;
    });
    (void)step_i.run([&] {
      const Tensor loss = inside.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &in_backward});
      return loss;
    });
  }
  EXPECT_EQ(step_i.counters().captures, 1u) << step_i.last_reason();
  EXPECT_GT(step_i.topology().fork_nodes, step_a.topology().fork_nodes);
  EXPECT_EQ(opt_i.steps(), 6);
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(after.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
    EXPECT_EQ(inside.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
}

// A capture cannot make a side stream's cuBLAS handle. A StepGraph whose warm-up did not split
// (told not to) and whose capture would (the default): the capture runs its backward unsplit —
// no error, one capture, the eager steps' parameters bitwise. On a thread of its own, whose
// backward has never split before.
TEST_F(CudaStepGraph, ACaptureWhoseSideStreamsHaveNoHandleYetRunsUnsplitWithTheEagerBits) {
  std::thread([] {
    const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
    Mlp eager, graphed;
    Sgd opt_e(eager.w, {.lr = 0.02}), opt_g(graphed.w, {.lr = 0.02});
    StepGraph step(kGpu, {x, t});
    for (int s = 0; s < 4; ++s) {
      fill_batch(x, t, s);
      {
        const Tensor l = eager.loss(x, t);
        backward(l, {.grad_write = GradWrite::kOverwrite});
        opt_e.step();
      }
      const bool warm_up = s == 0;
      EXPECT_NO_THROW((void)step.run([&] {
        const Tensor loss = graphed.loss(x, t);
        backward(loss, {.grad_write = GradWrite::kOverwrite,
                        .split_weight_grads = warm_up ? std::optional<bool>(false) : std::nullopt});
        opt_g.step();
        return loss;
      })) << "step "
          << s;
    }
    EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
    EXPECT_EQ(step.topology().fork_nodes, 0u) << "expected the backward unsplit";
    for (std::size_t i = 0; i < eager.w.size(); ++i) {
      EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>())
          << "parameter " << i;
    }
  }).join();
}

// Rule [read after write] and a capture: parameters last written on a stream that never joins the
// capture (as a ProcessGroup's broadcast writes them on its stream at the start) are updated inside
// it — a write waits only for the readers since the last write, not for every stream that ever used
// the memory (which would tie the capture to a stream outside it: cudaErrorStreamCaptureIsolation)
// — and the replays give the eager steps' parameters bitwise.
TEST_F(CudaStepGraph, ParametersWrittenOnAnotherStreamBeforeTheStepAreUpdatedInTheCapture) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, graphed;
  Stream lone(kGpu);
  {
    StreamGuard on(lone);
    NoGradGuard no_grad;
    for (const Tensor& w : graphed.w) copy_(w, mul(w, 1.0));  // the same values, written there
  }
  Sgd opt_e(eager.w, {.lr = 0.02}), opt_g(graphed.w, {.lr = 0.02});
  StepGraph step(kGpu, {x, t});
  for (int s = 0; s < 4; ++s) {
    fill_batch(x, t, s);
    const Tensor l = eager.loss(x, t);
    backward(l, {.grad_write = GradWrite::kOverwrite});
    opt_e.step();
    (void)step.run([&] {
      const Tensor loss = graphed.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_g.step();
      return loss;
    });
  }
  EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
  EXPECT_EQ(step.counters().replays, 3u);  // the captured step is launched too
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
}

// Note [Memory from outside a capture]: a step captured again on another stream than the last
// replays' reads and writes memory last used outside the capture — the parameters and .grads the
// replays wrote, the inputs filled on the default stream, the optimizer's learning rate made there
// (and, in the test above, parameters a StepInBackward stepped on its stream in the warm-up). The
// capture does not wait for those streams inside it (cudaErrorStreamCaptureIsolation); the launch
// does: one more capture, and the eager steps' parameters bitwise.
TEST_F(CudaStepGraph, AStepCapturedAgainOnAnotherStreamIsOrderedAfterTheLastReplay) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, graphed;
  Sgd opt_e(eager.w, {.lr = 0.02}), opt_g(graphed.w, {.lr = 0.02});
  StepGraph step(kGpu, {x, t});
  Stream other(kGpu);
  for (int s = 0; s < 7; ++s) {
    fill_batch(x, t, s);
    {
      const Tensor l = eager.loss(x, t);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt_e.step();
    }
    if (s == 4) step.recapture();
    std::optional<StreamGuard> on;
    if (s >= 4) on.emplace(other);
    (void)step.run([&] {
      const Tensor loss = graphed.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_g.step();
      return loss;
    });
  }
  EXPECT_EQ(step.counters().captures, 2u) << step.last_reason();
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
}

TEST_F(CudaStepGraph, AReplacedInputOrGradIsCapturedAgainNeverReplayedStale) {
  Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp m;
  Sgd opt(m.w, {.lr = 0.01});
  std::vector<Tensor> inputs{x, t};
  auto body = [&](const Tensor& xi) {
    return [&, xi] {
      const Tensor loss = m.loss(xi, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt.step();
      return loss;
    };
  };
  StepGraph step(kGpu, {x, t});
  for (int s = 0; s < 3; ++s) {
    fill_batch(x, t, s);
    (void)step.run(body(x));
  }
  EXPECT_EQ(step.counters().captures, 1u);
  // The .grad of a parameter set to none and made again elsewhere: captured again.
  m.w[0].grad() = zeros(m.w[0].shape(), kF32Gpu);
  (void)step.run(body(x));
  EXPECT_EQ(step.counters().captures, 2u);
  EXPECT_NE(step.last_reason().find(".grad"), std::string::npos) << step.last_reason();
  (void)step.run(body(x));
  EXPECT_EQ(step.counters().captures, 2u);
  // recapture() forgets the graph.
  step.recapture();
  (void)step.run(body(x));
  EXPECT_EQ(step.counters().captures, 3u);
}

// Note [Host state of a captured step]: a layer frozen with its .grad kept (as PyTorch users
// freeze), that .grad dropped, the layer unfrozen again, a parameter the backward no longer
// reaches stepped by the optimizer: each change between replays is captured again, with the
// reason, and the parameters stay bitwise those of the same eager steps (the replay kept training
// the frozen layer with fresh gradients, read the dropped .grad, and never trained the unfrozen
// one).
TEST_F(CudaStepGraph, AFrozenOrUnfrozenLayerOrADroppedGradIsCapturedAgainAndStepsAsEager) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, graphed;
  AdamW opt_e(eager.w, {.lr = 0.01}), opt_g(graphed.w, {.lr = 0.01});
  StepGraph step(kGpu, {x, t});
  auto change = [](Mlp& m, int s) {
    if (s == 4) m.w[0].set_requires_grad(false);  // frozen; its .grad kept
    if (s == 6) m.w[0].grad() = Tensor();         // and its .grad dropped
    if (s == 8) m.w[0].set_requires_grad(true);   // unfrozen
  };
  std::vector<std::string> reasons;
  for (int s = 0; s < 11; ++s) {
    fill_batch(x, t, s);
    change(eager, s);
    change(graphed, s);
    {
      const Tensor l = eager.loss(x, t);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt_e.step();
    }
    const std::uint64_t before = step.counters().captures;
    (void)step.run([&] {
      const Tensor loss = graphed.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_g.step();
      return loss;
    });
    if (step.counters().captures != before) reasons.push_back(step.last_reason());
  }
  ASSERT_EQ(reasons.size(), 4u) << "a capture, then one a change";
  EXPECT_NE(reasons[1].find("no longer requires grad"), std::string::npos) << reasons[1];
  EXPECT_NE(reasons[2].find(".grad of parameter"), std::string::npos) << reasons[2];
  EXPECT_NE(reasons[2].find("dropped"), std::string::npos) << reasons[2];
  EXPECT_NE(reasons[3].find("requires grad"), std::string::npos) << reasons[3];
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(eager.w[i].to_vector<float>(), graphed.w[i].to_vector<float>()) << "parameter " << i;
  }
}

TEST_F(CudaStepGraph, AStepWhoseForwardUsesSeveralStreamsIsCapturedAndMatchesEager) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager(true), graphed(true);
  Stream side_e(kGpu), side_g(kGpu);
  Sgd opt_e(eager.w, {.lr = 0.02, .momentum = 0.9}), opt_g(graphed.w, {.lr = 0.02, .momentum = 0.9});
  StepGraph step(kGpu, {x, t});
  for (int s = 0; s < 5; ++s) {
    fill_batch(x, t, s);
    {
      const Tensor l = eager.loss(x, t, &side_e);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt_e.step();
    }
    (void)step.run([&] {
      const Tensor loss = graphed.loss(x, t, &side_g);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_g.step();
      return loss;
    });
  }
  EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
  // The captured graph as Graphviz DOT: a digraph with edges, longer with every node's parameters.
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string plain = ::testing::TempDir() + "step_graph.dot",
                    verbose = ::testing::TempDir() + "step_graph_verbose.dot";
  step.write_dot(plain);
  step.write_dot(verbose, /*verbose=*/true);
  const std::string a = slurp(plain), b = slurp(verbose);
  EXPECT_EQ(a.rfind("digraph", 0), 0u) << a.substr(0, 80);
  EXPECT_NE(a.find("->"), std::string::npos);
  EXPECT_GT(b.size(), a.size());
}

TEST_F(CudaStepGraph, CaptureUnsafeWorkIsRefusedByNameAndLeavesNoCaptureOpen) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp m;
  Sgd opt(m.w, {.lr = 0.01});
  StepGraph step(kGpu, {x, t});
  auto body = [&](bool peek) {
    return [&, peek] {
      const Tensor loss = m.loss(x, t);
      if (peek) (void)loss.item();  // a host read: refused inside the capture
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt.step();
      return loss;
    };
  };
  (void)step.run(body(false));  // warm-up
  GW_EXPECT_ERROR((void)step.run(body(true)), "item", "StepGraph");
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(current_stream(kGpu), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  // The StepGraph is usable afterwards.
  (void)step.run(body(false));
  (void)step.run(body(false));
  EXPECT_EQ(step.counters().captures, 1u);
  EXPECT_EQ(step.counters().replays, 2u);
}

// Note [Streams inside a capture]: an op on a stream that never joined the capture is refused by
// name before it runs (it would run once and be missing from every replay); nothing is written,
// no capture is left open, and the next steps capture and match the eager steps bitwise.
TEST_F(CudaStepGraph, AnOpOnAStreamOutsideTheCaptureIsRefusedAndTheNextStepsAreCorrect) {
  const Tensor x = zeros({32, 32}, kF32Gpu), t = zeros({32, 16}, kF32Gpu);
  Mlp eager, graphed;
  Sgd opt_e(eager.w, {.lr = 0.02}), opt_g(graphed.w, {.lr = 0.02});
  Stream lone(kGpu);
  Tensor offset;
  {
    StreamGuard on(lone);  // made on `lone`: reading it there orders nothing against the capture
    offset = randn({32, 16}, 7, kF32Gpu);
  }
  StepGraph step(kGpu, {x, t});
  auto body = [&](bool misuse) {
    return [&, misuse] {
      if (misuse) {
        StreamGuard on(lone);
        (void)mul(offset, 0.5);
      }
      const Tensor loss = graphed.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_g.step();
      return loss;
    };
  };
  auto eager_step = [&] {
    const Tensor l = eager.loss(x, t);
    backward(l, {.grad_write = GradWrite::kOverwrite});
    opt_e.step();
  };
  fill_batch(x, t, 0);
  eager_step();
  (void)step.run(body(false));  // warm-up, eager
  fill_batch(x, t, 1);
  GW_EXPECT_ERROR((void)step.run(body(true)), "not part of the capture", "StepGraph",
                  "wait_stream");
  for (cudaStream_t s : {current_stream(kGpu), lone.get()}) {
    cudaStreamCaptureStatus status{};
    ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  }
  EXPECT_EQ(step.counters().captures, 0u);
  for (int s = 1; s < 5; ++s) {
    fill_batch(x, t, s);
    eager_step();
    (void)step.run(body(false));
  }
  EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
  EXPECT_EQ(step.counters().replays, 4u);  // the capturing step's launch and three replays
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
}

// Note [Step inputs]: a new batch tensor every step (a loader's ring of prefetched batches, at
// other addresses) passed to run(batch, step) replays one graph that reads each step's batch
// through its slots: the parameters of the same steps run eagerly, bitwise; one capture.
TEST_F(CudaStepGraph, NewBatchTensorsEveryStepReplayOneGraphThroughItsSlots) {
  Mlp eager, graphed;
  AdamW opt_e(eager.w, {.lr = 0.01}), opt_g(graphed.w, {.lr = 0.01});
  StepGraph step(kGpu);
  std::vector<std::vector<Tensor>> ring(3);
  std::vector<float> eager_losses, graph_losses;
  for (int s = 0; s < 12; ++s) {
    std::vector<Tensor>& batch = ring[static_cast<std::size_t>(s) % ring.size()];
    batch = {randn({32, 32}, 100 + static_cast<std::uint64_t>(s), kF32Gpu),
             randn({32, 16}, 200 + static_cast<std::uint64_t>(s), kF32Gpu)};
    {
      const Tensor l = eager.loss(batch[0], batch[1]);
      backward(l, {.grad_write = GradWrite::kOverwrite});
      opt_e.step();
      eager_losses.push_back(static_cast<float>(l.item()));
    }
    const Tensor l = step.run(batch, [&](const std::vector<Tensor>& in) {
      const Tensor loss = graphed.loss(in[0], in[1]);
      backward(loss, {.grad_write = GradWrite::kOverwrite});
      opt_g.step();
      return loss;
    });
    graph_losses.push_back(static_cast<float>(l.item()));
  }
  EXPECT_EQ(step.counters().eager, 1u);
  EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
  EXPECT_EQ(step.counters().replays, 11u);
  EXPECT_EQ(graph_losses, eager_losses);  // every replay read its own step's batch
  for (std::size_t i = 0; i < eager.w.size(); ++i) {
    EXPECT_EQ(graphed.w[i].to_vector<float>(), eager.w[i].to_vector<float>()) << "parameter " << i;
  }
  // A batch of another shape captures again, saying why; a step reading the batch it captured by
  // reference instead of its argument is refused by name, and the StepGraph stays usable.
  const std::vector<Tensor> half = {randn({16, 32}, 7, kF32Gpu), randn({16, 16}, 8, kF32Gpu)};
  auto body = [&](const std::vector<Tensor>& in) {
    const Tensor loss = graphed.loss(in[0], in[1]);
    backward(loss, {.grad_write = GradWrite::kOverwrite});
    return loss;
  };
  (void)step.run(half, body);
  EXPECT_EQ(step.counters().captures, 2u);
  EXPECT_NE(step.last_reason().find("batch tensor 0"), std::string::npos) << step.last_reason();
  const std::vector<Tensor> other = {randn({32, 32}, 9, kF32Gpu), randn({32, 16}, 10, kF32Gpu)};
  GW_EXPECT_ERROR((void)step.run(other,
                                 [&](const std::vector<Tensor>&) {
                                   const Tensor loss = graphed.loss(other[0], other[1]);
                                   backward(loss, {.grad_write = GradWrite::kOverwrite});
                                   return loss;
                                 }),
                  "StepGraph::run", "batch tensor 0", "batch tensor 1", "linear",
                  "not through the slot", "argument");
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(current_stream(kGpu), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  const Tensor again = step.run(other, body);
  const Tensor ref = graphed.loss(other[0], other[1]);
  EXPECT_EQ(again.item(), ref.item());
}

}  // namespace
}  // namespace graphward
