// Data-parallel training (Note [Gradient reduction], dist/process_group.h): one process per GPU,
// each training an MLP on its own part of every batch; the gradients are averaged across the
// processes by NCCL, bucket by bucket, inside the backward (and inside its captured graph).
// Launch with scripts/run_dp.sh N [flags] (it sets GRAPHWARD_RANK, GRAPHWARD_WORLD_SIZE,
// GRAPHWARD_LOCAL_RANK and GRAPHWARD_NCCL_ID_FILE); run alone it is a group of one.
//
//   train_dp [--steps N] [--mode eager|backward|step|all] [--width W] [--layers L] [--branches K]
//            [--batch B]
//            [--bucket-mib M] [--first-bucket-mib M] [--grads-in-buckets on|off]
//            [--nccl-max-ctas N] [--grad-write overwrite|accumulate]
//            [--check] [--bench] [--with-reducer] [--trace FILE] [--dot PREFIX]
//            [--collective-timeout S] [--die-at-step N]
//
// --batch is each rank's part; the global batch is B × world size. Every rank starts from rank
// 0's parameters (broadcast). With --check, after each mode every rank must hold the same
// parameters bit for bit, and rank 0 trains the same model on one GPU on the concatenated batch:
// the parameters must agree within float32 rounding (else the exit status is 1). With --bench,
// the batches are made before the loop (a step copies one into the static inputs, as a data
// loader would) and each step is timed with CUDA events on its stream; the median after the first
// fifth of the steps is printed, and the host's (the loop's wall clock a step); one rank alone
// then trains with no reducer (the single-GPU baseline) unless --with-reducer (a group of one:
// NCCL's kernels and the copies on its own GPU, no other GPU to wait for). With --trace
// (backward-graph mode), every rank replays one more step traced (Note [Timeline]) and rank 0
// writes its timeline, the bucket reductions on a track of their own beside the backward's streams.
// With --dot (step-graph mode), every rank writes its captured step graph as Graphviz DOT, every
// node's parameters included, to PREFIX.r<rank>.dot.
// --collective-timeout S: the group's collective_timeout_s (default 300). --die-at-step N: the last
// rank ends its process right after it launched step N of the first mode (a peer that dies
// mid-replay), and the other ranks read their loss every step: Note [Replay watchdog]
// (dist/watchdog.h) turns their wait into an error naming the rank, the graph and the replay
// within the timeout, instead of a hang.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graphward/capture/backward_graph.h"
#include "graphward/capture/step_graph.h"
#include "graphward/dist/process_group.h"
#include "examples/args.h"
#include "examples/example_main.h"
#include "graphward/graphward.h"

namespace gw = graphward;

namespace {

struct Config {
  int steps = 20;
  std::int64_t width = 256, layers = 4, batch = 64, out = 16, branches = 1;
  double bucket_mib = 25, first_bucket_mib = 1;  // as PyTorch's DistributedDataParallel
  // ProcessGroupOptions
  std::string grads_in_buckets = "on";
  int nccl_max_ctas = 0;
  gw::GradWrite grad_write = gw::GradWrite::kOverwrite;  // each step's backward
  bool check = false;
  bool bench = false;
  bool with_reducer = false;
  std::string trace, dot;
  double collective_timeout_s = 300;
  int die_at_step = -1;  // the last rank exits right after launching this step (-1: never)
  bool last_rank = false;
};

enum class Mode { kEager, kBackwardGraph, kStepGraph };
const char* mode_name(Mode m) {
  return m == Mode::kEager ? "eager" : m == Mode::kBackwardGraph ? "backward graph" : "step graph";
}

// The MLP: `layers` Linear + GELU, then the output layer. With --branches K (K > 1), the
// structure of docs/DESIGN.md's K-branch study instead: K branches of `layers` Linear + ReLU, each
// branch's forward on a stream of its own, the branch outputs summed, then the output layer.
struct Mlp {
  std::vector<gw::Tensor> params;  // per branch w0, b0, w1, b1, ...; the output layer last
  std::int64_t branches, layers;
  std::vector<std::unique_ptr<gw::Stream>> streams;  // one per branch (K > 1)
  Mlp(const Config& c, gw::Device dev, std::uint64_t seed)
      : branches(c.branches), layers(c.layers) {
    const gw::TensorOptions f32{gw::DType::kFloat32, dev};
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.width));
    std::uint64_t key = seed * 1000;
    auto layer = [&](std::int64_t out) {
      params.push_back(
          gw::mul(gw::randn({out, c.width}, key++, f32), scale).detach().set_requires_grad(true));
      params.push_back(gw::zeros({out}, f32).set_requires_grad(true));
    };
    for (std::int64_t b = 0; b < branches; ++b) {
      for (std::int64_t l = 0; l < layers; ++l) layer(c.width);
    }
    layer(c.out);
    if (branches > 1 && dev.is_cuda()) {
      for (std::int64_t b = 0; b < branches; ++b) streams.push_back(std::make_unique<gw::Stream>(dev));
    }
  }
  gw::Tensor loss(const gw::Tensor& x, const gw::Tensor& t) const {
    const gw::Activation act = branches > 1 ? gw::Activation::kRelu : gw::Activation::kGelu;
    gw::Tensor sum;
    for (std::int64_t b = 0; b < branches; ++b) {
      std::optional<gw::StreamGuard> on;
      if (!streams.empty()) on.emplace(*streams[static_cast<std::size_t>(b)]);
      gw::Tensor h = x;
      for (std::int64_t l = 0; l < layers; ++l) {
        const auto i = static_cast<std::size_t>(2 * (b * layers + l));
        h = gw::linear(h, params[i], params[i + 1], act);
      }
      on.reset();  // the sum on the caller's stream
      sum = sum.defined() ? gw::add(sum, h) : h;
    }
    const std::size_t o = params.size() - 2;
    return gw::mse_loss(gw::linear(sum, params[o], params[o + 1]), t);
  }
};

// Rank r's part of step s's batch (the global batch is the parts in rank order): random inputs,
// and as targets what a fixed random "teacher" layer makes of them (something to learn).
void fill_part(const gw::Tensor& x, const gw::Tensor& t, const gw::Tensor& teacher, int step,
               int rank) {
  gw::NoGradGuard no_grad;
  const std::uint64_t key = 1000003ull * static_cast<std::uint64_t>(step) + rank;
  gw::copy_(x, gw::randn(x.shape(), 7 * key + 1, {gw::DType::kFloat32, x.device()}));
  gw::copy_(t, gw::tanh(gw::linear(x, teacher)));
}

struct Result {
  float first_loss = 0, last_loss = 0;
  double ms_per_step = 0;  // the median (--bench) or the mean (wall clock, every step)
  double host_ms_per_step = 0;  // --bench: the median of the loop's wall clock a step
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Trains `model` for c.steps steps on the parts `parts` (rank indices) of every batch, with the
// gradients reduced by `pg` (nullptr: none).
Result train(const Config& c, gw::Device dev, Mode mode, Mlp& model, const std::vector<int>& parts,
             gw::dist::ProcessGroup* pg) {
  const gw::TensorOptions f32{gw::DType::kFloat32, dev};
  const auto rows = static_cast<std::int64_t>(parts.size()) * c.batch;
  const gw::Tensor x = gw::zeros({rows, c.width}, f32), t = gw::zeros({rows, c.out}, f32);
  std::vector<gw::Tensor> xs, ts;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    xs.push_back(gw::zeros({c.batch, c.width}, f32));
    ts.push_back(gw::zeros({c.batch, c.out}, f32));
  }
  const gw::Tensor teacher =
      gw::mul(gw::randn({c.out, c.width}, 99, f32), 2.0 / std::sqrt(static_cast<double>(c.width)));
  auto make = [&](int step, const gw::Tensor& into_x, const gw::Tensor& into_t) {
    gw::NoGradGuard no_grad;
    for (std::size_t p = 0; p < parts.size(); ++p) fill_part(xs[p], ts[p], teacher, step, parts[p]);
    gw::copy_(into_x, parts.size() == 1 ? xs[0] : gw::concat(xs, 0));
    gw::copy_(into_t, parts.size() == 1 ? ts[0] : gw::concat(ts, 0));
  };
  // --bench: a few batches made before the loop, copied into the static inputs each step.
  constexpr int kBatches = 4;
  std::vector<gw::Tensor> bx, bt;
  if (c.bench) {
    for (int k = 0; k < kBatches; ++k) {
      bx.push_back(gw::zeros({rows, c.width}, f32));
      bt.push_back(gw::zeros({rows, c.out}, f32));
      make(k, bx.back(), bt.back());
    }
  }
  auto fill = [&](int step) {
    if (!c.bench) return make(step, x, t);
    gw::NoGradGuard no_grad;
    gw::copy_(x, bx[static_cast<std::size_t>(step % kBatches)]);
    gw::copy_(t, bt[static_cast<std::size_t>(step % kBatches)]);
  };
  const bool timed = c.bench && dev.is_cuda();
  std::vector<gw::Event> begin_events, end_events;
  for (int s = 0; timed && s < c.steps; ++s) {
    begin_events.emplace_back(dev, true);
    end_events.emplace_back(dev, true);
  }
  std::vector<double> wall_ms;
  gw::Sgd opt(model.params, {.lr = 0.05});
  gw::BackwardGraph bw(dev, {.backward = {.reduce_gradients = pg}});
  gw::StepGraph step_graph(dev, {x, t});
  Result r;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < c.steps; ++s) {
    const auto wall_start = std::chrono::steady_clock::now();
    if (timed) begin_events[static_cast<std::size_t>(s)].record(gw::current_stream(dev));
    fill(s);
    gw::Tensor loss;
    switch (mode) {
      case Mode::kEager:
        loss = model.loss(x, t);
        gw::backward(loss, {.grad_write = c.grad_write, .reduce_gradients = pg});
        opt.step();
        break;
      case Mode::kBackwardGraph:
        loss = model.loss(x, t);
        bw.backward(loss, c.grad_write);
        opt.step();
        break;
      case Mode::kStepGraph:
        loss = step_graph.run([&] {
          gw::Tensor l = model.loss(x, t);
          gw::backward(l, {.grad_write = c.grad_write, .reduce_gradients = pg});
          opt.step();
          return l;
        });
        break;
    }
    if (timed) end_events[static_cast<std::size_t>(s)].record(gw::current_stream(dev));
    if (s == c.die_at_step && c.last_rank) {
      std::fprintf(stderr, "train_dp: the last rank ends its process after launching step %d\n", s);
      std::fflush(stderr);
      std::_Exit(3);  // a peer that dies mid-replay: no teardown, no goodbye
    }
    if (s == 0) {
      r.first_loss = static_cast<float>(loss.item());
    } else if (c.die_at_step >= 0) {
      (void)loss.item();  // the survivors wait for every step (Note [Replay watchdog])
    }
    if (s == c.steps - 1) r.last_loss = static_cast<float>(loss.item());
    wall_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                wall_start).count());
  }
  if (!c.bench) {
    r.ms_per_step = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              start).count() / c.steps;
  } else {
    // The median after the first fifth (warm-up, captures); the first step's .item() excluded.
    std::vector<double> ms, host;
    for (int s = std::max(1, c.steps / 5); s < c.steps; ++s) {
      const auto k = static_cast<std::size_t>(s);
      ms.push_back(timed ? end_events[k].elapsed_ms_since(begin_events[k]) : wall_ms[k]);
      if (s < c.steps - 1) host.push_back(wall_ms[k]);  // the last step's .item() waits
    }
    r.ms_per_step = median(ms);
    r.host_ms_per_step = median(host);
  }
  if (!c.dot.empty() && mode == Mode::kStepGraph && dev.is_cuda() && parts.size() == 1) {
    const std::string path = c.dot + ".r" + std::to_string(parts[0]) + ".dot";
    step_graph.write_dot(path, /*verbose=*/true);
    std::printf("  step graph: %s (%zu kernel nodes of %zu)\n", path.c_str(),
                step_graph.kernel_nodes(), step_graph.graph_nodes());
  }
  if (!c.trace.empty() && mode == Mode::kBackwardGraph && pg && dev.is_cuda()) {
    const std::vector<gw::StepTiming> steps = bw.trace(model.loss(x, t), c.grad_write);
    if (pg->rank() == 0) {
      gw::write_chrome_trace(c.trace, steps, bw.trace_stream_names(),
                             "train_dp: a traced replay, rank 0 of " +
                                 std::to_string(pg->world_size()));
      std::size_t reductions = 0;
      for (const gw::StepTiming& st : steps) reductions += st.label.rfind("reduce bucket", 0) == 0;
      std::printf("  timeline: %s (%zu backward steps, %zu bucket reductions)\n", c.trace.c_str(),
                  steps.size() - reductions, reductions);
    }
  }
  return r;
}

// The largest relative error ||a - b|| / ||b|| over the parameters, and which parameter it is.
struct Worst {
  double error = 0;
  std::size_t index = 0;
};
Worst max_rel_error(const std::vector<gw::Tensor>& a, const std::vector<gw::Tensor>& b) {
  Worst worst;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::vector<float> x = a[i].to_vector<float>(), y = b[i].to_vector<float>();
    double num = 0, den = 0;
    for (std::size_t j = 0; j < x.size(); ++j) {
      num += (static_cast<double>(x[j]) - y[j]) * (static_cast<double>(x[j]) - y[j]);
      den += static_cast<double>(y[j]) * y[j];
    }
    const double err = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
    if (err > worst.error) worst = {err, i};
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ex = gw::examples;
  try {
    Config c;
    std::string mode = "all", grad_write = "overwrite";
    // Flags with a value, and switches (the examples' Flags, examples/example_main.h).
    const gw::examples::Flags values = {
        {"--steps", [&](const char* v) { c.steps = ex::parse_count("--steps", v, 2); }},
        {"--mode", [&](const char* v) { mode = v; }},
        {"--width", [&](const char* v) { c.width = ex::parse_int("--width", v, 1); }},
        {"--layers", [&](const char* v) { c.layers = ex::parse_int("--layers", v, 1); }},
        {"--branches", [&](const char* v) { c.branches = ex::parse_int("--branches", v, 1); }},
        {"--batch", [&](const char* v) { c.batch = ex::parse_int("--batch", v, 1); }},
        {"--bucket-mib",
         [&](const char* v) { c.bucket_mib = ex::parse_number("--bucket-mib", v, 0, 1 << 20); }},
        {"--first-bucket-mib",
         [&](const char* v) {
           c.first_bucket_mib = ex::parse_number("--first-bucket-mib", v, 0, 1 << 20);
         }},
        {"--grads-in-buckets", [&](const char* v) { c.grads_in_buckets = v; }},
        {"--nccl-max-ctas",
         [&](const char* v) { c.nccl_max_ctas = ex::parse_count("--nccl-max-ctas", v, 0); }},
        {"--grad-write", [&](const char* v) { grad_write = v; }},
        {"--trace", [&](const char* v) { c.trace = v; }},
        {"--collective-timeout",
         [&](const char* v) {
           c.collective_timeout_s = ex::parse_number("--collective-timeout", v, 0, 1e6);
         }},
        {"--die-at-step", [&](const char* v) { c.die_at_step = ex::parse_count("--die-at-step", v, 0); }},
        {"--dot", [&](const char* v) { c.dot = v; }},
    };
    const std::map<std::string, bool*> switches = {
        {"--check", &c.check}, {"--bench", &c.bench}, {"--with-reducer", &c.with_reducer}};
    ex::ArgReader args(argc, argv);
    std::string known;
    for (const auto& [flag, _] : values) known += (known.empty() ? "" : ", ") + flag + " V";
    for (const auto& [flag, _] : switches) known += ", " + flag;
    known +=
        " (--mode eager|backward|step|all, --grads-in-buckets on|off; --flag V and --flag=V "
        "alike)";
    while (args.next()) {
      if (args.wants_help()) {
        std::printf("usage: train_dp %s\n", known.c_str());
        return 0;
      } else if (auto f = values.find(args.name()); f != values.end()) {
        const std::string v = args.value();
        f->second(v.c_str());
      } else if (auto sw = switches.find(args.name()); sw != switches.end()) {
        args.no_value();
        *sw->second = true;
      } else {
        throw gw::Error("unknown argument " + args.name() + "; expected " + known);
      }
    }
    if (c.steps < 2 || c.width < 1 || c.layers < 1 || c.batch < 1 || c.branches < 1 ||
        !(c.bucket_mib > 0) ||
        !(c.first_bucket_mib > 0)) {
      throw gw::Error("expected --steps >= 2 and positive sizes");
    }
    std::vector<Mode> modes;
    if (mode == "eager" || mode == "all") modes.push_back(Mode::kEager);
    if (mode == "backward" || mode == "all") modes.push_back(Mode::kBackwardGraph);
    if (mode == "step" || mode == "all") modes.push_back(Mode::kStepGraph);
    if (modes.empty()) throw gw::Error("--mode " + mode + "; expected eager, backward, step or all");
    if (!c.trace.empty() && !gw::cuda_available()) {
      std::printf("train_dp: --trace: no timeline on the CPU backend (CUDA timing events)\n");
    }

    const bool gpu = gw::cuda_available();
    gw::dist::ProcessGroupOptions po;
    po.bucket_bytes = static_cast<std::size_t>(c.bucket_mib * (1 << 20));
    po.first_bucket_bytes = static_cast<std::size_t>(c.first_bucket_mib * (1 << 20));
    if (!gpu) po.device = gw::Device::cpu();
    if (c.grads_in_buckets != "on" && c.grads_in_buckets != "off") {
      throw gw::Error("--grads-in-buckets " + c.grads_in_buckets + "; expected on or off");
    }
    po.gradients_in_buckets = c.grads_in_buckets == "on";
    if (c.nccl_max_ctas < 0) throw gw::Error("expected --nccl-max-ctas >= 0 (0: NCCL's choice)");
    po.nccl_max_ctas = c.nccl_max_ctas;
    po.collective_timeout_s = c.collective_timeout_s;
    if (grad_write != "overwrite" && grad_write != "accumulate") {
      throw gw::Error("--grad-write " + grad_write + "; expected overwrite or accumulate");
    }
    c.grad_write = grad_write == "overwrite" ? gw::GradWrite::kOverwrite
                                             : gw::GradWrite::kAccumulate;
    gw::dist::ProcessGroup pg(po);
    const gw::Device dev = pg.device();
    const int rank = pg.rank(), world = pg.world_size();
    c.last_rank = world > 1 && rank == world - 1;
    if (rank == 0) {
      std::printf(
          "train_dp: %d rank(s) on %s; %lld branch(es) of %lld x %lld, batch %lld a rank (%lld in "
          "all), "
          "buckets of %.1f MiB (the first %.1f, gradients in buckets %s, NCCL CTAs %s), "
          "%d steps%s\n",
          world, gpu ? "CUDA" : ("the CPU backend (" + gw::cuda_unavailable_reason() + ")").c_str(),
          static_cast<long long>(c.branches), static_cast<long long>(c.layers),
          static_cast<long long>(c.width), static_cast<long long>(c.batch),
          static_cast<long long>(c.batch * world), c.bucket_mib, c.first_bucket_mib,
          c.grads_in_buckets.c_str(),
          c.nccl_max_ctas > 0 ? std::to_string(c.nccl_max_ctas).c_str() : "NCCL's choice", c.steps,
          c.check ? ", checked" : "");
    }
    bool ok = true;
    for (Mode m : modes) {
      Mlp model(c, dev, 1 + static_cast<std::uint64_t>(rank));  // each rank its own start...
      pg.broadcast(model.params);  // ...then rank 0's everywhere
      // --bench alone: the single-GPU baseline, no reducer (--with-reducer: a group of one).
      const Result r =
          train(c, dev, m, model, {rank}, world == 1 && c.bench && !c.with_reducer ? nullptr : &pg);
      std::string verdict;
      if (c.check) {
        pg.check_identical(model.params, std::string("the parameters after ") + mode_name(m));
        if (rank == 0) {
          Mlp single(c, dev, 1);
          std::vector<int> all(static_cast<std::size_t>(world));
          for (int p = 0; p < world; ++p) all[static_cast<std::size_t>(p)] = p;
          (void)train(c, dev, m, single, all, nullptr);
          const Worst w = max_rel_error(model.params, single.params);
          const bool close = w.error < 1e-4;
          ok = ok && close;
          verdict = "; ranks identical; vs one process on the whole batch: max rel. error ";
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.2e", w.error);
          verdict += std::string(buf) + (close ? " (ok)" : " (FAIL, expected < 1e-4: parameter " +
                                         std::to_string(w.index) + " of " +
                                         std::to_string(single.params.size()) + ", " +
                                         single.params[w.index].str() + ")");
        }
      }
      if (rank == 0) {
        char host[48] = "";
        if (c.bench) std::snprintf(host, sizeof host, ", host %.3f ms/step", r.host_ms_per_step);
        std::printf("  %-15s loss %.4f -> %.4f, %.3f ms/step%s%s%s\n", mode_name(m), r.first_loss,
                    r.last_loss, r.ms_per_step, c.bench ? " (median)" : "", host, verdict.c_str());
      }
    }
    if (rank == 0 && world > 1) {
      std::printf("  buckets placed %zu, of them symmetric NCCL windows %zu, last backward %s\n",
                  pg.placed_buckets(), pg.symmetric_buckets(),
                  pg.summed() ? "summed (seeds / world size)" : "averaged");
    }
    if (rank == 0) std::printf("train_dp: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_dp: %s\n", e.what());
    return 1;
  }
}
