// Overlap studies (Google Benchmark): does running the forward on a stream per branch make the
// backward faster, eagerly and replayed as a CUDA graph, and by how much?
//
//   Overlap/<study>/graph:G/multistream:M/split:S
//       docs/DESIGN.md's K-branch x D-layer studies (linear N + relu, batch B, branches summed,
//       mse): the eager backward as shipped (graph:0; where it is too short for streams to pay off
//       it runs on the caller's stream: Note [Streams of an eager backward],
//       engine/backward/backward_plan.h) or BackwardGraph's replay (graph:1), the forward on one
//       stream (multistream:0) or on a stream per branch (multistream:1), weight-gradient
//       parallelism off or on (split).
//   HandWrittenSweep/width:N/multistream:M
//       the sweep's kernels as a hand-written program, the GPU's time alone: what two streams can
//       give them at most (`overlap`)
//   OverlapSweep/width:N/graph:G/multistream:M
//       the review's sweep (docs/DESIGN.md, "The studies"): two parallel linear layers (+ relu)
//       on an N x N input, N = 2^6 ... 2^13 — where do streams pay off on this GPU?
//
// Per iteration, the forward untimed and synchronized: CUDA events on the caller's stream around
// the backward (the manual time: the backward on the GPU's clock, the host's enqueue gaps
// included), host_us the backward() call's host time. Counters: gpu_us (the GPU's execution alone:
// GpuTimer, the stream held until the backward was enqueued; median of 15), nodes (tape nodes),
// kernel_nodes (graph), and for multistream rows overlap = (the same run's single-stream twin's
// median event time, its steps interleaved with the row's) / (this row's median): above 1, the
// streams pay off; single_us and single_host_us the twin's event and host times. Graph rows also
// count captures and updates while timed (0 in steady state).
//
//   graphward_bench_overlap --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//       --benchmark_out=overlap.json --benchmark_out_format=json   (one command line)
//   python3 scripts/overlap_table.py overlap.json torch_overlap.csv   (side by side with PyTorch)
//   [--gemm_choices]   after the rows, the GEMM algorithm chosen for each shape, on stderr
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_models.h"
#include "graphward/capture/backward_graph.h"

namespace gw = graphward;

namespace {

using gw::bench::kDev;
using Model = gw::bench::BranchModel;
using Clock = std::chrono::steady_clock;

// The model's initial parameters and data for one shape, made once and copied on the device for
// each configuration: the host-side random initialization takes seconds at N = 8192, and a row
// builds a model per repetition (two with its single-stream twin).
const Model& prototype(int k, int d, std::int64_t n, std::int64_t batch) {
  static std::unique_ptr<Model> proto;
  static std::vector<std::int64_t> key;
  const std::vector<std::int64_t> want{k, d, n, batch};
  if (!proto || key != want) {
    proto.reset();  // the last shape's memory first
    proto = std::make_unique<Model>(k, d, n, batch, false);
    key = want;
  }
  return *proto;
}

// One configuration: a model and the backward it runs (eager, or BackwardGraph with a step arena).
class Runner {
 public:
  Runner(int k, int d, std::int64_t n, std::int64_t batch, bool multistream, bool graph, bool split)
      : m_(prototype(k, d, n, batch), multistream), graph_(graph), split_(split),
        caller_(gw::current_stream(kDev)), start_(kDev, true), end_(kDev, true) {
    nodes_ = gw::plan_for({m_.loss()}).steps.size();
    if (graph_) {
      arena_ = std::make_unique<gw::StepArena>(kDev);
      bw_ = std::make_unique<gw::BackwardGraph>(
          kDev, gw::BackwardGraphOptions{.backward = {.split_weight_grads = split}});
    }
    for (int i = 0; i < 5; ++i) step();  // warm-up (and capture, first replays)
  }
  struct Sample {
    double event_us, host_us;
  };
  // One step: the forward (untimed, finished), then the backward between two timing events.
  Sample step() {
    std::optional<gw::StepScope> scope;
    if (graph_) scope.emplace(*arena_);
    const gw::Tensor loss = m_.loss();
    finish_forward();
    start_.record(caller_);
    const auto t0 = Clock::now();
    backward(loss);
    const auto t1 = Clock::now();
    end_.record(caller_);
    end_.synchronize();
    return {1e3 * static_cast<double>(end_.elapsed_ms_since(start_)),
            std::chrono::duration<double, std::micro>(t1 - t0).count()};
  }
  // The GPU's execution alone (GpuTimer), median of `n` steps.
  double gpu_us(int n) {
    gw::bench::GpuTimer timer(kDev);
    std::vector<double> t;
    for (int i = 0; i < n; ++i) {
      std::optional<gw::StepScope> scope;
      if (graph_) scope.emplace(*arena_);
      const gw::Tensor loss = m_.loss();
      finish_forward();
      t.push_back(timer.time_us(caller_, [&] { backward(loss); }));
    }
    timed_out_ = timed_out_ || timer.timed_out();
    return gw::bench::GpuTimer::median(t);
  }
  std::size_t nodes() const { return nodes_; }
  const gw::BackwardGraph* graph() const { return bw_.get(); }
  bool timed_out() const { return timed_out_; }

 private:
  void finish_forward() {
    GW_CUDA_CHECK(cudaStreamSynchronize(caller_));
    for (auto& s : m_.streams) s->synchronize();
  }
  void backward(const gw::Tensor& loss) {
    if (graph_) {
      bw_->backward(loss, gw::GradWrite::kOverwrite);
      arena_->record_step_end(caller_);
    } else {
      gw::backward(loss, {.grad_write = gw::GradWrite::kOverwrite, .split_weight_grads = split_});
    }
  }
  Model m_;
  bool graph_, split_;
  cudaStream_t caller_;
  gw::Event start_, end_;
  std::unique_ptr<gw::StepArena> arena_;
  std::unique_ptr<gw::BackwardGraph> bw_;
  std::size_t nodes_ = 0;
  bool timed_out_ = false;
};

void overlap(benchmark::State& state, int k, int d, std::int64_t n, std::int64_t batch,
             bool graph, bool multistream, bool split) {
  if (gw::bench::skip_without_gpu(state)) return;
  Runner run(k, d, n, batch, multistream, graph, split);
  // A multistream row's single-stream twin runs step for step with it, alternating which goes
  // first: the host's speed drifts between moments by more than the difference measured, and a
  // twin timed after the row would time another moment of the host.
  std::optional<Runner> twin;
  if (multistream) twin.emplace(k, d, n, batch, false, graph, split);
  std::vector<double> twin_us;
  double twin_host = 0;
  const auto before = graph ? run.graph()->stats().counters : gw::capture::GraphCacheCounters{};
  std::vector<double> event_us;
  double host = 0;
  auto twin_step = [&] {
    const Runner::Sample t = twin->step();
    twin_us.push_back(t.event_us);
    twin_host += t.host_us;
  };
  for (auto _ : state) {
    const bool twin_first = twin && event_us.size() % 2 == 0;
    if (twin_first) twin_step();
    const Runner::Sample s = run.step();
    if (twin && !twin_first) twin_step();
    event_us.push_back(s.event_us);
    host += s.host_us;
    state.SetIterationTime(s.event_us * 1e-6);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["host_us"] = host / iters;
  state.counters["nodes"] = static_cast<double>(run.nodes());
  // Every row has every counter (Google Benchmark's CSV output requires it): an eager row's
  // captures, updates and kernel nodes are 0; a one-stream row is its own twin (overlap 1).
  state.counters["captures"] = 0;
  state.counters["updates"] = 0;
  state.counters["kernel_nodes"] = 0;
  if (graph) {
    const gw::BackwardGraphStats after = run.graph()->stats();
    state.counters["captures"] = static_cast<double>(after.counters.captures - before.captures);
    state.counters["updates"] = static_cast<double>(after.counters.updates - before.updates);
    state.counters["kernel_nodes"] = static_cast<double>(after.graph.kernel_nodes);
  }
  const int samples = n >= 4096 ? 5 : 15;
  state.counters["gpu_us"] = run.gpu_us(samples);
  state.counters["single_us"] = gw::bench::GpuTimer::median(event_us);
  state.counters["single_host_us"] = host / iters;
  state.counters["overlap"] = 1;
  state.counters["gpu_hold_timed_out"] = 0;
  if (twin) {  // the single-stream twin, step for step: the overlap ratio
    const double single = gw::bench::GpuTimer::median(twin_us);
    state.counters["single_us"] = single;
    state.counters["single_host_us"] = twin_host / iters;
    state.counters["overlap"] = single / gw::bench::GpuTimer::median(event_us);
  }
  if (run.timed_out()) {  // a call in the backward waited for the held stream: no GPU-only figure
    state.counters["gpu_us"] = 0;
    state.counters["gpu_hold_timed_out"] = 1;
  }
}

// The hand-written program of the sweep's kernels (HandWrittenBackward: no autograd, no allocation,
// buffers made once) on the caller's stream alone or with each branch on a stream of its own:
// the GPU's time alone (GpuTimer, the stream held until everything is enqueued), so the two-stream
// row's `overlap` (the one-stream program's median over its own, same run) is what streams can give
// these kernels on this GPU at all — the limit of graphward's eager sweep rows' `overlap`.
void hand_written_sweep(benchmark::State& state, std::int64_t n, bool multistream) {
  if (gw::bench::skip_without_gpu(state)) return;
  const Model& m = prototype(2, 1, n, n);
  const cudaStream_t caller = gw::current_stream(kDev);
  const gw::bench::HandWrittenBackward hand(m, caller);
  gw::Stream a(kDev), b(kDev);
  const std::vector<cudaStream_t> branches{a.get(), b.get()};
  gw::bench::GpuTimer timer(kDev);
  auto run = [&](bool multi) {
    return timer.time_us(caller, [&] { multi ? hand.launch(branches) : hand.launch(); });
  };
  for (int i = 0; i < 3; ++i) run(multistream);  // warm-up
  std::vector<double> us;
  for (auto _ : state) {
    us.push_back(run(multistream));
    state.SetIterationTime(us.back() * 1e-6);
  }
  state.counters["overlap"] = 1;
  if (multistream) {
    std::vector<double> single;
    for (std::size_t i = 0; i < us.size(); ++i) single.push_back(run(false));
    state.counters["overlap"] =
        gw::bench::GpuTimer::median(single) / gw::bench::GpuTimer::median(us);
  }
  state.counters["gpu_hold_timed_out"] = timer.timed_out() ? 1 : 0;
}

// Iterations are fixed per size (the manual time is short, but every iteration also runs an
// untimed forward and synchronizes): 30 up to N = 2048, then 10 and 5.
int iterations_for(std::int64_t n) {
  return n <= 2048 ? 30 : n <= 4096 ? 10 : 5;
}

void register_all() {
  auto add = [](const std::string& name, std::vector<std::int64_t> args,
                const std::vector<std::string>& arg_names, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->ArgNames(arg_names)
        ->Args(args)
        ->Iterations(iterations_for(args[arg_names[0] == "width" ? 0 : 2]))
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  };
  const std::vector<std::vector<std::int64_t>> studies = {
      {4, 8, 256, 64}, {1, 32, 256, 64}, {4, 4, 1024, 256}};
  for (const auto& s : studies) {
    for (int graph = 0; graph <= 1; ++graph) {
      for (int multi = 0; multi <= (s[0] > 1 ? 1 : 0); ++multi) {
        for (int split = 0; split <= 1; ++split) {
          add("Overlap", {s[0], s[1], s[2], s[3], graph, multi, split},
              {"branches", "depth", "width", "batch", "graph", "multistream", "split"},
              [](benchmark::State& st) {
                overlap(st, static_cast<int>(st.range(0)), static_cast<int>(st.range(1)),
                        st.range(2), st.range(3), st.range(4) != 0, st.range(5) != 0,
                        st.range(6) != 0);
              });
        }
      }
    }
  }
  // The review's study: two parallel linears (+ relu) on an N x N input; nothing to split (the
  // input needs no gradient, so each branch is one weight-gradient GEMM and its bias gradient).
  for (std::int64_t n = 64; n <= 8192; n *= 2) {
    for (int graph = 0; graph <= 1; ++graph) {
      for (int multi = 0; multi <= 1; ++multi) {
        add("OverlapSweep", {n, graph, multi}, {"width", "graph", "multistream"},
            [](benchmark::State& st) {
              overlap(st, 2, 1, st.range(0), st.range(0), st.range(1) != 0, st.range(2) != 0,
                      false);
            });
      }
    }
    for (int multi = 0; multi <= 1; ++multi) {
      add("HandWrittenSweep", {n, multi}, {"width", "multistream"},
          [](benchmark::State& st) { hand_written_sweep(st, st.range(0), st.range(1) != 0); });
    }
  }
}

}  // namespace

// Google Benchmark's main, and then, with --gemm_choices, the GEMM algorithm chosen for each shape
// the rows ran (Note [Choosing a GEMM algorithm]) on stderr.
int main(int argc, char** argv) {
  const bool print_choices = gw::bench::take_flag(argc, argv, "--gemm_choices");
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (print_choices) gw::bench::print_gemm_choices();
  return 0;
}
