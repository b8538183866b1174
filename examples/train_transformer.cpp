// Trains a small transformer (embedding + positions, blocks of multi-head self-attention — one QKV
// linear, the heads split out, scaled_dot_product_attention, causal where asked — and a GELU MLP,
// layer norms, cross-entropy; AdamW) to predict each position's previous token, in three
// modes — eager, the backward replayed as a CUDA graph, the whole step replayed as one CUDA graph
// — and prints the loss going down and the time per step of each. On the GPU when one is usable,
// else on the CPU backend; it says which.
//
//   train_transformer [--cpu] [--steps N] [--mode eager|backward|step|all] [--batch B] [--seq T]
//                     [--dim D] [--heads H] [--ff F] [--vocab V] [--blocks N] [--causal 0|1]
#include "examples/example_main.h"
#include "examples/transformer.h"

namespace ex = graphward::examples;

int main(int argc, char** argv) {
  ex::TransformerConfig c;
  const ex::Flags flags{
      {"--batch", [&](const char* v) { c.batch = ex::positive("--batch", v); }},
      {"--seq", [&](const char* v) { c.seq = ex::positive("--seq", v); }},
      {"--dim", [&](const char* v) { c.dim = ex::positive("--dim", v); }},
      {"--heads", [&](const char* v) { c.heads = ex::positive("--heads", v); }},
      {"--ff", [&](const char* v) { c.ff = ex::positive("--ff", v); }},
      {"--vocab", [&](const char* v) { c.vocab = ex::positive("--vocab", v); }},
      {"--blocks", [&](const char* v) { c.blocks = ex::parse_count("--blocks", v); }},
      {"--causal", [&](const char* v) { c.causal = ex::parse_int("--causal", v, 0, 1) == 1; }}};
  return ex::example_main<ex::TransformerModel>(argc, argv, "train_transformer", c, flags, [&] {
    return "batch " + std::to_string(c.batch) + " x " + std::to_string(c.seq) + " tokens, dim " +
           std::to_string(c.dim) + ", " + std::to_string(c.heads) + " heads, MLP " +
           std::to_string(c.ff) + ", vocabulary " + std::to_string(c.vocab) + ", " +
           std::to_string(c.blocks) + (c.blocks == 1 ? " block" : " blocks") +
           (c.causal ? ", causal" : "");
  });
}
