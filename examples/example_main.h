#pragma once
// The command line shared by the example programs (train_mlp, train_convnet, train_transformer):
//   <name> [--cpu] [--steps N] [--mode eager|backward|step|all] [--precision fp32|tf32|bf16]
//          [model flags...] | --help
// --precision tf32: float32 GEMMs and convolutions on TF32 tensor cores (Note [TF32],
// engine/runtime/math_mode.h); bf16: the forward under Autocast (Note [Autocast], engine/ops/autocast.h) —
// matrix products in bfloat16, float32 master weights — with TF32 on for what stays float32, as
// PyTorch's autocast recipe sets it; fp32 (the default): true float32.
// (examples/args.h: --flag V and --flag=V alike; numbers parsed whole).
// Trains the model in each asked mode and prints, for each, the loss at the start and at the end
// (and its ratio) and the time per step. On the GPU when one is usable, else on the CPU backend
// (where the graph modes run eagerly); it says which.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "examples/args.h"
#include "examples/trainer.h"

namespace graphward::examples {

// Model flags: "--hidden" -> a setter parsing its value.
using Flags = std::map<std::string, std::function<void(const char*)>>;

template <class Model>
int example_main(int argc, char** argv, const char* name, typename Model::Config& config,
                 const Flags& flags, const std::function<std::string()>& describe,
                 int steps = 300) {
  try {
    bool force_cpu = false;
    std::string mode = "all";
    std::string precision = "fp32";
    std::string usage = std::string("usage: ") + name +
                        " [--cpu] [--steps N] [--mode eager|backward|step|all] [--precision "
                        "fp32|tf32|bf16]";
    for (const auto& [flag, _] : flags) usage += " [" + flag + " N]";
    ArgReader args(argc, argv);
    while (args.next()) {
      if (args.wants_help()) {
        std::printf("%s\n(--flag V and --flag=V alike; on the GPU when one is usable, else on the "
                    "CPU backend)\n",
                    usage.c_str());
        return 0;
      } else if (args.is("--cpu")) {
        args.no_value();
        force_cpu = true;
      } else if (args.is("--steps")) {
        steps = parse_count("--steps", args.value(), 2);
      } else if (args.is("--mode")) {
        mode = args.value();
      } else if (args.is("--precision")) {
        precision = args.value();
      } else if (auto f = flags.find(args.name()); f != flags.end()) {
        const std::string v = args.value();
        f->second(v.c_str());
      } else {
        std::string known;
        for (const auto& [flag, _] : flags) known += ", " + flag + " N";
        throw Error("unknown argument " + args.name() +
                    "; expected --cpu, --steps N, --mode eager|backward|step|all, --precision "
                    "fp32|tf32|bf16" +
                    known +
                    " (--help lists them)");
      }
    }
    if (steps < 2) throw Error("expected --steps >= 2");
    std::vector<Mode> modes;
    if (mode == "eager" || mode == "all") modes.push_back(Mode::kEager);
    if (mode == "backward" || mode == "all") modes.push_back(Mode::kBackwardGraph);
    if (mode == "step" || mode == "all") modes.push_back(Mode::kStepGraph);
    if (modes.empty()) {
      throw Error("--mode is " + mode +
                  "; expected eager, backward, step or all");
    }
    if (precision != "fp32" && precision != "tf32" && precision != "bf16") {
      throw Error("--precision is " + precision + "; expected fp32, tf32 or bf16");
    }
    // Process-wide switches: this program's own, set once before any step.
    const bool tf32 = precision != "fp32", bf16 = precision == "bf16";
    set_matmul_tf32(tf32);
    set_conv_tf32(tf32);
    const bool gpu = !force_cpu && cuda_available();
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    const std::string where =
        gpu ? "CUDA"
            : (force_cpu ? "CPU backend, --cpu"
                         : "CPU backend: no usable CUDA device: " + cuda_unavailable_reason());
    const std::string said =
        std::string(bf16 ? "bf16 autocast, " : "") +
        (tf32 ? (gpu ? "TF32 on" : "TF32 asked, none on the CPU") : "fp32");
    std::printf("%s on %s (%s); %s, %s, %d steps\n", name, dev.str().c_str(), where.c_str(),
                describe().c_str(), said.c_str(), steps);
    for (Mode m : modes) {
      const TrainResult r = train<Model>(config, dev, m, steps, bf16);
      std::printf("  %-16s loss %.4f -> %.4f (%.1f%% of the start), %.3f ms/step, %llu capture(s), "
                  "%llu update(s)\n",
                  mode_name(m), r.first_loss, r.last_loss, 100.0 * r.last_loss / r.first_loss,
                  r.ms_per_step, static_cast<unsigned long long>(r.captures),
                  static_cast<unsigned long long>(r.updates));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

// A flag's value as a positive integer, or an Error naming the flag.
inline std::int64_t positive(const char* flag, const char* value) {
  return parse_int(flag, value, 1);
}

}  // namespace graphward::examples
