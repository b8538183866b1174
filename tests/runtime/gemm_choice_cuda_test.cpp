// Note [Choosing a GEMM algorithm]: a GEMM shape's first use times cuBLASLt's candidates and keeps
// the fastest. Every candidate must compute the same GEMM (else the choice changes results); the
// timing runs write scratch memory only (a first use that accumulates accumulates once); the
// choice is one per process, never made inside a capture, and never changes.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "graphward/capture/stream_capture.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/kernels/gemm.h"
#include "graphward/kernels/reduce.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::rel_error;

constexpr Device kGpu = Device::cuda(0);
constexpr double kGemmTol = 1e-4;

std::vector<double> as_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// The choices made so far for (m, n, k, kind).
std::vector<debug::GemmChoice> choices_for(long long m, long long n, long long k,
                                           const std::string& kind) {
  std::vector<debug::GemmChoice> out;
  for (const auto& c : debug::gemm_choices(kGpu)) {
    if (c.m == m && c.n == n && c.k == k && c.kind == kind) out.push_back(c);
  }
  return out;
}

// Restores the process's tuning setting at the end of a test.
class TuningGuard {
 public:
  TuningGuard() : was_(gemm_tuning()) {}
  ~TuningGuard() { set_gemm_tuning(was_); }

 private:
  bool was_;
};

class CudaGemmChoice : public testing::PoisonedCudaTest {};

struct LtHandleOwner {
  LtHandleOwner() { GW_CUBLAS_CHECK(cublasLtCreate(&handle)); }
  ~LtHandleOwner() { cublasLtDestroy(handle); }
  cublasLtHandle_t handle = nullptr;
};

TEST_F(CudaGemmChoice, EveryCandidateOfEveryShapeAndEpilogueComputesTheSameGemm) {
  // Whatever the timing picks must be right: each of the heuristic's candidates, run on its own,
  // against the CPU reference — GEMMs (both transposes, the classifier's narrow shapes, odd and
  // one-element ones, beta 0 and 1), the fused bias gradient, and a forward bias + ReLU epilogue.
  LtHandleOwner lt;
  DeviceBuffer workspace(kGpu, kBlasWorkspaceBytes);
  const cudaStream_t stream = current_stream(kGpu);
  struct Shape3 {
    std::int64_t m, n, k;
  };
  std::uint64_t seed = 9100;
  int candidates_run = 0;
  for (const Shape3 s : {Shape3{128, 10, 256}, Shape3{10, 256, 128}, Shape3{33, 65, 31},
                         Shape3{1, 1, 1}, Shape3{512, 64, 64}, Shape3{64, 10, 512}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (int kind = 0; kind < 3; ++kind) {  // 0: gemm, 1: bias gradient, 2: bias + ReLU
          if (kind > 0 && !(ta == (kind == 1) && tb == (kind == 2))) continue;
          kernels::LtOptions options;
          options.bias_grad_a = kind == 1;
          options.split_k = false;
          if (kind == 2) options.epilogue = kernels::Epilogue::kBiasRelu;
          kernels::LtGemm plan(lt.handle, ta, tb, s.m, s.n, s.k, workspace.bytes(), 256, options);
          if (!plan.usable()) continue;
          const float beta = kind == 2 ? 0.f : 1.f;
          const Tensor a = randn({s.m * s.k}, seed++), b = randn({s.k * s.n}, seed++),
                       c0 = randn({s.m * s.n}, seed++), bias = randn({s.n}, seed++);
          std::vector<float> ref = c0.to_vector<float>(), ref_db(s.m, 0.f);
          kernels::cpu::gemm<float>(ta, tb, s.m, s.n, s.k, 1.f, a.data<float>(), b.data<float>(),
                                    beta, ref.data());
          if (kind == 1) {  // Σ_k op(A)[i, k]: op(A) = Aᵀ, A stored [k, m]
            kernels::cpu::column_sum<float>(ref_db.data(), a.data<float>(), nullptr, 1.f, s.k, s.m,
                                            false);
          }
          if (kind == 2) {
            for (std::int64_t i = 0; i < s.m; ++i) {
              for (std::int64_t j = 0; j < s.n; ++j) {
                float& v = ref[i * s.n + j];
                v = std::max(0.f, v + bias.data<float>()[j]);
              }
            }
          }
          const Tensor ga = a.to(kGpu), gb = b.to(kGpu), gbias = bias.to(kGpu);
          for (int i = 0; i < plan.candidates(); ++i) {
            plan.use(i);
            const Tensor gc = c0.to(kGpu), gdb = zeros({s.m}, TensorOptions{DType::kFloat32, kGpu});
            plan.run(1.f, ga.data<float>(), gb.data<float>(), beta, gc.data<float>(),
                     workspace.data(), workspace.bytes(), stream,
                     kind == 1 ? gdb.data<float>() : nullptr,
                     kind == 2 ? gbias.data<float>() : nullptr);
            const std::string what = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                     std::to_string(s.k) + " ta=" + std::to_string(ta) +
                                     " tb=" + std::to_string(tb) + " kind=" + std::to_string(kind) +
                                     " candidate " + std::to_string(i) + ": " + plan.describe();
            EXPECT_LT(rel_error(as_double(gc.to_vector<float>()), as_double(ref)), kGemmTol)
                << what;
            if (kind == 1) {
              EXPECT_LT(rel_error(as_double(gdb.to_vector<float>()), as_double(ref_db)), kGemmTol)
                  << what << " (bias gradient)";
            }
            ++candidates_run;
          }
        }
      }
    }
  }
  // The classifier's shapes are why the choice exists: the heuristic must offer alternatives.
  EXPECT_GT(candidates_run, 40);
}

TEST_F(CudaGemmChoice, AFirstUseThatAccumulatesAccumulatesOnceAndWritesTheBiasGradientOnce) {
  // The timing launches every candidate several times; were they to write the caller's C, a first
  // use with beta = 1 would add the product many times over. Shapes no other test uses.
  TuningGuard guard;
  set_gemm_tuning(true);
  const cudaStream_t stream = current_stream(kGpu);
  std::uint64_t seed = 9300;
  for (const auto [m, n, k] :
       {std::array<std::int64_t, 3>{131, 11, 257}, std::array<std::int64_t, 3>{11, 259, 133}}) {
    const Tensor a = randn({m * k}, seed++), b = randn({k * n}, seed++),
                 c0 = randn({m * n}, seed++);
    const Tensor gc = c0.to(kGpu);
    graphward::gemm(kGpu, stream, false, true, m, n, k, 1.f, a.to(kGpu).data<float>(),
                    b.to(kGpu).data<float>(), 1.f, gc.data<float>());
    std::vector<float> ref = c0.to_vector<float>();
    kernels::cpu::gemm<float>(false, true, m, n, k, 1.f, a.data<float>(), b.data<float>(), 1.f,
                              ref.data());
    EXPECT_LT(rel_error(as_double(gc.to_vector<float>()), as_double(ref)), kGemmTol)
        << m << "x" << n << "x" << k;
    const auto made = choices_for(m, n, k, "gemm");
    ASSERT_EQ(made.size(), 1u) << m << "x" << n << "x" << k;
    EXPECT_TRUE(made[0].tuned);
    EXPECT_GT(made[0].first_us, 0.0);
    EXPECT_LE(made[0].chosen_us, made[0].first_us);
    EXPECT_GT(made[0].alternative_us, 0.0);  // cuBLAS's own GEMM, timed too
    // Every candidate as timed, readable: the heuristic's first and the chosen one as reported.
    ASSERT_EQ(made[0].candidate_us.size(), static_cast<std::size_t>(made[0].candidates));
    EXPECT_EQ(made[0].candidate_us[0].second, made[0].first_us);
    EXPECT_EQ(made[0].candidate_us[static_cast<std::size_t>(made[0].chosen)].second,
              made[0].chosen_us);
    EXPECT_EQ(made[0].candidate_us[static_cast<std::size_t>(made[0].chosen)].first, made[0].algo);
    for (const auto& [algo, us] : made[0].candidate_us)
      EXPECT_EQ(algo.rfind("algo ", 0), 0u) << algo;

    // dW [m, n] = dYᵀ·X (+= C) with db [m] written: the bias gradient's first use.
    const Tensor dy = randn({k, m}, seed++), x = randn({k, n}, seed++), w0 = randn({m, n}, seed++);
    const Tensor gw = w0.to(kGpu), gdb = full({m}, 7.f, TensorOptions{DType::kFloat32, kGpu});
    const bool fused = graphward::gemm_bias_grad(
        kGpu, stream, true, false, m, n, k, 1.f, dy.to(kGpu).data<float>(),
        x.to(kGpu).data<float>(), 1.f, gw.data<float>(), gdb.data<float>());
    const auto fused_choice = choices_for(m, n, k, "gemm+bias_grad");
    ASSERT_EQ(fused_choice.size(), 1u);
    if (!fused) {  // declined (its GEMM and a column sum apart were faster): nothing written
      EXPECT_TRUE(fused_choice[0].declined);
      EXPECT_EQ(gw.to_vector<float>(), w0.to_vector<float>());
      EXPECT_EQ(gdb.to_vector<float>(), std::vector<float>(m, 7.f));
      continue;
    }
    EXPECT_FALSE(fused_choice[0].declined);
    std::vector<float> ref_w = w0.to_vector<float>(), ref_db(m, 0.f);
    kernels::cpu::gemm<float>(true, false, m, n, k, 1.f, dy.data<float>(), x.data<float>(), 1.f,
                              ref_w.data());
    kernels::cpu::column_sum<float>(ref_db.data(), dy.data<float>(), nullptr, 1.f, k, m, false);
    EXPECT_LT(rel_error(as_double(gw.to_vector<float>()), as_double(ref_w)), kGemmTol);
    EXPECT_LT(rel_error(as_double(gdb.to_vector<float>()), as_double(ref_db)), kGemmTol);
  }
}

TEST_F(CudaGemmChoice, OneChoiceAShapeForEveryThreadNoneTimedInACaptureAndNoneChangedLater) {
  TuningGuard guard;
  set_gemm_tuning(true);
  const TensorOptions f32{DType::kFloat32, kGpu};
  // Four threads, one new shape at once: one choice, and every thread's plan runs it (bitwise the
  // same results from the same inputs).
  {
    const std::int64_t m = 97, n = 13, k = 191;
    const Tensor a = randn({m, k}, 9400).to(kGpu), b = randn({n, k}, 9401).to(kGpu);
    std::vector<std::vector<float>> outs(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        Stream s(kGpu);
        const Tensor c = zeros({m, n}, f32);
        s.wait_stream(current_stream(kGpu));  // the inputs' copies
        graphward::gemm(kGpu, s.get(), false, true, m, n, k, 1.f, a.data<float>(), b.data<float>(),
                        0.f, c.data<float>());
        s.synchronize();
        outs[t] = c.to_vector<float>();
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(choices_for(m, n, k, "gemm").size(), 1u);
    for (int t = 1; t < 4; ++t) EXPECT_EQ(outs[t], outs[0]) << "thread " << t;
  }
  // First used inside a capture: the heuristic's choice, untimed, for good — the eager use after
  // it makes no second choice, and the replay and the eager call agree bitwise.
  {
    const std::int64_t m = 89, n = 15, k = 187;
    const Tensor a = randn({m, k}, 9402).to(kGpu), b = randn({n, k}, 9403).to(kGpu);
    const Tensor c_graph = zeros({m, n}, f32), c_eager = zeros({m, n}, f32);
    Stream s(kGpu);
    s.wait_stream(current_stream(kGpu));
    // The stream's cuBLAS workspace is allocated on its first GEMM, which must not be captured.
    graphward::gemm(kGpu, s.get(), false, true, 2, 2, 2, 1.f, a.data<float>(), b.data<float>(), 0.f,
                    c_eager.data<float>());
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    graphward::gemm(kGpu, s.get(), false, true, m, n, k, 1.f, a.data<float>(), b.data<float>(), 0.f,
                    c_graph.data<float>());
    ASSERT_EQ(cudaStreamEndCapture(s.get(), &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s.get()), cudaSuccess);
    graphward::gemm(kGpu, s.get(), false, true, m, n, k, 1.f, a.data<float>(), b.data<float>(), 0.f,
                    c_eager.data<float>());
    s.synchronize();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    const auto made = choices_for(m, n, k, "gemm");
    ASSERT_EQ(made.size(), 1u);
    EXPECT_FALSE(made[0].tuned);
    EXPECT_EQ(made[0].chosen, 0);
    EXPECT_EQ(c_graph.to_vector<float>(), c_eager.to_vector<float>());
  }
  // Tuning off: the heuristic's choice, untimed.
  {
    set_gemm_tuning(false);
    const std::int64_t m = 83, n = 17, k = 181;
    const Tensor a = randn({m, k}, 9404).to(kGpu), b = randn({n, k}, 9405).to(kGpu);
    const Tensor c = zeros({m, n}, f32);
    graphward::gemm(kGpu, current_stream(kGpu), false, true, m, n, k, 1.f, a.data<float>(),
                    b.data<float>(), 0.f, c.data<float>());
    const auto made = choices_for(m, n, k, "gemm");
    ASSERT_EQ(made.size(), 1u);
    EXPECT_FALSE(made[0].tuned);
    EXPECT_EQ(made[0].chosen, 0);
    EXPECT_TRUE(made[0].candidate_us.empty());  // nothing timed
  }
}

}  // namespace
}  // namespace graphward
