#pragma once
// StepGraph: a whole training step — forward, backward, optimizer — captured once into one CUDA
// graph and replayed (Note [Full-step capture]).
//
//   gw::Tensor x = gw::zeros({B, D}, f32), t = gw::zeros({B, C}, f32);  // static input slots
//   gw::AdamW opt(params);
//   gw::StepGraph step(dev, {x, t});
//   for (...) {
//     { gw::NoGradGuard g; gw::copy_(x, batch_x); gw::copy_(t, batch_t); }  // refill the slots
//     gw::Tensor loss = step.run([&] {
//       gw::Tensor l = gw::mse_loss(model(x), t);
//       gw::backward(l, {.grad_write = gw::GradWrite::kOverwrite});
//       opt.step();
//       return l;
//     });
//   }
//
// Note [Full-step capture]
// run(step): the first `warmup` calls run `step` eagerly (library handles, GEMM plans, workspaces
// and the .grads are made there, outside any capture). The next call captures `step` on the
// current stream S (thread-local capture; everything the step allocates comes from a pool the
// graph owns, Note [Graph memory pool]; capture-unsafe ops are refused by name, Note
// [Capture-unsafe ops]), instantiates it and launches it; later calls launch the graph without
// calling `step`. The loss tensor `step` returned is kept: every replay rewrites it, and run()
// returns it.
//
// A replay is taken only when the graph's signature still holds — the same as at the capture:
//   * the static inputs: same storage (address), shape, dtype and device;
//   * every leaf the step's backward reaches (the parameters) and its .grad: same addresses, and
//     the .grad defined (the graph writes it in place);
//   * the launch stream's device.
// Otherwise the step is captured again (counted, with the reason in last_reason()): never a
// stale replay. Host-side values are baked in at capture: a `step` that branches on host state
// must not be replayed (run it eagerly, or capture again with recapture()). The optimizer's
// learning rate and step count live on the device (engine/optim.h), so a replayed step follows
// set_lr() and counts its steps.
//
// Streams: before a launch, S waits for the streams that produced the inputs (rule 6) and for
// the other users of the parameters and their .grads since the last write; after it, the graph's
// writes and reads are recorded on S (rules 6 and 7). The CPU backend and `force_eager` run
// `step` every call.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/graph_pool.h"
#include "engine/stream.h"
#include "engine/tensor.h"

namespace graphward {

struct StepGraphOptions {
  int warmup = 1;            // eager steps before the capture
  bool force_eager = false;  // never capture
};

struct StepGraphCounters {
  std::uint64_t eager = 0;     // steps run eagerly (warm-up, CPU, force_eager)
  std::uint64_t captures = 0;  // captures (the first, and every re-capture)
  std::uint64_t replays = 0;   // launches, the capturing step's included
};

class StepGraph {
 public:
  // `inputs`: the static tensors the step reads and the caller refills between steps (copy_).
  StepGraph(Device device, std::vector<Tensor> inputs, StepGraphOptions options = {});
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One training step (see the Note); returns the loss the step returned (after a replay, the
  // captured loss tensor, rewritten by the replay). `step` must return a defined tensor on this
  // StepGraph's device.
  Tensor run(const std::function<Tensor()>& step);
  // Forgets the graph: the next run() captures again.
  void recapture();

  const StepGraphCounters& counters() const { return counters_; }
  // Why the last capture happened ("" before the first).
  const std::string& last_reason() const { return last_reason_; }
  // Kernel nodes and all nodes of the captured graph (0 before the first capture).
  std::size_t kernel_nodes() const { return kernel_nodes_; }
  std::size_t graph_nodes() const { return graph_nodes_; }
  // Writes the captured graph as Graphviz DOT to `path` (cudaGraphDebugDotPrint; `verbose`: every
  // node's parameters too) — its nodes and the edges the capture made of the step's streams.
  void write_dot(const std::string& path, bool verbose = false) const;

  struct Executable;

 private:
  // "" if the graph can be replayed on `caller`, else why not.
  std::string check_signature() const;
  Tensor capture(const std::function<Tensor()>& step, cudaStream_t caller);
  void launch(cudaStream_t caller);

  Device device_;
  std::vector<Tensor> inputs_;
  StepGraphOptions options_;
  StepGraphCounters counters_;
  std::uint64_t calls_ = 0;
  std::string last_reason_;
  std::unique_ptr<Executable> exec_;
  std::size_t kernel_nodes_ = 0, graph_nodes_ = 0;
};

}  // namespace graphward
