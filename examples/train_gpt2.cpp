// Trains GPT-2 (examples/gpt2.h: llm.c's model and recipe — AdamW β 0.9/0.95, weight decay 0.1 on
// the matrices, the learning rate warmed up and decayed on the device, the gradients clipped at
// 1.0 on the device, micro-batches accumulated in one step) on llm.c's token shards, or on a
// synthetic shard it writes first, and prints the loss and the time per step, tokens/s, the
// model's TFLOP/s (MFU: against the GPU's peak), the captures and the peak GPU memory of each
// mode. On the GPU when one is usable (GPT-2 small, llm.c's d12, in bfloat16 by default), else
// on the CPU backend at a tiny size (it says which).
//
//   train_gpt2 [--cpu] [--steps N] [--mode eager|backward|step|all] [--precision fp32|tf32|bf16]
//              [--data SHARD[,SHARD...]] [--batch B] [--seq T] [--accum K] [--depth L]
//              [--width C] [--heads H] [--vocab V] [--padded-vocab VP] [--lr LR] [--warmup N]
//              [--final-lr-fraction F] [--clip X] [--weight-decay W] [--print-every N]
//              [--save CKPT] [--resume CKPT] [--save-init CKPT] [--losses CSV] [--dp]
// --save: a checkpoint of the run at its end (examples/checkpoint.h: parameters, AdamW's state,
// the step, the data position); --resume: go on from one, to --steps (the same flags and data:
// a resumed run ends bitwise where an uninterrupted one would; on the GPU in another process with
// GRAPHWARD_GEMM_TUNING=0, Note [Choosing a GEMM algorithm]); --save-init: the parameters
// before the first step (scripts/gpt2_torch.py starts PyTorch's model from them); --losses:
// every step's loss as CSV (each read synchronizes: for comparisons, not timings); --dp: data
// parallel over the ranks scripts/run_dp.sh starts (dist::ProcessGroup, NCCL: each rank its own
// windows of the data, the gradients averaged inside the backward; on the CPU a group of one).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "examples/args.h"
#include "examples/device_peak.h"
#include "examples/gpt2.h"


namespace ex = graphward::examples;
using graphward::Device;
using graphward::Error;
using graphward::Tensor;

namespace {

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? comma : comma - start);
    if (item.empty()) throw Error("--data has an empty path in '" + list + "'");
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

struct Run {
  double first_loss = 0, last_loss = 0, ms_per_step = 0;
  std::uint64_t captures = 0;
  double peak_mib = -1;  // -1: not measured (the CPU)
};

struct Checkpoints {
  std::string save, resume, save_init;  // paths; empty: none
  std::string losses;                   // a CSV of every step's loss; empty: none
};

Run train(const ex::Gpt2TrainConfig& c, Device dev, ex::Mode mode, int steps,
          const std::vector<std::string>& shards, int print_every, const Checkpoints& ck,
          graphward::dist::ProcessGroup* group) {
  ex::synchronize_device(dev);
  ex::reset_device_peak(dev);
  // The shards checked before the model is built.
  ex::TokenShards data(shards, c.model.batch, c.model.seq, c.model.vocab,
                       group ? group->rank() : 0, group ? group->world_size() : 1);
  ex::Gpt2Trainer trainer(c, dev, mode, group);
  int first = 0;
  if (!ck.resume.empty()) {
    const ex::Gpt2Trainer::Resumed r = trainer.load(ck.resume);
    if (r.step >= steps) {
      throw Error("--resume: '" + ck.resume + "' is at step " + std::to_string(r.step) +
                  "; expected fewer than the run's " + std::to_string(steps) + " steps");
    }
    data.seek(r.data);
    first = static_cast<int>(r.step);
    std::printf("    resumed from '%s' at step %d\n", ck.resume.c_str(), first);
  }
  if (!ck.save_init.empty() && first == 0) {
    trainer.save(ck.save_init, 0, data.position());
    std::printf("    saved the initial parameters to '%s'\n", ck.save_init.c_str());
  }
  std::FILE* losses = nullptr;
  if (!ck.losses.empty()) {
    losses = std::fopen(ck.losses.c_str(), "w");
    if (losses == nullptr) throw Error("--losses: cannot open '" + ck.losses + "' for writing");
    std::fprintf(losses, "step,loss\n");
  }
  struct Closer {
    std::FILE*& f;
    ~Closer() {
      if (f) std::fclose(f);
    }
  } closer{losses};
  std::vector<std::int32_t> xs, ys;
  auto next_step = [&](std::vector<Tensor>& x, std::vector<Tensor>& y) {
    x.clear(), y.clear();
    for (int k = 0; k < c.accum; ++k) {  // new batch tensors each step, as a loop makes them
      data.next(xs, ys);
      x.push_back(graphward::from_vector(xs, {c.model.batch, c.model.seq}, dev));
      y.push_back(graphward::from_vector(ys, {c.model.batch * c.model.seq}, dev));
    }
  };
  Run r;
  std::vector<Tensor> x, y;
  Tensor loss;
  const int untimed = first + (steps - first > 10 ? 5 : 1);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = first; i < steps; ++i) {
    if (i == untimed) {
      ex::synchronize_device(dev);
      t0 = std::chrono::steady_clock::now();
    }
    next_step(x, y);
    loss = trainer.step(x, y);
    if (i == first) r.first_loss = loss.item();
    if (losses) std::fprintf(losses, "%d,%.9g\n", i, loss.item());  // reads it: synchronizes
    if (print_every > 0 && i > 0 && i % print_every == 0) {
      std::printf("    step %d/%d: loss %.4f, lr %.3g\n", i, steps, loss.item(),
                  trainer.optimizer().lr_at(i));
      std::fflush(stdout);
    }
  }
  ex::synchronize_device(dev);
  const auto t1 = std::chrono::steady_clock::now();
  r.last_loss = loss.item();
  r.ms_per_step = steps > untimed
                      ? std::chrono::duration<double, std::milli>(t1 - t0).count() /
                            (steps - untimed)
                      : 0.0;
  r.captures = trainer.captures();
  r.peak_mib = ex::device_peak_mib(dev);
  if (!ck.save.empty()) {
    trainer.save(ck.save, steps, data.position());
    std::printf("    saved the run at step %d to '%s'\n", steps, ck.save.c_str());
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bool force_cpu = false;
    int steps = 50, print_every = 10;
    std::string mode = "step", precision;
    std::vector<std::string> shards;
    ex::Gpt2TrainConfig c;
    Checkpoints ck;
    bool dp = false;
    // Sizes given on the command line; the rest default by device (d12 on the GPU, tiny on the CPU).
    std::vector<std::pair<std::string, std::string>> sizes;
    ex::ArgReader a(argc, argv);
    while (a.next()) {
      if (a.wants_help()) {
        std::printf(
            "train_gpt2 [--cpu] [--steps N] [--mode eager|backward|step|all] [--precision "
            "fp32|tf32|bf16] [--data SHARD[,SHARD...]] [--batch B] [--seq T] [--accum K] "
            "[--depth L] [--width C] [--heads H] [--vocab V] [--padded-vocab VP] [--lr LR] "
            "[--warmup N] [--final-lr-fraction F] [--clip X] [--weight-decay W] "
            "[--print-every N] [--save CKPT] [--resume CKPT] [--save-init CKPT] [--losses CSV] [--dp]\n(on the GPU: GPT-2 small, llm.c's d12, bf16; on the CPU a tiny "
            "GPT-2; without --data, a synthetic shard written first)\n");
        return 0;
      }
      if (a.is("--cpu")) {
        a.no_value();
        force_cpu = true;
      } else if (a.is("--steps")) {
        steps = ex::parse_count("--steps", a.value(), 2);
      } else if (a.is("--mode")) {
        mode = a.value();
      } else if (a.is("--precision")) {
        precision = a.value();
      } else if (a.is("--dp")) {
        a.no_value();
        dp = true;
      } else if (a.is("--save")) {
        ck.save = a.value();
      } else if (a.is("--resume")) {
        ck.resume = a.value();
      } else if (a.is("--save-init")) {
        ck.save_init = a.value();
      } else if (a.is("--losses")) {
        ck.losses = a.value();
      } else if (a.is("--data")) {
        shards = split(a.value());
      } else if (a.is("--accum")) {
        c.accum = ex::parse_count("--accum", a.value());
      } else if (a.is("--lr")) {
        c.model.lr = ex::parse_number("--lr", a.value(), 0.0);
      } else if (a.is("--warmup")) {
        c.warmup_steps = ex::parse_int("--warmup", a.value(), 0);
      } else if (a.is("--final-lr-fraction")) {
        c.final_lr_fraction = ex::parse_number("--final-lr-fraction", a.value(), -1e-300, 1.0);
      } else if (a.is("--clip")) {
        c.clip = ex::parse_number("--clip", a.value(), -1e-300);
      } else if (a.is("--weight-decay")) {
        c.weight_decay = ex::parse_number("--weight-decay", a.value(), -1e-300);
      } else if (a.is("--print-every")) {
        print_every = ex::parse_count("--print-every", a.value(), 0);
      } else if (a.is("--batch") || a.is("--seq") || a.is("--depth") || a.is("--width") ||
                 a.is("--heads") || a.is("--vocab") || a.is("--padded-vocab")) {
        const std::string name = a.name();
        sizes.emplace_back(name, a.value());
      } else {
        throw Error("unknown argument " + a.name() + " (--help lists them)");
      }
    }
    if (mode != "eager" && mode != "backward" && mode != "step" && mode != "all") {
      throw Error("--mode is " + mode + "; expected eager, backward, step or all");
    }
    const bool gpu = !force_cpu && graphward::cuda_available();
    // --dp: a data-parallel group from the environment (GRAPHWARD_RANK, GRAPHWARD_WORLD_SIZE,
    // GRAPHWARD_NCCL_ID_FILE: scripts/run_dp.sh starts the ranks); on the CPU a group of one.
    std::unique_ptr<graphward::dist::ProcessGroup> group;
    if (dp) {
      graphward::dist::ProcessGroupOptions po;
      if (!gpu) po.device = Device::cpu();
      group = std::make_unique<graphward::dist::ProcessGroup>(po);
    }
    const Device dev = group ? group->device() : gpu ? Device::cuda(0) : Device::cpu();
    if (precision.empty()) precision = gpu ? "bf16" : "fp32";
    if (precision != "fp32" && precision != "tf32" && precision != "bf16") {
      throw Error("--precision is " + precision + "; expected fp32, tf32 or bf16");
    }
    if (!gpu) {  // tiny: a GPT-2 the CPU backend trains in seconds
      c.model.batch = 4, c.model.seq = 32, c.model.max_seq = 64;
      c.model.depth = 2, c.model.width = 64, c.model.heads = 4;
      c.model.vocab = 512, c.model.padded_vocab = 512;
      c.model.lr = 3e-3;
    } else {
      c.model.batch = 4, c.model.seq = 64;
    }
    for (const auto& [name, value] : sizes) {
      const std::int64_t v = ex::parse_int(name, value, 1);
      if (name == "--batch") c.model.batch = v;
      if (name == "--seq") c.model.seq = v;
      if (name == "--depth") c.model.depth = v;
      if (name == "--width") c.model.width = v;
      if (name == "--heads") c.model.heads = v;
      if (name == "--vocab") c.model.vocab = v;
      if (name == "--padded-vocab") c.model.padded_vocab = v;
    }
    if (c.model.padded_vocab < c.model.vocab) c.model.padded_vocab = c.model.vocab;
    if (c.model.seq > c.model.max_seq) c.model.max_seq = c.model.seq;
    c.total_steps = steps;
    if (c.warmup_steps >= c.total_steps) {
      throw Error("--warmup is " + std::to_string(c.warmup_steps) + "; expected fewer than the " +
                  std::to_string(steps) + " steps");
    }
    const bool tf32 = precision != "fp32";
    c.bf16 = precision == "bf16";
    graphward::set_matmul_tf32(tf32);
    graphward::set_conv_tf32(tf32);

    std::string synthetic;
    if (shards.empty()) {  // a synthetic shard: enough tokens for every step's windows
      const std::int64_t world = group ? group->world_size() : 1;
      const std::int64_t tokens = c.model.batch * c.model.seq * c.accum * world * (steps + 1) + 1;
      synthetic = (std::filesystem::temp_directory_path() /
                   ("graphward_gpt2_synthetic_" + std::to_string(std::random_device{}()) + "_" +
                    std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) +
                    ".bin"))
                      .string();
      ex::write_token_shard(synthetic, ex::synthetic_tokens(tokens, c.model.vocab, 7));
      shards = {synthetic};
    }
    struct Cleanup {
      std::string path;
      ~Cleanup() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove(path, ignored);
      }
    } cleanup{synthetic};

    const std::int64_t tokens_per_step = c.model.batch * c.model.seq * c.accum;
    std::printf("train_gpt2 on %s (%s): GPT-2 depth %lld, width %lld, %lld heads, vocabulary %lld "
                "(padded %lld), %.1fM parameters; %lld x %lld tokens x %d micro-batch(es) = %lld "
                "tokens a step; %s; data %s; %d steps\n",
                dev.str().c_str(), gpu ? "CUDA" : "CPU backend",
                static_cast<long long>(c.model.depth), static_cast<long long>(c.model.width),
                static_cast<long long>(c.model.heads), static_cast<long long>(c.model.vocab),
                static_cast<long long>(c.model.padded_vocab),
                ex::Gpt2Model::parameter_count(c.model) / 1e6,
                static_cast<long long>(c.model.batch), static_cast<long long>(c.model.seq),
                c.accum, static_cast<long long>(tokens_per_step),
                c.bf16 ? "bf16 autocast, TF32 on" : (tf32 ? "TF32 on" : "fp32"),
                synthetic.empty() ? "from the shards given" : "a synthetic shard", steps);
    if (group) {
      std::printf("  data parallel: rank %d of %d, each its own windows of the data\n",
                  group->rank(), group->world_size());
    }
    std::vector<ex::Mode> modes;
    if (mode == "eager" || mode == "all") modes.push_back(ex::Mode::kEager);
    if (mode == "backward" || mode == "all") modes.push_back(ex::Mode::kBackwardGraph);
    if (mode == "step" || mode == "all") modes.push_back(ex::Mode::kStepGraph);
    for (ex::Mode m : modes) {
      const Run r = train(c, dev, m, steps, shards, print_every, ck, group.get());
      const double flops_per_token = ex::Gpt2Model::flops_per_token(c.model);
      const double tokens_per_s = 1e3 * static_cast<double>(tokens_per_step) / r.ms_per_step;
      std::printf("  %-16s loss %.4f -> %.4f, %.3f ms/step, %.0f tokens/s, %.1f TFLOP/s of the "
                  "model, %llu capture(s)",
                  ex::mode_name(m), r.first_loss, r.last_loss, r.ms_per_step, tokens_per_s,
                  tokens_per_s * flops_per_token / 1e12,
                  static_cast<unsigned long long>(r.captures));
      if (r.peak_mib >= 0) std::printf(", peak %.0f MiB", r.peak_mib);
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt2: %s\n", e.what());
    return 1;
  }
}
