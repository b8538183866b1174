// Trains a stacked LSTM (4 layers, 8 time steps) on synthetic sequences with its layers on streams
// of their own as a wavefront (examples/rnn.h) — eagerly, with the backward replayed as a CUDA
// graph, and with the whole step replayed — and, for comparison, with every layer on one stream;
// prints the loss at the start and the end and the time per step. On the GPU when one is usable,
// else on the CPU backend.
//
//   train_rnn [--cpu] [--steps N] [--layers L] [--hidden H] [--time T] [--batch B]
//             [--cell fused|composed|layer] [--gru] [--trace FILE]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "examples/args.h"
#include "examples/rnn.h"

namespace gw = graphward;
namespace ex = graphward::examples;

int main(int argc, char** argv) {
  try {
    bool force_cpu = false;
    std::string trace;
    int steps = 200;
    ex::RnnConfig c;
    const std::string usage =
        "usage: train_rnn [--cpu] [--steps N] [--layers L] [--hidden H] [--time T] [--batch B] "
        "[--cell fused|composed|layer] [--gru] [--trace FILE]  (--flag V and --flag=V alike; "
        "--cell: the fused "
        "cell, the default; the cell composed of ops; or each layer one op over all its steps, "
        "LSTM only; --gru: GRU cells instead of LSTM cells; --trace: a replayed backward of the "
        "wavefront as a Chrome trace, CUDA only)";
    ex::ArgReader args(argc, argv);
    while (args.next()) {
      if (args.wants_help()) {
        std::printf("%s\n", usage.c_str());
        return 0;
      } else if (args.is("--cpu")) {
        args.no_value();
        force_cpu = true;
      } else if (args.is("--steps")) {
        steps = ex::parse_count("--steps", args.value(), 2);
      } else if (args.is("--layers")) {
        c.layers = ex::parse_count("--layers", args.value(), 1);
      } else if (args.is("--hidden")) {
        c.hidden = ex::parse_int("--hidden", args.value(), 1);
      } else if (args.is("--time")) {
        c.steps_in_time = ex::parse_count("--time", args.value(), 1);
      } else if (args.is("--cell")) {
        const std::string v = args.value();
        if (v != "fused" && v != "composed" && v != "layer") {
          throw gw::Error("--cell is \"" + v + "\"; expected fused, composed or layer");
        }
        c.cell = v == "fused"      ? ex::RnnCell::kFused
                 : v == "composed" ? ex::RnnCell::kComposed
                                   : ex::RnnCell::kLayer;
      } else if (args.is("--trace")) {
        trace = args.value();
      } else if (args.is("--gru")) {
        args.no_value();
        c.gru = true;
      } else if (args.is("--batch")) {
        c.batch = ex::parse_int("--batch", args.value(), 1);
      } else {
        throw gw::Error("unknown argument " + args.name() + "; " + usage);
      }
    }
    if (c.gru && c.cell == ex::RnnCell::kLayer) {
      throw gw::Error(
          "train_rnn: --cell layer is for LSTMs; expected --cell fused or composed "
          "with --gru");
    }
    if (steps < 2 || c.layers < 1 || c.hidden < 1 || c.steps_in_time < 1 || c.batch < 1) {
      throw gw::Error(
          "train_rnn: expected --steps >= 2 and positive --layers, --hidden, --time, --batch");
    }
    const bool gpu = !force_cpu && gw::cuda_available();
    const gw::Device dev = gpu ? gw::Device::cuda(0) : gw::Device::cpu();
    if (!trace.empty() && !gpu) {
      throw gw::Error("--trace needs a CUDA device; this run is on the CPU");
    }
    std::printf(
        "train_rnn on %s (%s); %d %s layers of %lld (cells: %s), %d time steps, batch %lld\n",
        dev.str().c_str(), gpu ? "CUDA" : "CPU backend", c.layers, c.gru ? "GRU" : "LSTM",
        static_cast<long long>(c.hidden), ex::rnn_cell_name(c.cell), c.steps_in_time,
        static_cast<long long>(c.batch));
    for (bool wavefront : {true, false}) {
      // One stream anyway on the CPU, and with a layer an op.
      if ((!gpu || c.cell == ex::RnnCell::kLayer) && !wavefront) continue;
      for (ex::Mode m : {ex::Mode::kEager, ex::Mode::kBackwardGraph, ex::Mode::kStepGraph}) {
        c.wavefront = wavefront;
        const ex::TrainResult r = ex::train_rnn(c, dev, m, steps);
        std::printf(
            "  %-9s %-15s loss %.4f -> %.4f (%.1f%% of the start), %.3f ms/step, %llu "
            "capture(s)\n",
            wavefront && gpu && c.cell != ex::RnnCell::kLayer ? "wavefront" : "1 stream",
            ex::mode_name(m), r.first_loss, r.last_loss, 100.0 * r.last_loss / r.first_loss,
            r.ms_per_step, static_cast<unsigned long long>(r.captures));
      }
    }
    if (!trace.empty()) {  // the wavefront's backward, one traced replay (Note [Timeline])
      c.wavefront = true;
      ex::RnnTrainer trainer(c, dev, ex::Mode::kBackwardGraph);
      for (int i = 0; i < 3; ++i) (void)trainer.step(i);
      const std::vector<gw::StepTiming> steps = trainer.trace_backward(trace);
      std::printf("timeline: %s (%zu backward steps; open in ui.perfetto.dev)\n", trace.c_str(),
                  steps.size());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_rnn: %s\n", e.what());
    return 1;
  }
}
