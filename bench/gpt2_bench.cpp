// GPT-2 training steps (Google Benchmark): examples/gpt2.h's model and Gpt2Trainer (llm.c's
// recipe: AdamW 0.9/0.95 with decay on the matrices, the device-side schedule, clipping at 1.0),
// bfloat16 under Autocast with TF32 on for what stays float32, one whole step per iteration:
//
//   Gpt2/batch:B/seq:T/depth:L/mode:M     (width 64 · heads, heads 12 at depth 12: llm.c's d12;
//                                          vocabulary 50257 padded to 50304)
//       mode 0: eager; mode 1: the backward a BackwardGraph replay; mode 2: the whole step one
//       StepGraph replay (the batch copied into its slots).
//
// Every step gets its own batch tensors (four batches in turn, each a different tensor), as a
// training loop does. The manual time: CUDA events on the caller's stream around the step,
// synchronized every iteration; loop_us: steps back to back, nothing synchronized between them,
// CUDA events around blocks of 10 (the figure a training loop gets); tokens_per_s from loop_us;
// model_tflops: 6 · parameters (the position table left out) + 12 · depth · seq · width flops a
// token (nanoGPT's and llm.c's estimate) at loop_us; peak_mib: the high-water mark of the
// stream-ordered pool graphward allocates from and of CUDA graphs' memory, while the row ran;
// captures while timed. scripts/llmc.sh and scripts/gpt2_torch.py --time measure llm.c and
// PyTorch at the same shapes.
//
//   graphward_bench_gpt2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/bench_models.h"
#include "examples/device_peak.h"
#include "examples/gpt2.h"

namespace gw = graphward;
namespace ex = graphward::examples;

namespace {

constexpr gw::Device kDev = gw::bench::kDev;

void gpt2(benchmark::State& state) {
  if (gw::bench::skip_without_gpu(state)) return;
  const std::int64_t depth = state.range(2);
  ex::Gpt2TrainConfig c;
  c.model.batch = state.range(0);
  c.model.seq = state.range(1);
  c.model.depth = depth;
  c.model.heads = depth >= 12 ? 12 : std::max<std::int64_t>(depth, 1);
  c.model.width = 64 * c.model.heads;
  c.model.batches = 4;
  c.warmup_steps = 10;
  c.total_steps = 100000;
  c.bf16 = true;
  const auto mode = static_cast<ex::Mode>(state.range(3));
  {
    gw::DeviceGuard guard(kDev);
    (void)cudaDeviceSynchronize();
  }
  ex::reset_device_peak(kDev);
  ex::Gpt2Trainer trainer(c, kDev, mode);
  const ex::Batches d = ex::Gpt2Model::data(c.model, kDev);
  int i = 0;
  auto step = [&] {
    const std::size_t b = static_cast<std::size_t>(i++) % d.x.size();
    return trainer.step({d.x[b]}, {d.t[b]});
  };
  for (int w = 0; w < 5; ++w) (void)step();  // warm-up, capture
  const std::uint64_t captures = trainer.captures();
  const double loop_us =
      gw::bench::time_steps(state, gw::current_stream(kDev), [&] { (void)step(); });
  const double tokens = static_cast<double>(c.model.batch * c.model.seq);
  const double flops_per_token = ex::Gpt2Model::flops_per_token(c.model);
  state.counters["loop_us"] = loop_us;
  state.counters["tokens_per_s"] = tokens / (loop_us * 1e-6);
  state.counters["model_tflops"] = tokens * flops_per_token / (loop_us * 1e-6) / 1e12;
  state.counters["peak_mib"] = ex::device_peak_mib(kDev);
  state.counters["captures"] = static_cast<double>(trainer.captures() - captures);
  state.SetLabel(ex::mode_name(mode));
}

}  // namespace

// llm.c's three shapes at GPT-2 small, every mode; CUDA-event time per step, at least 0.5 s.
BENCHMARK(gpt2)
    ->Name("Gpt2")
    ->ArgNames({"batch", "seq", "depth", "mode"})
    ->ArgsProduct({{4}, {64}, {12}, {0, 1, 2}})
    ->ArgsProduct({{8}, {256}, {12}, {0, 1, 2}})
    ->ArgsProduct({{16}, {1024}, {12}, {0, 1, 2}})
    ->UseManualTime()
    ->MinTime(0.5)
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  gw::set_matmul_tf32(true);
  gw::set_conv_tf32(true);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
