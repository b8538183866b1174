// Real-model training steps (Google Benchmark): the example models — the MLP of examples/mlp.h
// (hidden layers of linear + GELU, one cuBLASLt kernel each), the convnet of examples/convnet.h
// (cuDNN convolutions and pools) and the transformer block of examples/transformer.h (attention
// from bmm/softmax/reshape/transpose) — cross-entropy, AdamW; one whole training step per
// iteration in three modes:
//
//   Mlp/hidden:H/layers:L/batch:B/mode:M
//   MlpUnfusedEpilogues/...                       (the same, Note [Backward epilogue fusion] off)
//   MlpWeightGradsOnOneStream/...                 (the same, weight-gradient parallelism off)
//   Convnet/batch:B/image:S/channels:C/mode:M     (3xSxS images, convs of C and 2C channels;
//                                                  cuDNN's fastest algorithms, as PyTorch's
//                                                  default)
//   Transformer/batch:B/seq:T/dim:D/mode:M        (D/16 heads, MLP 4D, vocabulary 64)
//       mode 0: eager (forward, backward(), opt.step());
//       mode 1: the backward a BackwardGraph replay (the forward eager in a StepScope);
//       mode 2: the whole step one StepGraph replay (the batch copied into static slots first);
//       mode 3: mode 2 with the optimizer stepped inside the backward, a layer at a time
//               (StepInBackward, Note [Optimizer steps in the backward]).
//
// Every mode hands the model each step's own batch tensor (a different tensor every step), as a
// training loop does. The manual time: CUDA events on the caller's stream around the step
// (forward, backward and optimizer; the host's enqueue gaps included), synchronized every
// iteration; host_us the step's host time; medians over repetitions. loop_us: the step in the
// loop a user writes, steps back to back with nothing synchronized between them (the GPU's work of
// one step overlaps the host's work of the next), CUDA events around blocks of 20 steps. Counters:
// captures and updates while timed, the loop's steps included (0 in steady state); for mode 1 the
// backward()'s host time (bw_host_us, the release after the launch included; bw_launch_at_us, until
// the launch) and its input slots (Note [Input slots]). scripts/compare_torch.py --models runs the
// same models in PyTorch (eager, and the whole step in one torch.cuda.graph with a capturable
// AdamW), to compare side by side with these rows.
//
//   graphward_bench_models --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//       [--gemm_choices] [--tf32] [--bf16] [--causal]
// --tf32: float32 GEMMs and convolutions on TF32 tensor cores (Note [TF32], engine/runtime/math_mode.h);
// --bf16: every step's forward under Autocast (Note [Autocast], engine/ops/autocast.h: matrix products
// in bfloat16, float32 master weights cast once a step), TF32 on for what stays float32;
// --causal: the transformers' attention causal. Every row's counters tf32, bf16 and causal say
// which (1 on, 0 off); casts and cast_us, the parameters Autocast casts each step and the GPU time
// of those casts and of their gradients' widening, replayed alone (0 without --bf16).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string_view>
#include <vector>

#include "bench/bench_models.h"
#include "examples/convnet.h"
#include "examples/mlp.h"
#include "examples/transformer.h"

namespace gw = graphward;
namespace ex = graphward::examples;

namespace {

// The program's flags (main): every row the same.
bool g_bf16 = false;
bool g_causal = false;

// The GPU time a step spends on Autocast's casts (Note [Autocast]): each parameter the forward
// cast, cast to bfloat16, and a bfloat16 gradient of its shape widened to float32 (the cast's
// backward), as one StepGraph replayed; µs a step, the median of 5 blocks of 20 replays.
double cast_us(const std::vector<gw::Tensor>& params) {
  if (params.empty()) return 0;
  std::vector<gw::Tensor> grads;
  for (const gw::Tensor& p : params) {
    grads.push_back(gw::zeros(p.shape(), {gw::DType::kBFloat16, gw::bench::kDev}));
  }
  gw::StepGraph graph(gw::bench::kDev);
  const auto casts = [&] {
    gw::NoGradGuard no_grad;
    gw::Tensor last;
    for (const gw::Tensor& p : params) last = gw::cast(p, gw::DType::kBFloat16);
    for (const gw::Tensor& g : grads) last = gw::cast(g, gw::DType::kFloat32);
    return last;
  };
  for (int i = 0; i < 3; ++i) (void)graph.run(casts);
  return gw::bench::median_block_us(gw::current_stream(gw::bench::kDev), 20,
                                    [&] { (void)graph.run(casts); });
}

template <class Model>
void run_model(benchmark::State& state, const typename Model::Config& c, ex::Mode mode,
               bool fuse_epilogues = true, std::optional<bool> split_weight_grads = std::nullopt) {
  ex::Trainer<Model> trainer(c, gw::bench::kDev, mode, fuse_epilogues, split_weight_grads,
                             g_bf16);
  int i = 0;
  for (; i < 10; ++i) (void)trainer.step(i);  // warm-up, capture
  const cudaStream_t s = gw::current_stream(gw::bench::kDev);
  gw::Event start(gw::bench::kDev, true), end(gw::bench::kDev, true);
  const std::uint64_t captures = trainer.captures(), updates = trainer.updates();
  double host = 0, bw_host = 0, bw_before_launch = 0, whole_steps = 0;
  for (auto _ : state) {
    start.record(s);
    const auto t0 = std::chrono::steady_clock::now();
    (void)trainer.step(i++);
    const auto t1 = std::chrono::steady_clock::now();
    end.record(s);
    end.synchronize();
    host += std::chrono::duration<double, std::micro>(t1 - t0).count();
    state.SetIterationTime(end.elapsed_ms_since(start) * 1e-3);
    if (const gw::BackwardGraph* bw = trainer.backward_graph()) {
      const gw::BackwardHostTimes t = bw->stats().host;
      bw_host += t.total_us();
      bw_before_launch += t.before_launch_us();
      whole_steps += t.whole_step;
    }
  }
  // The loop a user writes (examples/trainer.h's run_steps): steps back to back, nothing
  // synchronized between them, so that one step's GPU work overlaps the next one's host work.
  // Per step: the median of 5 blocks of 20 steps, CUDA events around each block.
  state.counters["loop_us"] = gw::bench::median_block_us(s, 20, [&] { (void)trainer.step(i++); });
  const double iters = static_cast<double>(state.iterations());
  state.counters["host_us"] = host / iters;
  state.counters["captures"] = static_cast<double>(trainer.captures() - captures);
  state.counters["updates"] = static_cast<double>(trainer.updates() - updates);
  state.counters["tf32"] = gw::matmul_tf32() ? 1 : 0;
  state.counters["bf16"] = g_bf16 ? 1 : 0;
  state.counters["causal"] = g_causal ? 1 : 0;
  // Autocast's casts: how many parameters a step casts, and their GPU time (cast_us above).
  state.counters["casts"] = static_cast<double>(trainer.cast_parameters().size());
  state.counters["cast_us"] = cast_us(trainer.cast_parameters());
  // Every row has every counter (Google Benchmark's CSV output requires it): 0 where the mode
  // has no BackwardGraph.
  for (const char* c : {"bw_host_us", "bw_launch_at_us", "slots", "whole_step"}) {
    state.counters[c] = 0;
  }
  if (const gw::BackwardGraph* bw = trainer.backward_graph()) {
    state.counters["bw_host_us"] = bw_host / iters;  // backward(): all of it, the release too
    state.counters["bw_launch_at_us"] = bw_before_launch / iters;
    state.counters["slots"] = static_cast<double>(bw->stats().graph.input_slots);
    state.counters["whole_step"] = whole_steps / iters;  // Note [Reads of a replayed step]
  }
  state.SetLabel(ex::mode_name(mode));
}

ex::Mode mode_arg(const benchmark::State& state, int i) {
  return static_cast<ex::Mode>(state.range(i));
}

void run_mlp(benchmark::State& state, bool fuse_epilogues,
             std::optional<bool> split_weight_grads = std::nullopt) {
  if (gw::bench::skip_without_gpu(state)) return;
  run_model<ex::MlpModel>(state,
                          {.in = 256, .hidden = state.range(0), .classes = 10,
                           .batch = state.range(2), .layers = static_cast<int>(state.range(1))},
                          mode_arg(state, 3), fuse_epilogues, split_weight_grads);
}
void mlp(benchmark::State& state) {
  run_mlp(state, true);
}
// The same MLP with Note [Backward epilogue fusion] off: each GELU's backward its own kernel
// (the plan before the fusion).
void mlp_unfused(benchmark::State& state) {
  run_mlp(state, false);
}
// The same MLP with weight-gradient parallelism off (BackwardOptions::split_weight_grads = false):
// every gradient on the caller's stream, one GEMM at a time (ablation of the default).
void mlp_one_stream(benchmark::State& state) {
  run_mlp(state, true, false);
}

void convnet(benchmark::State& state) {
  if (gw::bench::skip_without_gpu(state)) return;
  run_model<ex::ConvnetModel>(state,
                              {.batch = state.range(0), .channels = 3, .image = state.range(1),
                               .c1 = state.range(2), .c2 = 2 * state.range(2), .classes = 10,
                               .deterministic = false, .channels_last = g_bf16},
                              mode_arg(state, 3));
}

void run_transformer(benchmark::State& state,
                     std::optional<bool> split_weight_grads = std::nullopt) {
  if (gw::bench::skip_without_gpu(state)) return;
  const std::int64_t dim = state.range(2);
  run_model<ex::TransformerModel>(state,
                                  {.batch = state.range(0), .seq = state.range(1), .dim = dim,
                                   .heads = dim / 16, .ff = 4 * dim, .vocab = 64,
                                   .causal = g_causal},
                                  mode_arg(state, 3), true, split_weight_grads);
}
void transformer(benchmark::State& state) {
  run_transformer(state);
}
// The same transformer with weight-gradient parallelism off (ablation of the default).
void transformer_one_stream(benchmark::State& state) {
  run_transformer(state, false);
}

}  // namespace

// Every row: CUDA-event time per step (manual time), at least 0.3 s, in microseconds.
static void timed_step(benchmark::internal::Benchmark* b) {
  b->UseManualTime()->MinTime(0.3)->Unit(benchmark::kMicrosecond);
}

// Launch-bound (hidden 256, batch 128) and GEMM-bound (hidden 2048, batch 1024) MLPs.
static void mlp_rows(benchmark::internal::Benchmark* b) {
  b->ArgNames({"hidden", "layers", "batch", "mode"})
      ->ArgsProduct({{256}, {4}, {128}, {0, 1, 2, 3}})
      ->ArgsProduct({{2048}, {4}, {1024}, {0, 1, 2, 3}})
      ->Apply(timed_step);
}
BENCHMARK(mlp)->Name("Mlp")->Apply(mlp_rows);
BENCHMARK(mlp_unfused)->Name("MlpUnfusedEpilogues")->Apply(mlp_rows);
BENCHMARK(mlp_one_stream)->Name("MlpWeightGradsOnOneStream")->Apply(mlp_rows);

// Launch-bound (the examples' sizes) and compute-bound convnets and transformers.
BENCHMARK(convnet)
    ->Name("Convnet")
    ->ArgNames({"batch", "image", "channels", "mode"})
    ->ArgsProduct({{64}, {16}, {16}, {0, 1, 2, 3}})
    ->ArgsProduct({{256}, {32}, {64}, {0, 1, 2, 3}})
    ->Apply(timed_step);

static void transformer_rows(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "seq", "dim", "mode"})
      ->ArgsProduct({{16}, {32}, {64}, {0, 1, 2, 3}})
      ->ArgsProduct({{32}, {128}, {256}, {0, 1, 2, 3}})
      ->Apply(timed_step);
}
BENCHMARK(transformer)->Name("Transformer")->Apply(transformer_rows);
BENCHMARK(transformer_one_stream)->Name("TransformerWeightGradsOnOneStream")->Apply(transformer_rows);

// Google Benchmark's main, and then, with --gemm_choices, the GEMM algorithm chosen for each shape
// the rows ran (Note [Choosing a GEMM algorithm]) on stderr.
int main(int argc, char** argv) {
  const bool print_choices = gw::bench::take_flag(argc, argv, "--gemm_choices");
  g_bf16 = gw::bench::take_flag(argc, argv, "--bf16");
  g_causal = gw::bench::take_flag(argc, argv, "--causal");
  const bool tf32 = gw::bench::take_flag(argc, argv, "--tf32") || g_bf16;
  gw::set_matmul_tf32(tf32);
  gw::set_conv_tf32(tf32);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (print_choices) gw::bench::print_gemm_choices();
  return 0;
}
