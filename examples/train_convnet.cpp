// Trains a small convnet (conv + ReLU, max pool, conv + ReLU, average pool, linear, cross-entropy;
// cuDNN convolutions and pools on CUDA; AdamW) on synthetic images in three modes — eager, the
// backward replayed as a CUDA graph, the whole step replayed as one CUDA graph — and prints the
// loss going down and the time per step of each. On the GPU when one is usable, else on the CPU
// backend; it says which.
//
//   train_convnet [--cpu] [--steps N] [--mode eager|backward|step|all] [--precision P]
//                 [--batch B] [--image S] [--channels C1] [--channels-last 0|1]
// --channels-last 1: images, activations and convolution weights NHWC (the default with
// --precision bf16, where cuDNN's bfloat16 kernels want it); 0: NCHW (the default otherwise).
#include <cstring>
#include <string>

#include "examples/convnet.h"
#include "examples/example_main.h"

namespace ex = graphward::examples;

int main(int argc, char** argv) {
  ex::ConvnetConfig c;
  for (int i = 1; i < argc; ++i) {  // the layout's default follows the precision
    const std::string a = argv[i];
    if (a == "--precision=bf16" || (a == "--precision" && i + 1 < argc &&
                                    std::strcmp(argv[i + 1], "bf16") == 0)) {
      c.channels_last = true;
    }
  }
  const ex::Flags flags{
      {"--channels-last",
       [&](const char* v) { c.channels_last = ex::parse_int("--channels-last", v, 0, 1) == 1; }},
      {"--batch", [&](const char* v) { c.batch = ex::positive("--batch", v); }},
      {"--image", [&](const char* v) { c.image = ex::positive("--image", v); }},
      {"--channels", [&](const char* v) {
         c.c1 = ex::positive("--channels", v);
         c.c2 = 2 * c.c1;
       }}};
  return ex::example_main<ex::ConvnetModel>(argc, argv, "train_convnet", c, flags, [&] {
    return "images " + std::to_string(c.channels) + "x" + std::to_string(c.image) + "x" +
           std::to_string(c.image) + ", convs " + std::to_string(c.c1) + " and " +
           std::to_string(c.c2) + " channels" + (c.channels_last ? " (channels last)" : "") +
           ", batch " + std::to_string(c.batch) + ", " +
           std::to_string(c.classes) + " classes";
  });
}
