// Optimizers on the GPU: against the CPU reference, and captured into a CUDA graph — a replayed
// step equals an eager one bitwise, advances the device step count, and sees a new learning rate.
#include <cuda_runtime_api.h>

#include <memory>

#include "runtime/dlpack_abi.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::rel_error;

constexpr Device kGpu = Device::cuda(0);

class CudaOptim : public testing::PoisonedCudaTest {};

std::vector<Tensor> params_on(Device d) {
  std::vector<Tensor> p;
  const Shape shapes[] = {{33, 65}, {65}, {1000}, {7, 13}};
  std::uint64_t seed = 50;
  for (const Shape& s : shapes) p.push_back(randn(s, seed++).to(d).set_requires_grad(true));
  return p;
}

void set_grads(const std::vector<Tensor>& ps, int step) {
  std::uint64_t seed = 100 + 10 * static_cast<std::uint64_t>(step);
  for (const Tensor& p : ps) {
    const Tensor g = randn(p.shape(), seed++).to(p.device());
    if (p.grad().defined()) {
      NoGradGuard no_grad;
      copy_(p.grad(), g);  // in place: the buffer a captured step reads
    } else {
      p.grad() = g;
    }
  }
}

template <class Opt, class Options>
void expect_matches_cpu(const Options& o, const char* what) {
  const std::vector<Tensor> cpu = params_on(Device::cpu()), gpu = params_on(kGpu);
  Opt a(cpu, o), b(gpu, o);
  for (int s = 0; s < 5; ++s) {
    set_grads(cpu, s);
    set_grads(gpu, s);
    a.step();
    b.step();
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_LT(rel_error(gpu[i], cpu[i]), 1e-6) << what << " parameter " << i;
  }
  EXPECT_EQ(b.steps(), 5);
}

TEST_F(CudaOptim, SgdAndAdamWMatchTheCpuReference) {
  expect_matches_cpu<Sgd>(SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}, "sgd");
  expect_matches_cpu<Sgd>(SgdOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, "nesterov");
  expect_matches_cpu<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.1}, "adamw");
}

// Parameter groups on the GPU: each parameter's weight decay its group's (carried by its slice of
// the multi-tensor launch), as the CPU reference steps it; a group without decay is stepped
// bitwise as an optimizer without decay steps it.
// Note [Master weights]: bfloat16 parameters on the GPU, their masters and the parameters (the
// masters rounded, in the same launch) against the CPU reference; more parameters than a launch
// takes, so that several launches run.
template <class Opt, class Options>
void expect_bf16_matches_cpu(const Options& o, const char* what) {
  std::vector<Tensor> cpu, gpu;
  for (std::size_t i = 0; i < kernels::kMultiTensorMax + 5; ++i) {
    const Tensor p = cast(randn({17 + static_cast<std::int64_t>(i) % 5, 3}, 70 + i),
                          DType::kBFloat16);
    cpu.push_back(p.detach().set_requires_grad(true));
    gpu.push_back(p.to(kGpu).detach().set_requires_grad(true));
  }
  Opt a(cpu, o), b(gpu, o);
  for (int s = 0; s < 4; ++s) {
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      const Tensor g = cast(randn(cpu[i].shape(), 500 + 100 * s + i), DType::kBFloat16);
      cpu[i].grad() = g;
      gpu[i].grad() = g.to(kGpu);
    }
    a.step();
    b.step();
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const Tensor& master = b.master(i);
    EXPECT_LT(rel_error(master, a.master(i)), 1e-6) << what << " master " << i;
    EXPECT_EQ(cast(gpu[i], DType::kFloat32).to_vector<float>(),
              cast(cast(master, DType::kBFloat16), DType::kFloat32).to_vector<float>())
        << what << ": parameter " << i << " is its master rounded";
    EXPECT_LT(rel_error(cast(gpu[i], DType::kFloat32), cast(cpu[i], DType::kFloat32)), 1e-2)
        << what << " parameter " << i;
  }
  const Tensor na = clip_grad_norm(cpu, 0.5), nb = clip_grad_norm(gpu, 0.5);
  EXPECT_NEAR(nb.item(), na.item(), 1e-5 * na.item());
  EXPECT_LT(rel_error(cast(gpu[0].grad(), DType::kFloat32), cast(cpu[0].grad(), DType::kFloat32)),
            1e-2);
}

TEST_F(CudaOptim, Bf16ParametersThroughFloat32MastersMatchTheCpuReference) {
  expect_bf16_matches_cpu<Sgd>(SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01},
                               "sgd");
  expect_bf16_matches_cpu<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.1}, "adamw");
}

TEST_F(CudaOptim, ParameterGroupsMatchTheCpuReferenceAndAnOptimizerOfTheirOwnDecay) {
  for (bool adamw : {false, true}) {
    const std::vector<Tensor> cpu = params_on(Device::cpu()), gpu = params_on(kGpu);
    const std::vector<Tensor> alone = params_on(kGpu);  // the vectors, stepped without decay
    auto make = [&](const std::vector<ParamGroup>& groups) -> std::unique_ptr<Optimizer> {
      if (adamw)
        return std::make_unique<AdamW>(groups, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
      return std::make_unique<Sgd>(groups,
                                   SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1});
    };
    const std::unique_ptr<Optimizer> a = make(decay_matrices_only(cpu)),
                                     b = make(decay_matrices_only(gpu)),
                                     c = make(
                                         {{.params = {alone[1], alone[2]}, .weight_decay = 0.0}});
    for (int s = 0; s < 5; ++s) {
      set_grads(cpu, s);
      set_grads(gpu, s);
      set_grads(alone, s);
      a->step();
      b->step();
      c->step();
    }
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_LT(rel_error(gpu[i], cpu[i]), 1e-6) << "adamw=" << adamw << " parameter " << i;
    }
    // params_on's [65] and [1000] vectors: no decay in their group, the same bits as alone.
    for (std::size_t i : {1u, 2u}) {
      EXPECT_EQ(gpu[i].to_vector<float>(), alone[i].to_vector<float>()) << "adamw=" << adamw;
    }
  }
}

// Note [Multi-tensor step]: more parameters than one launch takes (three launches), of sizes from
// one element to more than the blocks a parameter gets can cover without striding, some without a
// .grad (skipped: unchanged): every parameter as the CPU reference, and the step counted once a
// step.
TEST_F(CudaOptim, AStepOverMoreParametersThanOneLaunchTakesMatchesTheCpuReference) {
  auto make = [](Device d) {
    std::vector<Tensor> p;
    for (std::int64_t i = 0; i < 150; ++i) {
      const std::int64_t n = i == 7 ? 1100003 : i == 70 ? 1 : 1 + (i * 37) % 900;
      p.push_back(randn({n}, 1000 + static_cast<std::uint64_t>(i)).to(d).set_requires_grad(true));
    }
    return p;
  };
  auto grads = [](const std::vector<Tensor>& ps, int step) {
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (i % 11 == 3) continue;  // never a .grad
      const Tensor g = randn(ps[i].shape(), 5000 + 200 * static_cast<std::uint64_t>(step) + i);
      ps[i].grad() = g.to(ps[i].device());
    }
  };
  for (int which = 0; which < 2; ++which) {
    const std::vector<Tensor> cpu = make(Device::cpu()), gpu = make(kGpu);
    const std::vector<Tensor> start = make(Device::cpu());
    std::unique_ptr<Optimizer> a, b;
    if (which == 0) {
      a = std::make_unique<Sgd>(cpu, SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
      b = std::make_unique<Sgd>(gpu, SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
    } else {
      a = std::make_unique<AdamW>(cpu, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
      b = std::make_unique<AdamW>(gpu, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    }
    for (int s = 0; s < 3; ++s) {
      grads(cpu, s);
      grads(gpu, s);
      a->step();
      b->step();
    }
    EXPECT_EQ(b->steps(), 3);
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      if (i % 11 == 3) {
        EXPECT_EQ(gpu[i].to(Device::cpu()).to_vector<float>(), start[i].to_vector<float>()) << i;
      } else {
        EXPECT_LT(rel_error(gpu[i], cpu[i]), 1e-6) << (which == 0 ? "sgd" : "adamw") << " " << i;
      }
    }
  }
}

// A float32 array 4 bytes past a cudaMalloc'd (256-byte aligned) address, handed over by DLPack
// with that byte_offset: memory graphward did not allocate, not 16-byte aligned.
struct OffsetArray {
  testing::dl::ManagedTensor m{};
  std::int64_t shape[1];
  float* base = nullptr;
  explicit OffsetArray(const std::vector<float>& values)
      : shape{static_cast<std::int64_t>(values.size())} {
    GW_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base), (values.size() + 1) * sizeof(float)));
    GW_CUDA_CHECK(
        cudaMemcpy(base + 1, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice));
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    m.dl_tensor = {base, {testing::dl::kCUDA, 0}, 1, {2, 32, 1}, shape, nullptr, sizeof(float)};
    m.deleter = [](testing::dl::ManagedTensor*) {};
  }
  ~OffsetArray() {
    GW_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
    GW_CUDA_CHECK_NOTHROW(cudaFree(base));
  }
  OffsetArray(const OffsetArray&) = delete;
  OffsetArray& operator=(const OffsetArray&) = delete;
};

// Note [Multi-tensor step]: AdamW reads four elements a load only where a parameter's four arrays
// are 16-byte aligned; a parameter, or a gradient, that is not takes the one-element path, with
// the same values, bit for bit. Sizes around a multiple of four, the parameter misaligned in one
// and the gradient in the other, beside aligned parameters, one the misaligned one's twin.
TEST_F(CudaOptim, AdamWOnArraysNotSixteenByteAlignedMatchesTheCpuReference) {
  for (const std::int64_t n : {1, 4, 1031, 4096}) {
    const std::vector<Tensor> cpu = {randn({n}, 61).set_requires_grad(true),
                                     randn({n}, 62).set_requires_grad(true),
                                     randn({n}, 63).set_requires_grad(true)};
    OffsetArray p0(cpu[0].to_vector<float>()), g1(std::vector<float>(n, 0.f));
    const Tensor gp0 = from_dlpack(&p0.m);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(gp0.raw_data()) % 16, 4u) << "not misaligned";
    const std::vector<Tensor> gpu = {gp0.set_requires_grad(true),
                                     cpu[1].to(kGpu).set_requires_grad(true),
                                     cpu[2].to(kGpu).set_requires_grad(true),
                                     cpu[0].to(kGpu).set_requires_grad(true)};  // 0's aligned twin
    gpu[1].grad() = from_dlpack(&g1.m);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(gpu[1].grad().raw_data()) % 16, 4u);
    AdamW a(cpu, {.lr = 0.01, .weight_decay = 0.1}), b(gpu, {.lr = 0.01, .weight_decay = 0.1});
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < cpu.size(); ++i) {
        const Tensor g = randn({n}, 700 + 10 * static_cast<std::uint64_t>(step) + i);
        cpu[i].grad() = g;
        NoGradGuard no_grad;
        if (i == 1) {
          copy_(gpu[1].grad(), g.to(kGpu));  // in the misaligned array
        } else {
          gpu[i].grad() = g.to(kGpu);
        }
        if (i == 0) gpu[3].grad() = g.to(kGpu);
      }
      a.step();
      b.step();
    }
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_LT(rel_error(gpu[i], cpu[i]), 1e-6) << "n " << n << " parameter " << i;
    }
    // The one-element path and the four-element path give the same bits.
    EXPECT_EQ(gpu[0].to(Device::cpu()).to_vector<float>(),
              gpu[3].to(Device::cpu()).to_vector<float>())
        << "n " << n;
  }
}

// The norm of gradients from one element to tens of millions (one block of sum_squares to its
// most blocks, each thread many elements), float32 and bfloat16: the CPU's within 1e-6, the same
// bits on every run (the parts and their sum in a fixed order), every gradient scaled.
TEST_F(CudaOptim, ClipGradNormOfLargeGradientsIsTheCpusAndTheSameEveryRun) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Tensor> cpu, gpu;
    std::uint64_t seed = 70;
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{1023}, std::int64_t{32 * 1024 + 1},
                           std::int64_t{3'000'001}, std::int64_t{20'000'000}}) {
      const Tensor g = cast(randn({n}, seed++), dt);
      cpu.push_back(zeros({n}, {dt, Device::cpu()}).set_requires_grad(true));
      gpu.push_back(zeros({n}, {dt, kGpu}).set_requires_grad(true));
      cpu.back().grad() = g;
      gpu.back().grad() = g.to(kGpu);
    }
    const double a = clip_grad_norm(cpu, 1.0).item();
    std::vector<Tensor> again;
    for (const Tensor& p : gpu) again.push_back(p.grad().clone());  // before the scaling
    const float b = clip_grad_norm(gpu, 1.0).item();
    EXPECT_NEAR(b, a, 1e-6 * a);
    for (std::size_t i = 0; i < gpu.size(); ++i) gpu[i].grad() = again[i];
    EXPECT_EQ(clip_grad_norm(gpu, 1.0).item(), b) << "a second run's norm";
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_LT(
          rel_error(cast(gpu[i].grad(), DType::kFloat32), cast(cpu[i].grad(), DType::kFloat32)),
          dt == DType::kFloat32 ? 1e-6 : 1e-2)
          << i;
    }
  }
}

TEST_F(CudaOptim, ClipGradNormMatchesTheCpuReference) {
  const std::vector<Tensor> cpu = params_on(Device::cpu()), gpu = params_on(kGpu);
  set_grads(cpu, 0);
  set_grads(gpu, 0);
  const double a = clip_grad_norm(cpu, 2.0).item(), b = clip_grad_norm(gpu, 2.0).item();
  EXPECT_NEAR(b, a, 1e-5 * a);
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_LT(rel_error(gpu[i].grad(), cpu[i].grad()), 1e-6) << i;
  }
}

// Step counts are per parameter on the device too (Note [Multi-tensor step]): over 150 parameters
// (three launches), some frozen for the first steps and some never given a gradient, each
// parameter's count and value follow the CPU reference, and steps without any gradient count for
// none.
TEST_F(CudaOptim, StepCountsArePerParameterAcrossLaunchesAsOnTheCpu) {
  auto make = [](Device d) {
    std::vector<Tensor> p;
    for (std::int64_t i = 0; i < 150; ++i) {
      p.push_back(randn({1 + (i * 13) % 300}, 7000 + static_cast<std::uint64_t>(i))
                      .to(d)
                      .set_requires_grad(true));
    }
    return p;
  };
  const std::vector<Tensor> cpu = make(Device::cpu()), gpu = make(kGpu);
  AdamW a(cpu, {.lr = 0.01, .weight_decay = 0.1}), b(gpu, {.lr = 0.01, .weight_decay = 0.1});
  a.step();  // no gradient anywhere: nothing counts
  b.step();
  EXPECT_EQ(b.steps(), 0);
  for (int s = 0; s < 5; ++s) {
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      if (i % 7 == 2 || (i % 5 == 1 && s < 3)) continue;  // never, or frozen for three steps
      const Tensor g = randn(cpu[i].shape(), 9000 + 300 * static_cast<std::uint64_t>(s) + i);
      cpu[i].grad() = g;
      gpu[i].grad() = g.to(kGpu);
    }
    a.step();
    b.step();
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const std::int64_t want = i % 7 == 2 ? 0 : i % 5 == 1 ? 2 : 5;
    EXPECT_EQ(a.steps(i), want) << i;
    EXPECT_EQ(b.steps(i), want) << i;
    EXPECT_LT(rel_error(gpu[i], cpu[i]), 1e-6) << i;
  }
  EXPECT_EQ(b.steps(), 5);
}

// A NaN gradient makes every gradient NaN, on the device as on the CPU (torch's behaviour).
TEST_F(CudaOptim, ClipGradNormWithANanGradientMakesEveryGradientNan) {
  const Tensor p = zeros({2}, {DType::kFloat32, kGpu}).set_requires_grad(true);
  const Tensor q = zeros({2}, {DType::kFloat32, kGpu}).set_requires_grad(true);
  p.grad() = from_vector(std::vector<float>{NAN, 1.f}, {2}, kGpu);
  q.grad() = from_vector(std::vector<float>{3.f, 4.f}, {2}, kGpu);
  EXPECT_TRUE(std::isnan(clip_grad_norm({p, q}, 1.0).item()));
  for (float v : q.grad().to_vector<float>()) EXPECT_TRUE(std::isnan(v));
}

// Captures `body` on a stream of its own (with a graph memory pool), returns the executable.
cudaGraphExec_t capture(Stream& s, GraphMemoryPool& pool, const std::function<void()>& body) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    GraphPoolScope scope(pool);
    body();
  }
  EXPECT_EQ(cudaStreamEndCapture(s.get(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  return exec;
}

TEST_F(CudaOptim, ACapturedStepReplaysAsEagerStepsDoAndCountsItsSteps) {
  for (int which = 0; which < 2; ++which) {
    Stream s(kGpu);
    StreamGuard on(s);
    const std::vector<Tensor> eager = params_on(kGpu), graphed = params_on(kGpu);
    auto make = [which](const std::vector<Tensor>& p) -> std::unique_ptr<Optimizer> {
      if (which == 0) return std::make_unique<Sgd>(p, SgdOptions{.lr = 0.05, .momentum = 0.9});
      return std::make_unique<AdamW>(p, AdamWOptions{.lr = 0.01});
    };
    auto a = make(eager), b = make(graphed);
    set_grads(eager, 0);
    set_grads(graphed, 0);
    GraphMemoryPool pool(kGpu);
    ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
    // Step and clip, captured once; each replay reads the .grads in place.
    cudaGraphExec_t exec = capture(s, pool, [&] {
      (void)clip_grad_norm(graphed, 10.0);
      b->step();
    });
    EXPECT_EQ(b->steps(), 0) << "capturing ran nothing";
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {  // a new learning rate, written between replays
        a->set_lr(a->lr() / 2);
        b->set_lr(b->lr() / 2);
      }
      set_grads(eager, step);
      set_grads(graphed, step);
      (void)clip_grad_norm(eager, 10.0);
      a->step();
      ASSERT_EQ(cudaGraphLaunch(exec, s.get()), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
    EXPECT_EQ(b->steps(), 4);
    for (std::size_t i = 0; i < eager.size(); ++i) {
      EXPECT_EQ(graphed[i].to_vector<float>(), eager[i].to_vector<float>())
          << (which == 0 ? "sgd" : "adamw") << " parameter " << i;
    }
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  }
}

// Note [Learning-rate schedule] on the GPU: scheduled steps match the CPU reference's, and a
// captured step replayed computes each replay's rate from the device counts — bitwise the eager
// scheduled steps, with nothing written from the host between replays.
TEST_F(CudaOptim, AScheduledLearningRateMatchesTheCpuAndAdvancesInReplays) {
  const LrSchedule sched{.warmup_steps = 2, .total_steps = 7, .final_lr_fraction = 0.1};
  expect_matches_cpu<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.1, .schedule = sched},
                            "scheduled adamw");
  expect_matches_cpu<Sgd>(SgdOptions{.lr = 0.05, .momentum = 0.9, .schedule = sched},
                          "scheduled sgd");
  Stream s(kGpu);
  StreamGuard on(s);
  const std::vector<Tensor> eager = params_on(kGpu), graphed = params_on(kGpu);
  AdamW a(eager, {.lr = 0.01, .schedule = sched}), b(graphed, {.lr = 0.01, .schedule = sched});
  set_grads(eager, 0);
  set_grads(graphed, 0);
  GraphMemoryPool pool(kGpu);
  ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  cudaGraphExec_t exec = capture(s, pool, [&] { b.step(); });
  for (int step = 0; step < 10; ++step) {  // warm-up, decay and past the end
    set_grads(eager, step);
    set_grads(graphed, step);
    a.step();
    ASSERT_EQ(cudaGraphLaunch(exec, s.get()), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  EXPECT_EQ(b.steps(), 10);
  for (std::size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(graphed[i].to_vector<float>(), eager[i].to_vector<float>()) << "parameter " << i;
  }
  // And the eager scheduled steps are steps at lr_at(t): an unscheduled optimizer stepped with
  // set_lr(lr_at(t)) lands within a float's rounding of the rate (the device's cosine against the
  // host's).
  const std::vector<Tensor> manual = params_on(kGpu);
  AdamW m(manual, {.lr = 0.01});
  for (int step = 0; step < 10; ++step) {
    set_grads(manual, step);
    m.set_lr(a.lr_at(step));
    m.step();
  }
  for (std::size_t i = 0; i < eager.size(); ++i) {
    EXPECT_LT(rel_error(manual[i], eager[i]), 1e-6) << "parameter " << i;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

}  // namespace
}  // namespace graphward
