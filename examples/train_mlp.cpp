// Trains a classifier MLP (hidden layers of linear + GELU fused into one cuBLASLt kernel each,
// cross-entropy, AdamW) on synthetic data in three modes and prints, for each, the loss at the
// start and at the end and the time per training step: eager; the backward replayed as a CUDA
// graph (BackwardGraph); the whole step — forward, backward, optimizer — replayed as one CUDA
// graph (StepGraph). On the GPU when one is usable, else on the CPU backend (where the graph modes
// run eagerly); it says which.
//
//   train_mlp [--cpu] [--steps N] [--mode eager|backward|step|all] [--hidden H] [--layers L]
//             [--batch B] [--bf16 1]   (bfloat16 layers, float32 parameters: CUDA only)
#include "examples/example_main.h"
#include "examples/mlp.h"

namespace ex = graphward::examples;

int main(int argc, char** argv) {
  ex::MlpConfig c;
  const ex::Flags flags{
      {"--hidden", [&](const char* v) { c.hidden = ex::positive("--hidden", v); }},
      {"--layers", [&](const char* v) { c.layers = ex::parse_count("--layers", v); }},
      {"--batch", [&](const char* v) { c.batch = ex::positive("--batch", v); }},
      {"--bf16", [&](const char* v) { c.bf16 = ex::parse_int("--bf16", v, 0) != 0; }}};
  return ex::example_main<ex::MlpModel>(argc, argv, "train_mlp", c, flags, [&] {
    return std::to_string(c.layers) + " hidden layers of " + std::to_string(c.hidden) +
           ", batch " + std::to_string(c.batch) + ", " + std::to_string(c.classes) + " classes" +
           (c.bf16 ? ", bfloat16 layers" : "");
  });
}
