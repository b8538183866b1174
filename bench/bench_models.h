#pragma once
// What the autograd and capture benchmarks share: docs/DESIGN.md's K-branch x D-layer study model
// and its hand-written backward (the launch floor, and the hand-written graph when captured).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string_view>
#include <vector>

#include "graphward/engine/runtime/blas.h"
#include "graphward/graphward.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/reduce.h"

namespace graphward::bench {

inline constexpr Device kDev = Device::cuda(0);
inline constexpr TensorOptions kF32{DType::kFloat32, kDev};

// Skips the benchmark, with the reason, where no CUDA device is usable.
inline bool skip_without_gpu(benchmark::State& state) {
  if (cuda_available()) return false;
  state.SkipWithError(("no usable CUDA device: " + cuda_unavailable_reason()).c_str());
  return true;
}

// `step` run back to back on `stream`, nothing synchronized between runs, CUDA events around
// blocks of `per_block` runs: µs a run, the median of 5 blocks (the figure a training loop gets).
template <class Step>
double median_block_us(cudaStream_t stream, int per_block, Step&& step) {
  Event start(kDev, true), end(kDev, true);
  std::vector<double> blocks;
  for (int b = 0; b < 5; ++b) {
    start.record(stream);
    for (int k = 0; k < per_block; ++k) step();
    end.record(stream);
    end.synchronize();
    blocks.push_back(end.elapsed_ms_since(start) * 1e3 / per_block);
  }
  std::sort(blocks.begin(), blocks.end());
  return blocks[blocks.size() / 2];
}

// A training step timed as a benchmark's iterations (CUDA events on `stream` around each call of
// `step`, synchronized every iteration: the manual time), then as a loop gets it: blocks of 10
// steps back to back (median_block_us); returns that median block's µs a step.
template <class Step>
double time_steps(benchmark::State& state, cudaStream_t stream, Step&& step) {
  Event start(kDev, true), end(kDev, true);
  for (auto _ : state) {
    start.record(stream);
    step();
    end.record(stream);
    end.synchronize();
    state.SetIterationTime(end.elapsed_ms_since(start) * 1e-3);
  }
  return median_block_us(stream, 10, step);
}

// Registers docs/DESIGN.md's studies as args (branches, depth, width, batch, multistream), timed
// manually in microseconds: all five rows, or (`side_streams_only`) the three where weight-gradient
// parallelism has something to overlap with.
inline benchmark::internal::Benchmark* studies(benchmark::internal::Benchmark* b,
                                               bool side_streams_only = false) {
  b->ArgNames({"branches", "depth", "width", "batch", "multistream"});
  if (side_streams_only) {
    b->Args({4, 8, 256, 64, 1})->Args({1, 32, 256, 64, 0})->Args({4, 4, 1024, 256, 1});
  } else {
    b->Args({4, 8, 256, 64, 0})
        ->Args({4, 8, 256, 64, 1})
        ->Args({1, 32, 256, 64, 0})
        ->Args({4, 4, 1024, 256, 0})
        ->Args({4, 4, 1024, 256, 1});
  }
  return b->UseManualTime()->MinTime(0.3)->Unit(benchmark::kMicrosecond);
}

// GPU time of the work that `enqueue` puts on `stream`, without the host time it takes to enqueue
// it: a host function holds the stream until `enqueue` has returned, so the timing events around
// the work see the GPU's execution alone. A wall clock around the same call also sees the launch
// gap (the host's enqueue time while the GPU idles); the two are reported apart. The hold gives up
// after a second (a call that waits for the stream would otherwise deadlock): `timed_out()`.
class GpuTimer {
 public:
  explicit GpuTimer(Device device) : start_(device, true), end_(device, true) {}
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  template <class Enqueue>
  double time_us(cudaStream_t stream, Enqueue&& enqueue) {
    released_.store(false, std::memory_order_relaxed);
    GW_CUDA_CHECK(cudaLaunchHostFunc(stream, &GpuTimer::hold, this));
    start_.record(stream);
    enqueue();
    end_.record(stream);
    released_.store(true, std::memory_order_release);
    end_.synchronize();
    return 1e3 * static_cast<double>(end_.elapsed_ms_since(start_));
  }
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }

  // The median of `n` timings of the same work.
  template <class Enqueue>
  double median_us(cudaStream_t stream, int n, Enqueue&& enqueue) {
    std::vector<double> t;
    for (int i = 0; i < n; ++i) t.push_back(time_us(stream, enqueue));
    return median(t);
  }
  static double median(std::vector<double> t) {
    if (t.empty()) return 0;
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    return t[t.size() / 2];
  }

 private:
  static void CUDART_CB hold(void* self) {
    auto* t = static_cast<GpuTimer*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!t->released_.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() > deadline) {
        t->timed_out_.store(true, std::memory_order_release);
        return;
      }
    }
  }
  Event start_, end_;
  std::atomic<bool> released_{false};
  std::atomic<bool> timed_out_{false};
};

// K branches of D x (linear N + relu) on one input, branch outputs summed, mse loss; with
// `multistream`, branch i runs on a stream of its own in the forward.
struct BranchModel {
  std::vector<std::vector<Tensor>> w, b;
  Tensor x, target;
  std::vector<std::unique_ptr<Stream>> streams;

  BranchModel(int k, int d, std::int64_t n, std::int64_t batch, bool multistream) {
    std::uint64_t seed = 1;
    const double s = 1.0 / std::sqrt(double(n));
    w.resize(k);
    b.resize(k);
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < d; ++j) {
        w[i].push_back(uniform({n, n}, -s, s, seed++, kF32).set_requires_grad(true));
        b[i].push_back(uniform({n}, -0.1, 0.1, seed++, kF32).set_requires_grad(true));
      }
      if (multistream) streams.push_back(std::make_unique<Stream>(kDev));
    }
    x = randn({batch, n}, seed++, kF32);
    target = randn({batch, n}, seed++, kF32);
  }
  // A copy of `init`'s parameters and data (device copies, own leaves and .grads: fast where the
  // host-side random initialization of a large model is slow), with its own streams.
  BranchModel(const BranchModel& init, bool multistream)
      : x(init.x.clone()), target(init.target.clone()) {
    w.resize(init.w.size());
    b.resize(init.b.size());
    for (std::size_t i = 0; i < init.w.size(); ++i) {
      for (std::size_t j = 0; j < init.w[i].size(); ++j) {
        w[i].push_back(init.w[i][j].clone().set_requires_grad(true));
        b[i].push_back(init.b[i][j].clone().set_requires_grad(true));
      }
      if (multistream) streams.push_back(std::make_unique<Stream>(kDev));
    }
  }
  Tensor loss() const {
    Tensor total;
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::unique_ptr<StreamGuard> g;
      if (!streams.empty()) g = std::make_unique<StreamGuard>(*streams[i]);
      Tensor h = x;
      for (std::size_t j = 0; j < w[i].size(); ++j) h = relu(linear(h, w[i][j], b[i][j]));
      g.reset();
      total = total.defined() ? add(total, h) : h;
    }
    return mse_loss(total, target);
  }
};

// The same backward as graphward's for a BranchModel — relu backward, the dX GEMM, the dW GEMM with
// db fused (cuBLASLt BGRADB, or GEMM + column sum), the mse backward — launched directly on
// `stream` on buffers made once, with no autograd, no allocation and no copies (the branches read
// the loss gradient directly). The forward runs once at construction, keeping every layer's input
// and output. launch() takes optional streams: branch i on `branch[i]` (forked from `stream` after
// the mse backward by an event, joined back at the end), and each layer's dW/db GEMM on `side[i]`
// (forked from the branch stream after the layer's relu backward, joined back at the end): the
// hand-written multistream and weight-gradient-parallel programs.
class HandWrittenBackward {
 public:
  HandWrittenBackward(const BranchModel& m, cudaStream_t stream)
      : m_(m), s_(stream), k_(static_cast<int>(m.w.size())), d_(static_cast<int>(m.w[0].size())) {
    n_ = m.w[0][0].size(0);
    batch_ = m.x.size(0);
    StreamGuard on(kDev, stream);
    NoGradGuard no_grad;
    in_.resize(k_);
    out_.resize(k_);
    for (int i = 0; i < k_; ++i) {
      Tensor h = m.x;
      for (int j = 0; j < d_; ++j) {
        in_[i].push_back(h);
        h = relu(linear(h, m.w[i][j], m.b[i][j]));
        out_[i].push_back(h);
      }
      total_ = total_.defined() ? add(total_, h) : h;
    }
    one_ = ones({1}, kF32);
    dtotal_ = Tensor::empty({batch_, n_}, kF32);
    for (int i = 0; i < k_; ++i) dh_.push_back(Tensor::empty({batch_, n_}, kF32));
    for (int i = 0; i < k_ * d_; ++i) {
      dz_.push_back(Tensor::empty({batch_, n_}, kF32));  // per layer: a side stream may still read
      dw_.push_back(Tensor::empty({n_, n_}, kF32));
      db_.push_back(Tensor::empty({n_}, kF32));
    }
  }

  void launch(const std::vector<cudaStream_t>& branch = {},
              const std::vector<cudaStream_t>& side = {}) const {
    namespace kk = graphward::kernels;
    const std::int64_t n = n_, batch = batch_;
    std::size_t used = 0;
    auto event = [&]() -> Event& {
      if (used == events_.size()) events_.emplace_back(kDev);
      return events_[used++];
    };
    kk::mse_loss_backward<float>(dtotal_.data<float>(), nullptr, one_.data<float>(),
                                 total_.data<float>(), m_.target.data<float>(), batch * n, false,
                                 false, s_);
    std::size_t start = 0;  // an index: event() may grow events_
    if (!branch.empty()) {
      start = used;
      event().record(s_);
    }
    for (int i = k_ - 1; i >= 0; --i) {
      const cudaStream_t bs = branch.empty() ? s_ : branch[static_cast<std::size_t>(i)];
      const cudaStream_t ws = side.empty() ? bs : side[static_cast<std::size_t>(i)];
      if (bs != s_) events_[start].block(bs);
      const float* grad = dtotal_.data<float>();  // d(output of layer j)
      for (int j = d_ - 1; j >= 0; --j) {
        const float* dz = dz_[i * d_ + j].data<float>();
        kk::relu_backward(dz_[i * d_ + j].data<float>(), grad, out_[i][j].data<float>(), batch * n,
                          false, bs);
        if (ws != bs) {
          Event& e = event();
          e.record(bs);
          e.block(ws);
        }
        float* dwp = dw_[i * d_ + j].data<float>();
        float* dbp = db_[i * d_ + j].data<float>();
        if (!gemm_bias_grad(kDev, ws, true, false, n, n, batch, 1.f, dz, in_[i][j].data<float>(),
                            0.f, dwp, dbp)) {
          gemm(kDev, ws, true, false, n, n, batch, 1.f, dz, in_[i][j].data<float>(), 0.f, dwp);
          kk::column_sum<float>(dbp, dz, nullptr, 1.f, batch, n, false, ws);
        }
        if (j > 0) {
          gemm(kDev, bs, false, false, batch, n, n, 1.f, dz, m_.w[i][j].data<float>(), 0.f,
               dh_[i].data<float>());
          grad = dh_[i].data<float>();
        }
      }
      if (bs != s_) {  // join the branch back
        Event& e = event();
        e.record(bs);
        e.block(s_);
      }
      if (ws != bs && ws != s_) {  // and its side stream
        Event& e = event();
        e.record(ws);
        e.block(s_);
      }
    }
  }

 private:
  const BranchModel& m_;
  cudaStream_t s_;
  int k_, d_;
  std::int64_t n_ = 0, batch_ = 0;
  std::vector<std::vector<Tensor>> in_, out_;
  Tensor total_, one_, dtotal_;
  std::vector<Tensor> dz_, dh_, dw_, db_;
  mutable std::vector<Event> events_;  // fork and join points, recorded again every launch
};

// Removes `flag` from argv (before Google Benchmark reads it); whether it was there.
inline bool take_flag(int& argc, char** argv, std::string_view flag) {
  bool found = false;
  int kept = 0;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string_view(argv[i]) == flag) {
      found = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return found;
}

// The GEMM algorithm chosen for each shape run so far (Note [Choosing a GEMM algorithm]), on
// stderr: what a bench's --gemm_choices prints after its rows.
inline void print_gemm_choices() {
  if (!cuda_available()) return;
  std::fprintf(stderr,
               "GEMM choices (m n k batch ta tb kind: candidates, chosen, heuristic's us -> chosen "
               "us [, alternative us], algo)\n");
  for (const auto& c : debug::gemm_choices(kDev)) {
    std::fprintf(stderr, "%lld %lld %lld %lld %d %d %s%s: %d, %d, %.2f -> %.2f", c.m, c.n, c.k,
                 c.batch, c.trans_a, c.trans_b, c.kind.c_str(),
                 c.bf16   ? " bf16"
                 : c.tf32 ? " tf32"
                          : "",
                 c.candidates, c.chosen, c.first_us, c.chosen_us);
    if (c.alternative_us > 0) {
      std::fprintf(stderr, " [alternative %.2f%s]", c.alternative_us,
                   c.declined ? ": declined" : "");
    }
    std::fprintf(stderr, ", %s%s\n", c.algo.c_str(), c.tuned ? "" : " (untimed)");
    for (std::size_t i = 0; i < c.candidate_us.size(); ++i) {
      std::fprintf(stderr, "    candidate %zu%s: %.2f us, %s\n", i,
                   static_cast<int>(i) == c.chosen ? " (chosen)" : "", c.candidate_us[i].second,
                   c.candidate_us[i].first.c_str());
    }
  }
}

}  // namespace graphward::bench
