// graphward's benchmark models and studies in PyTorch's C++ library (libtorch), as a C++ user
// writes them: the comparison that leaves Python out. One CUDA device, fp32 with TF32 off,
// cudnn.benchmark on.
//
//   Libtorch/<model>/<config>/mode:M     one whole training step (zero_grad to None, forward,
//                                        cross-entropy, backward, AdamW) of the models of
//                                        bench/models_bench.cpp:
//       eager        torch::optim::AdamW (libtorch's own: a loop of ops over the parameters)
//       eager_fused  at::_fused_adamw_ (PyTorch's fused multi-tensor AdamW, as Python's
//                    AdamW(fused=True) calls it)
//       graph_fused  the whole step captured once in an at::cuda::CUDAGraph (every .grad None
//                    before the warm-up and the capture, the fused AdamW's step counts on the
//                    device) and replayed, the batch copied into static inputs first
//     the transformer also as <...>/sdpa:1 (attention by at::scaled_dot_product_attention) and
//     the convnet as <...>/channels_last:1 (weights and batches NHWC).
//   LibtorchStudy/<study>/graph:G       the backward of docs/DESIGN.md's K-branch x D-layer
//                                        studies and of the review's sweep: G = 0 eager
//                                        (loss.backward()), 1 captured with every .grad None,
//                                        2 captured with the warm-up's .grads defined
//                                        (accumulating).
//
// A row's time is CUDA events on the caller's stream around the step (or the backward),
// synchronized every iteration, as graphward's rows; counters: host_us (the call's host time) and,
// for the models, loop_us (steps back to back with nothing synchronized between them, the loop a
// user writes: CUDA events around blocks of 20, the median of 5 blocks). Every step hands the model
// one of four batches, a different one every step. scripts/compare_libtorch.sh builds and runs it;
// scripts/strongest_table.py puts it beside graphward's rows.
//
//   graphward_libtorch_compare [--filter=REGEX] [--repetitions=N] [--out=FILE.json]
//
// The program times its rows itself and writes them in Google Benchmark's JSON schema (one median
// entry per row: the median over the repetitions of each repetition's median; a row that cannot
// run is an entry with error_occurred and its reason), rewritten after every row so that a run cut
// short keeps what it finished. It uses no Google Benchmark and no C++ stream (Note [No iostream
// beside libtorch]).
//
// Note [No iostream beside libtorch]
// Linked against the pip torch and Ubuntu's libbenchmark, this program died with SIGSEGV on an
// H200 host (Ubuntu 24.04, g++ 13) before its first row, inside std::ostream's sentry as Google
// Benchmark's console reporter printed its context — a copy of libstdc++'s stream code in the
// executable, which the library's calls bound to (docs/DECISIONS.md). Nothing here writes through
// a C++ stream: rows, progress and errors are printf'd, and PyTorch's warnings (which its default
// handler writes to std::cerr) go through a handler of its own.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/util/Exception.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using torch::Tensor;
using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// Two CUDA events, owned.
class Events {
 public:
  Events() {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&end_), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  void start(cudaStream_t s) { check(cudaEventRecord(start_, s), "cudaEventRecord"); }
  // Records the end, waits for it, and returns the µs between the two.
  double end_us(cudaStream_t s) {
    check(cudaEventRecord(end_, s), "cudaEventRecord");
    check(cudaEventSynchronize(end_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, end_), "cudaEventElapsedTime");
    return 1e3 * ms;
  }

 private:
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};

cudaStream_t current() { return c10::cuda::getCurrentCUDAStream().stream(); }

// One timed call of `f`: the µs between CUDA events around it on the current stream (waited for);
// its host time is added to *host_us.
double time_once(Events& ev, double* host_us, const std::function<void()>& f) {
  ev.start(current());
  const auto t0 = Clock::now();
  f();
  *host_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return ev.end_us(current());
}

torch::TensorOptions f32() { return torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA); }

Tensor param(Tensor t) { return t.requires_grad_(true); }
Tensor uniform(std::vector<std::int64_t> shape, double bound) {
  return (torch::rand(shape, f32()) * 2 - 1) * bound;
}

// A model: its parameters, its forward (batch -> logits) and four batches with their targets.
struct Model {
  std::vector<Tensor> params;
  std::function<Tensor(const Tensor&)> forward;
  std::vector<Tensor> xs, ts;
};

void batches(Model& m, const std::function<Tensor()>& make_x, std::int64_t classes,
             std::vector<std::int64_t> target_shape) {
  for (int i = 0; i < 4; ++i) {
    m.xs.push_back(make_x());
    m.ts.push_back(torch::randint(0, classes, target_shape, f32().dtype(torch::kLong)));
  }
}

struct Linear {
  Tensor w, b;
  Linear(std::int64_t in, std::int64_t out, std::vector<Tensor>& params) {
    const double s = 1.0 / std::sqrt(static_cast<double>(in));
    w = param(uniform({out, in}, s));
    b = param(uniform({out}, s));
    params.push_back(w);
    params.push_back(b);
  }
  Tensor operator()(const Tensor& x) const { return torch::linear(x, w, b); }
};

// examples/mlp.h: input 256, hidden layers of linear + GELU (tanh), 10 classes.
Model make_mlp(std::int64_t hidden, int layers, std::int64_t batch) {
  torch::manual_seed(0);
  Model m;
  auto lin = std::make_shared<std::vector<Linear>>();
  std::int64_t fan = 256;
  for (int i = 0; i < layers; ++i) {
    lin->emplace_back(fan, hidden, m.params);
    fan = hidden;
  }
  lin->emplace_back(fan, 10, m.params);
  m.forward = [lin](const Tensor& x) {
    Tensor h = x;
    for (std::size_t i = 0; i + 1 < lin->size(); ++i) h = torch::gelu((*lin)[i](h), "tanh");
    return lin->back()(h);
  };
  batches(m, [&] { return torch::randn({batch, 256}, f32()); }, 10, {batch});
  return m;
}

// examples/convnet.h: conv 3x3 + ReLU, max pool, conv 3x3 + ReLU, average pool, linear.
Model make_convnet(std::int64_t batch, std::int64_t image, std::int64_t c, bool channels_last) {
  torch::manual_seed(0);
  Model m;
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  auto conv = [&](std::int64_t in, std::int64_t out) {
    const double s = 1.0 / std::sqrt(static_cast<double>(in * 9));
    Tensor w = param(uniform({out, in, 3, 3}, s).contiguous(fmt));
    Tensor b = param(uniform({out}, s));
    m.params.push_back(w);
    m.params.push_back(b);
    return std::make_pair(w, b);
  };
  const auto c1 = conv(3, c), c2 = conv(c, 2 * c);
  const auto fc = std::make_shared<Linear>(2 * c * (image / 4) * (image / 4), 10, m.params);
  m.forward = [c1, c2, fc](const Tensor& x) {
    Tensor h = torch::relu(torch::conv2d(x, c1.first, c1.second, {1, 1}, {1, 1}));
    h = torch::max_pool2d(h, {2, 2});
    h = torch::relu(torch::conv2d(h, c2.first, c2.second, {1, 1}, {1, 1}));
    h = torch::avg_pool2d(h, {2, 2});
    return (*fc)(h.flatten(1));
  };
  batches(m, [&] { return torch::randn({batch, 3, image, image}, f32()).contiguous(fmt); }, 10,
          {batch});
  return m;
}

constexpr std::int64_t kVocab = 64;

// examples/transformer.h: a pre-norm block, dim/16 heads, MLP 4·dim; attention written out (bmm,
// softmax, bmm) or one at::scaled_dot_product_attention.
Model make_transformer(std::int64_t batch, std::int64_t seq, std::int64_t dim, bool sdpa) {
  torch::manual_seed(0);
  Model m;
  const std::int64_t heads = dim / 16, dh = dim / heads;
  auto p = [&](Tensor t) {
    param(t);
    m.params.push_back(t);
    return t;
  };
  const Tensor tok = p(torch::randn({kVocab, dim}, f32()) * 0.5);
  const Tensor pos = p(torch::randn({seq, dim}, f32()) * 0.5);
  std::vector<std::pair<Tensor, Tensor>> ln;
  for (int i = 0; i < 3; ++i) ln.emplace_back(p(torch::ones({dim}, f32())), p(torch::zeros({dim}, f32())));
  auto lin = [&](std::int64_t in, std::int64_t out) {
    return std::make_shared<Linear>(in, out, m.params);
  };
  const auto qkv = lin(dim, 3 * dim), proj = lin(dim, dim), fc1 = lin(dim, 4 * dim),
             fc2 = lin(4 * dim, dim), out = lin(dim, kVocab);
  m.forward = [=](const Tensor& ids) {
    const std::int64_t b = ids.size(0);
    auto norm = [&](const Tensor& x, int i) {
      return torch::layer_norm(x, {dim}, ln[static_cast<std::size_t>(i)].first,
                               ln[static_cast<std::size_t>(i)].second);
    };
    Tensor x = (torch::embedding(tok, ids) + pos).reshape({b * seq, dim});
    const auto parts = (*qkv)(norm(x, 0)).split(dim, 1);
    Tensor o;
    if (sdpa) {
      auto heads_of = [&](const Tensor& t) { return t.reshape({b, seq, heads, dh}).transpose(1, 2); };
      o = at::scaled_dot_product_attention(heads_of(parts[0]), heads_of(parts[1]),
                                           heads_of(parts[2]))
              .transpose(1, 2)
              .reshape({b * seq, dim});
    } else {
      auto heads_of = [&](const Tensor& t) {
        return t.reshape({b, seq, heads, dh}).transpose(1, 2).reshape({b * heads, seq, dh});
      };
      const Tensor q = heads_of(parts[0]), k = heads_of(parts[1]), v = heads_of(parts[2]);
      // The scale rides in the batched GEMM (alpha; beta 0 ignores the first operand), as
      // graphward's bmm(q, k, false, true, 1/sqrt(dh)).
      const Tensor s = torch::softmax(
          torch::baddbmm(torch::empty({b * heads, seq, seq}, q.options()), q, k.transpose(1, 2),
                         /*beta=*/0, /*alpha=*/std::pow(double(dh), -0.5)),
          -1);
      o = torch::bmm(s, v).reshape({b, heads, seq, dh}).transpose(1, 2).reshape({b * seq, dim});
    }
    x = x + (*proj)(o);
    x = x + (*fc2)(torch::gelu((*fc1)(norm(x, 1)), "tanh"));
    return (*out)(norm(x, 2));
  };
  batches(m, [&] { return torch::randint(0, kVocab, {batch, seq}, f32().dtype(torch::kLong)); },
          kVocab, {batch * seq});
  return m;
}

// AdamW, lr 2e-3, no weight decay, as the models bench. Fused: PyTorch's multi-tensor kernel with
// its step counts on the device (what Python's AdamW(fused=True, capturable=True) runs).
class FusedAdamW {
 public:
  explicit FusedAdamW(const std::vector<Tensor>& params) : params_(params) {
    for (const Tensor& p : params) {
      m_.push_back(torch::zeros_like(p));
      v_.push_back(torch::zeros_like(p));
      steps_.push_back(torch::zeros({}, f32()));
    }
  }
  void step() {
    torch::NoGradGuard no_grad;
    std::vector<Tensor> grads;
    for (const Tensor& p : params_) grads.push_back(p.grad());
    at::_foreach_add_(steps_, 1);
    at::_fused_adamw_(params_, grads, m_, v_, {}, steps_, 2e-3, 0.9, 0.999, 0.0, 1e-8, false,
                      false);
  }

 private:
  std::vector<Tensor> params_, m_, v_, steps_;
};

void grads_to_none(const std::vector<Tensor>& params) {
  for (const Tensor& p : params) p.mutable_grad().reset();
}

enum class Mode { kEager, kEagerFused, kGraphFused };

// What one repetition of a row measured: the time of each timed iteration (µs) and counters.
struct Sample {
  std::vector<double> us;
  std::map<std::string, double> counters;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A model row's iterations: until 0.3 s of step time, at least 20 and at most 2000.
constexpr double kMinRowSeconds = 0.3;
constexpr int kMinIterations = 20, kMaxIterations = 2000;

// Times `step` (one training step a call) as the models bench does: CUDA events around each step,
// synchronized; then the loop a user writes.
Sample time_steps(const std::function<void()>& step) {
  for (int i = 0; i < 10; ++i) step();
  Events ev;
  Sample out;
  double host = 0, total_us = 0;
  while (out.us.size() < static_cast<std::size_t>(kMinIterations) ||
         (total_us < kMinRowSeconds * 1e6 && out.us.size() < static_cast<std::size_t>(kMaxIterations))) {
    out.us.push_back(time_once(ev, &host, step));
    total_us += out.us.back();
  }
  std::vector<double> blocks;
  for (int b = 0; b < 5; ++b) {
    ev.start(current());
    for (int k = 0; k < 20; ++k) step();
    blocks.push_back(ev.end_us(current()) / 20);
  }
  out.counters["loop_us"] = median(blocks);
  out.counters["host_us"] = host / static_cast<double>(out.us.size());
  return out;
}

Sample run_model(Model m, Mode mode) {
  int i = 0;
  auto loss_of = [&m](const Tensor& x, const Tensor& t) {
    return torch::cross_entropy_loss(m.forward(x), t);
  };
  auto eager = [&](auto& opt) {
    return time_steps([&] {
      grads_to_none(m.params);
      loss_of(m.xs[i % 4], m.ts[i % 4]).backward();
      opt.step();
      ++i;
    });
  };
  if (mode == Mode::kEager) {
    torch::optim::AdamW opt(m.params, torch::optim::AdamWOptions(2e-3).weight_decay(0.0));
    return eager(opt);
  }
  FusedAdamW opt(m.params);
  if (mode == Mode::kEagerFused) return eager(opt);
  // PyTorch's whole-network capture recipe: warm up on a side stream, every .grad None, capture
  // forward, backward and step.
  Tensor x = m.xs[0].clone(), t = m.ts[0].clone();
  at::cuda::CUDAGraph graph;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    for (int w = 0; w < 3; ++w) {
      grads_to_none(m.params);
      loss_of(x, t).backward();
      opt.step();
    }
    grads_to_none(m.params);
    graph.capture_begin();
    loss_of(x, t).backward();
    opt.step();
    graph.capture_end();
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return time_steps([&] {
    x.copy_(m.xs[i % 4]);
    t.copy_(m.ts[i % 4]);
    graph.replay();
    ++i;
  });
}

// K branches of D x (linear N + relu) on one input, outputs summed, mse loss; with multistream,
// branch i's forward on a stream of its own (bench/bench_models.h's BranchModel).
struct Branches {
  std::vector<std::vector<Tensor>> w, b;
  std::vector<Tensor> params;
  Tensor x, target;
  std::vector<c10::cuda::CUDAStream> streams;

  Branches(int k, int d, std::int64_t n, std::int64_t batch, bool multistream) {
    torch::manual_seed(0);
    const double s = 1.0 / std::sqrt(static_cast<double>(n));
    w.resize(static_cast<std::size_t>(k));
    b.resize(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < d; ++j) {
        w[i].push_back(param(uniform({n, n}, s)));
        b[i].push_back(param(uniform({n}, 0.1)));
        params.push_back(w[i].back());
        params.push_back(b[i].back());
      }
      if (multistream) streams.push_back(c10::cuda::getStreamFromPool());
    }
    x = torch::randn({batch, n}, f32());
    target = torch::randn({batch, n}, f32());
  }
  Tensor loss() const {
    const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream();
    Tensor total;
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::unique_ptr<c10::cuda::CUDAStreamGuard> g;
      if (!streams.empty()) {
        at::cuda::CUDAEvent fork;
        fork.record(main);
        fork.block(streams[i]);
        g = std::make_unique<c10::cuda::CUDAStreamGuard>(streams[i]);
      }
      Tensor h = x;
      for (std::size_t j = 0; j < w[i].size(); ++j) h = torch::relu(torch::linear(h, w[i][j], b[i][j]));
      if (g) {
        g.reset();
        at::cuda::CUDAEvent join;
        join.record(streams[i]);
        join.block(main);
      }
      total = total.defined() ? total + h : h;
    }
    return torch::mse_loss(total, target);
  }
};

// A study row: branches, depth, width, batch, multistream, graph (0 eager, 1 captured with every
// .grad None, 2 captured accumulating); `iterations` timed backwards.
Sample run_study(const std::vector<std::int64_t>& a, int iterations) {
  const int k = static_cast<int>(a[0]), d = static_cast<int>(a[1]);
  const int graph = static_cast<int>(a[5]);
  Branches m(k, d, a[2], a[3], a[4] != 0);
  Events ev;
  Sample out;
  double host = 0;
  if (graph == 0) {
    for (int i = 0; i < 10; ++i) {
      grads_to_none(m.params);
      m.loss().backward();
    }
    for (int it = 0; it < iterations; ++it) {
      grads_to_none(m.params);
      const Tensor loss = m.loss();
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      out.us.push_back(time_once(ev, &host, [&] { loss.backward(); }));
    }
  } else {
    at::cuda::CUDAGraph g;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    Tensor loss;
    {
      c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
      loss = m.loss();
      for (int i = 0; i < 3; ++i) {
        if (graph == 1) grads_to_none(m.params);
        loss.backward({}, /*retain_graph=*/true);
      }
      if (graph == 1) grads_to_none(m.params);
      g.capture_begin();
      loss.backward({}, /*retain_graph=*/true);
      g.capture_end();
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (int i = 0; i < 10; ++i) g.replay();
    for (int it = 0; it < iterations; ++it) {
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      out.us.push_back(time_once(ev, &host, [&] { g.replay(); }));
    }
  }
  out.counters["host_us"] = host / static_cast<double>(iterations);
  return out;
}

const char* mode_name(Mode m) {
  return m == Mode::kEager ? "eager" : m == Mode::kEagerFused ? "eager_fused" : "graph_fused";
}

struct Row {
  std::string name;
  std::function<Sample()> run;  // one repetition
};

std::vector<Row> all_rows() {
  std::vector<Row> rows;
  struct Sizes {
    int a, b, c;
  };
  for (const Mode mode : {Mode::kEager, Mode::kEagerFused, Mode::kGraphFused}) {
    const std::string suffix = std::string("/mode:") + mode_name(mode);
    for (const Sizes z : {Sizes{256, 4, 128}, Sizes{2048, 4, 1024}}) {
      rows.push_back({"Libtorch/mlp/hidden:" + std::to_string(z.a) + "/layers:" +
                          std::to_string(z.b) + "/batch:" + std::to_string(z.c) + suffix,
                      [=] { return run_model(make_mlp(z.a, z.b, z.c), mode); }});
    }
    for (const Sizes z : {Sizes{64, 16, 16}, Sizes{256, 32, 64}}) {
      for (const bool cl : {false, true}) {
        rows.push_back({"Libtorch/convnet/batch:" + std::to_string(z.a) + "/image:" +
                            std::to_string(z.b) + "/channels:" + std::to_string(z.c) + suffix +
                            (cl ? "+channels_last" : ""),
                        [=] { return run_model(make_convnet(z.a, z.b, z.c, cl), mode); }});
      }
    }
    for (const Sizes z : {Sizes{16, 32, 64}, Sizes{32, 128, 256}}) {
      for (const bool sdpa : {false, true}) {
        rows.push_back({"Libtorch/transformer/batch:" + std::to_string(z.a) + "/seq:" +
                            std::to_string(z.b) + "/dim:" + std::to_string(z.c) + suffix +
                            (sdpa ? "+sdpa" : ""),
                        [=] { return run_model(make_transformer(z.a, z.b, z.c, sdpa), mode); }});
      }
    }
  }
  // The studies (branches, depth, width, batch, multistream) and the review's sweep (two
  // parallel linears on an N x N input), eager and captured.
  std::vector<std::vector<std::int64_t>> studies = {
      {4, 8, 256, 64, 0}, {4, 8, 256, 64, 1}, {1, 32, 256, 64, 0}, {4, 4, 1024, 256, 0},
      {4, 4, 1024, 256, 1}};
  for (std::int64_t n = 64; n <= 8192; n *= 2) {
    studies.push_back({2, 1, n, n, 0});
    studies.push_back({2, 1, n, n, 1});
  }
  for (const auto& s : studies) {
    for (std::int64_t graph = 0; graph <= 2; ++graph) {
      if (graph == 2 && s[0] == 2 && s[1] == 1) continue;  // accumulating: the studies alone
      std::vector<std::int64_t> a = s;
      a.push_back(graph);
      std::string name = "LibtorchStudy";
      const char* names[] = {"branches", "depth", "width", "batch", "multistream", "graph"};
      for (std::size_t i = 0; i < a.size(); ++i) {
        name += "/" + std::string(names[i]) + ":" + std::to_string(a[i]);
      }
      const int iterations = s[2] <= 2048 ? 100 : 10;
      rows.push_back({name, [a, iterations] { return run_study(a, iterations); }});
    }
  }
  return rows;
}

// A JSON string literal of `s` (quotes, backslashes and control characters escaped).
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The rows done so far, as Google Benchmark's JSON (the schema scripts/strongest_table.py reads).
void write_json(const std::string& path, const std::vector<std::string>& entries) {
  if (path.empty()) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "graphward_libtorch_compare: cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "{\n \"context\": {\"library\": \"libtorch %s\"},\n \"benchmarks\": [\n",
               TORCH_VERSION);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::fprintf(f, "  %s%s\n", entries[i].c_str(), i + 1 < entries.size() ? "," : "");
  }
  std::fprintf(f, " ]\n}\n");
  std::fclose(f);
}

// Note [No iostream beside libtorch]: PyTorch's warnings, printf'd.
class PrintfWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    std::fprintf(stderr, "libtorch warning: %s\n", w.msg().c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string filter = ".*", out_path;
  int repetitions = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> const char* {
      return a.substr(0, flag.size()) == flag ? argv[i] + flag.size() : nullptr;
    };
    if (const char* v = value("--filter=")) {
      filter = v;
    } else if (const char* v = value("--out=")) {
      out_path = v;
    } else if (const char* v = value("--repetitions=")) {
      repetitions = std::atoi(v);
    } else {
      std::fprintf(stderr,
                   "graphward_libtorch_compare: unknown argument '%s'; expected --filter=REGEX, "
                   "--repetitions=N or --out=FILE.json\n",
                   argv[i]);
      return 1;
    }
  }
  if (repetitions < 1) {
    std::fprintf(stderr, "graphward_libtorch_compare: --repetitions must be at least 1\n");
    return 1;
  }
  std::regex pattern;
  try {
    pattern = std::regex(filter);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "graphward_libtorch_compare: bad --filter '%s': %s\n", filter.c_str(),
                 e.what());
    return 1;
  }
  PrintfWarnings warnings;
  const c10::WarningUtils::WarningHandlerGuard warnings_here(&warnings);
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "graphward_libtorch_compare: libtorch sees no CUDA device\n");
    return 2;
  }
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setBenchmarkCuDNN(true);
  std::printf("libtorch %s; medians of %d repetitions (each the median of its iterations), us\n",
              TORCH_VERSION, repetitions);
  std::printf("%-100s %10s %10s %10s\n", "row", "time", "loop_us", "host_us");
  std::vector<std::string> entries;
  for (const Row& row : all_rows()) {
    if (!std::regex_search(row.name, pattern)) continue;
    std::fprintf(stderr, "graphward_libtorch_compare: %s\n", row.name.c_str());  // where one died
    std::vector<double> times;
    std::map<std::string, std::vector<double>> counters;
    std::size_t iterations = 0;
    std::string error;
    try {
      for (int r = 0; r < repetitions; ++r) {
        const Sample s = row.run();
        times.push_back(median(s.us));
        iterations += s.us.size();
        for (const auto& [k, v] : s.counters) counters[k].push_back(v);
      }
    } catch (const std::exception& e) {
      const std::string what = e.what();
      error = "cannot run: " + what.substr(0, what.find('\n'));
    }
    std::string entry;
    if (!error.empty()) {
      entry = "{\"name\": " + json_string(row.name) + ", \"run_name\": " + json_string(row.name) +
              ", \"error_occurred\": true, \"error_message\": " + json_string(error) + "}";
      std::printf("%-100s %s\n", row.name.c_str(), error.c_str());
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3f", median(times));
      entry = "{\"name\": " + json_string(row.name + "_median") +
              ", \"run_name\": " + json_string(row.name) +
              ", \"run_type\": \"aggregate\", \"aggregate_name\": \"median\", \"repetitions\": " +
              std::to_string(repetitions) + ", \"iterations\": " + std::to_string(iterations) +
              ", \"real_time\": " + buf + ", \"time_unit\": \"us\"";
      for (const auto& [k, v] : counters) {
        std::snprintf(buf, sizeof buf, "%.3f", median(v));
        entry += ", " + json_string(k) + ": " + buf;
      }
      entry += "}";
      const auto counter = [&](const char* k) {
        const auto it = counters.find(k);
        return it == counters.end() ? -1.0 : median(it->second);
      };
      std::printf("%-100s %10.1f %10.1f %10.1f\n", row.name.c_str(), median(times),
                  counter("loop_us"), counter("host_us"));
    }
    std::fflush(stdout);
    entries.push_back(std::move(entry));
    write_json(out_path, entries);
  }
  return 0;
}
