// Trains a classifier MLP (hidden layers of linear + GELU fused into one cuBLASLt kernel each,
// cross-entropy, AdamW) on synthetic data in three modes and prints, for each, the loss at the
// start and at the end and the time per training step: eager; the backward replayed as a CUDA
// graph (BackwardGraph); the whole step — forward, backward, optimizer — replayed as one CUDA
// graph (StepGraph). On the GPU when one is usable, else on the CPU backend (where the graph modes
// run eagerly); it says which.
//
//   train_mlp [--cpu] [--steps N] [--mode eager|backward|step|all] [--hidden H] [--layers L]
//             [--batch B]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/mlp.h"

namespace gw = graphward;
namespace ex = graphward::examples;

int main(int argc, char** argv) {
  try {
    bool force_cpu = false;
    int steps = 300;
    std::string mode = "all";
    ex::MlpConfig c;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> const char* {
        if (i + 1 >= argc) throw gw::Error("train_mlp: missing value after " + a);
        return argv[++i];
      };
      if (a == "--cpu") {
        force_cpu = true;
      } else if (a == "--steps") {
        steps = std::atoi(next());
      } else if (a == "--mode") {
        mode = next();
      } else if (a == "--hidden") {
        c.hidden = std::atoll(next());
      } else if (a == "--layers") {
        c.layers = std::atoi(next());
      } else if (a == "--batch") {
        c.batch = std::atoll(next());
      } else {
        throw gw::Error("train_mlp: unknown argument " + a +
                        "; expected --cpu, --steps N, --mode eager|backward|step|all, --hidden H, "
                        "--layers L, --batch B");
      }
    }
    if (steps < 2 || c.hidden < 1 || c.layers < 1 || c.batch < 1) {
      throw gw::Error("train_mlp: expected --steps >= 2 and positive --hidden, --layers, --batch");
    }
    std::vector<ex::Mode> modes;
    if (mode == "eager" || mode == "all") modes.push_back(ex::Mode::kEager);
    if (mode == "backward" || mode == "all") modes.push_back(ex::Mode::kBackwardGraph);
    if (mode == "step" || mode == "all") modes.push_back(ex::Mode::kStepGraph);
    if (modes.empty()) throw gw::Error("train_mlp: --mode is " + mode + "; expected eager, backward, step or all");
    const bool gpu = !force_cpu && gw::cuda_available();
    const gw::Device dev = gpu ? gw::Device::cuda(0) : gw::Device::cpu();
    std::printf("train_mlp on %s (%s); %d hidden layers of %lld, batch %lld, %lld classes, %d steps\n",
                dev.str().c_str(),
                gpu ? "CUDA" : (force_cpu ? "CPU backend, --cpu" : ("CPU backend: no usable CUDA device: " + gw::cuda_unavailable_reason()).c_str()),
                c.layers, static_cast<long long>(c.hidden), static_cast<long long>(c.batch),
                static_cast<long long>(c.classes), steps);
    for (ex::Mode m : modes) {
      const ex::TrainResult r = ex::train_mlp(c, dev, m, steps);
      std::printf("  %-16s loss %.4f -> %.4f (%.1f%% of the start), %.3f ms/step, %llu capture(s)\n",
                  ex::mode_name(m), r.first_loss, r.last_loss, 100.0 * r.last_loss / r.first_loss,
                  r.ms_per_step, static_cast<unsigned long long>(r.captures));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
