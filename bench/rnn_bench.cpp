// Stacked-LSTM training steps (Google Benchmark): examples/rnn.h's model and RnnTrainer (4 layers,
// input 16, a linear head on the top layer's last hidden state, MSE, AdamW; float32, TF32 off),
// one whole step per iteration:
//
//   Rnn/hidden:H/time:T/batch:B/mode:M/wavefront:W/cell:C/gru:G
//       mode 0: eager; mode 1: the backward a BackwardGraph replay; mode 2: the whole step one
//       StepGraph replay (the batch copied into its slots). wavefront 1: each layer on a stream of
//       its own (cell (l, t) after (l − 1, t) and (l, t − 1) alone); 0: one stream. cell 0: the
//       cell composed of ops (lstm_cell); 1: the fused cell (fused_lstm_cell); 2: each layer one
//       op (fused_lstm_layer; one stream). gru 1: GRU cells (gru_cell, fused_gru_cell); 0: LSTM.
//
// The data: two batches in turn, each its own tensors, as train_rnn. The manual time: CUDA events
// on the caller's stream around the step, synchronized every iteration; loop_us: steps back to
// back, nothing synchronized between them, CUDA events around blocks of 10 (the figure a training
// loop gets); captures while timed. scripts/rnn_torch.py times PyTorch's cuDNN LSTM and LSTMCell
// loop at the same shapes.
//
//   graphward_bench_rnn --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "bench/bench_models.h"
#include "examples/rnn.h"

namespace gw = graphward;
namespace ex = graphward::examples;

namespace {

constexpr gw::Device kDev = gw::bench::kDev;

void rnn(benchmark::State& state) {
  if (gw::bench::skip_without_gpu(state)) return;
  ex::RnnConfig c;
  c.hidden = state.range(0);
  c.steps_in_time = static_cast<int>(state.range(1));
  c.batch = state.range(2);
  const auto mode = static_cast<ex::Mode>(state.range(3));
  c.wavefront = state.range(4) != 0;
  c.cell = static_cast<ex::RnnCell>(state.range(5));
  c.gru = state.range(6) != 0;
  ex::RnnTrainer trainer(c, kDev, mode);
  int i = 0;
  for (int w = 0; w < 5; ++w) (void)trainer.step(i++);  // warm-up, capture
  const std::uint64_t captures = trainer.captures();
  state.counters["loop_us"] =
      gw::bench::time_steps(state, gw::current_stream(kDev), [&] { (void)trainer.step(i++); });
  state.counters["captures"] = static_cast<double>(trainer.captures() - captures);
  state.SetLabel(std::string(ex::mode_name(mode)) +
                 (c.wavefront ? ", wavefront, " : ", 1 stream, ") + ex::rnn_cell_name(c.cell));
}

}  // namespace

// The three shapes of the comparison with cuDNN: every mode and layout with the fused cell, every
// mode with a layer an op; the composed cell (the reference, sixteen ops a cell) at the smallest;
// the fused GRU cell in every mode with the wavefront.
BENCHMARK(rnn)
    ->Name("Rnn")
    ->ArgNames({"hidden", "time", "batch", "mode", "wavefront", "cell", "gru"})
    ->ArgsProduct({{64}, {8}, {32}, {0, 1, 2}, {0, 1}, {0, 1}, {0}})
    ->ArgsProduct({{256}, {32}, {64}, {0, 1, 2}, {0, 1}, {1}, {0}})
    ->ArgsProduct({{512}, {64}, {64}, {0, 1, 2}, {0, 1}, {1}, {0}})
    ->ArgsProduct({{64}, {8}, {32}, {0, 1, 2}, {0}, {2}, {0}})
    ->ArgsProduct({{256}, {32}, {64}, {0, 1, 2}, {0}, {2}, {0}})
    ->ArgsProduct({{512}, {64}, {64}, {0, 1, 2}, {0}, {2}, {0}})
    ->ArgsProduct({{64}, {8}, {32}, {0, 1, 2}, {1}, {1}, {1}})
    ->ArgsProduct({{256}, {32}, {64}, {0, 1, 2}, {1}, {1}, {1}})
    ->ArgsProduct({{512}, {64}, {64}, {0, 1, 2}, {1}, {1}, {1}})
    ->UseManualTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
