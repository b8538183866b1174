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
//   * what the step's host code decided from state the user may change: each leaf input's
//     requires_grad (a layer frozen or unfrozen) and which parameters the optimizers found with
//     a .grad, and which (Note [Host state of a captured step], engine/tape/host_state.h);
//   * the launch stream's device.
// Otherwise the step is captured again (counted, with the reason in last_reason()): never a
// stale replay. A capture is made on a stream a step of this graph ran on before (the warm-up's,
// or a capture's): on a new stream (run() under another StreamGuard) one eager step runs there
// first, counted, and the capture comes on the next call. Host-side values are baked in at capture:
// a `step` that branches on host state must not be replayed (run it eagerly, or capture again with
// recapture()). The optimizer's learning rate and step count live on the device (engine/backward/optim.h),
// so a replayed step follows set_lr() and counts its steps.
//
// Note [Step inputs]
// A loop that hands each step a new batch tensor passes it to run(batch, step): `step` is called
// with the tensors to read — the batch itself in the eager steps, the graph's own slots (memory
// the executable owns, made at the capture in the batch's shapes and dtypes) when capturing — and
// every replay first copies this step's batch into the slots (one kernel for all of them on S,
// capture::SlotRefresh, after the batch's producers; the batch's memory is reused only after the
// copy). So new tensors every step replay one graph, with no capture and no update; a batch of
// another shape or dtype captures again (counted, with the reason). The step must read its batch
// through its argument: a step function that reads the batch tensors it captured by reference
// would bake the first batch's address into the graph, and every replay would read it; the
// capture checks that no batch tensor's memory was saved by the step's tape and refuses such a
// step, naming the tensor.
// A step that reads other tensors made outside it (constants, a mask, a frozen weight) reads them
// in place at every replay, as captured: their values may change between steps, not their
// addresses.
//
// Streams: before a launch, S waits for the streams that produced the inputs (rule [read after
// write]) and for the other users of the parameters and their .grads since the last write, and for
// those of every other memory the step used and its graph did not allocate (the optimizer's state
// and learning rate, a constant): the capture logs them (Note [Memory from outside a capture],
// engine/runtime/memory.h), so a step may be captured on another stream than the one its memory was last
// used on. After it, the graph's writes and reads are recorded on S (rules [read after write] and
// [reuse after use]). A backward() inside the step splits its weight gradients onto side streams
// unless told otherwise (BackwardOptions::split_weight_grads; WholeStepScope,
// engine/runtime/capture_mode.h): the replay runs them beside the input gradients, bitwise the same
// .grads. The warm-up steps split too, so that the side streams' cuBLAS handles exist before the
// capture (a capture cannot make them; a capture that finds them missing runs its backward
// unsplit). The CPU backend and `force_eager` run `step` every call, unsplit.
//
// Threads: run() takes a lock, so calls from several threads run one at a time. A graph serves the
// thread that captured it: the step function is not part of the signature, and another thread's
// step (its own model, its own stream) would replay the first thread's graph. So a run() on
// another thread than the capture's is captured again on that thread (after an eager step of
// its own there, which makes its library handles), with the reason.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graphward/capture/graph_topology.h"
#include "graphward/engine/runtime/device.h"
#include "graphward/engine/runtime/graph_pool.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/runtime/tensor.h"

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
  // (None with run(batch, step), Note [Step inputs].)
  explicit StepGraph(Device device, std::vector<Tensor> inputs = {}, StepGraphOptions options = {});
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One training step (see the Note); returns the loss the step returned (after a replay, the
  // captured loss tensor, rewritten by the replay). `step` must return a defined tensor on this
  // StepGraph's device.
  Tensor run(const std::function<Tensor()>& step);
  // One training step on this step's `batch` (Note [Step inputs]): `step` reads the batch through
  // its argument. The tensors must be defined and on this StepGraph's device.
  using BatchStep = std::function<Tensor(const std::vector<Tensor>& batch)>;
  Tensor run(const std::vector<Tensor>& batch, const BatchStep& step);
  // Forgets the graph: the next run() captures again.
  void recapture();

  const StepGraphCounters& counters() const { return counters_; }
  // Why the last capture happened ("" before the first).
  const std::string& last_reason() const { return last_reason_; }
  // Kernel nodes and all nodes of the captured graph (0 before the first capture).
  std::size_t kernel_nodes() const { return kernel_nodes_; }
  std::size_t graph_nodes() const { return graph_nodes_; }
  // The captured graph's shape (capture/graph_topology.h; empty before the first capture): a
  // backward whose weight gradients run on side streams forks and joins.
  const capture::Topology& topology() const { return topology_; }
  // Writes the captured graph as Graphviz DOT to `path` (cudaGraphDebugDotPrint; `verbose`: every
  // node's parameters too) — its nodes and the edges the capture made of the step's streams.
  void write_dot(const std::string& path, bool verbose = false) const;

  struct Executable;

 private:
  // "" if the graph can be replayed on `caller` with `batch` (null: run() without a batch), else
  // why not.
  std::string check_signature(const std::vector<Tensor>* batch) const;
  Tensor run_impl(const std::vector<Tensor>* batch, const BatchStep& step);
  Tensor capture(const std::vector<Tensor>* batch, const BatchStep& step, cudaStream_t caller);
  void launch(const std::vector<Tensor>* batch, cudaStream_t caller);

  Device device_;
  std::vector<Tensor> inputs_;
  StepGraphOptions options_;
  StepGraphCounters counters_;
  std::uint64_t calls_ = 0;
  std::string last_reason_;
  // The stream the last eager step ran on (its library handles exist), and why the graph must be
  // captured when an eager step on a new stream came first.
  cudaStream_t warmed_stream_ = nullptr;
  std::thread::id warmed_thread_, captured_thread_;
  std::string pending_reason_;
  mutable std::mutex mutex_;  // run(), recapture(), write_dot() (see Threads above)
  std::unique_ptr<Executable> exec_;
  std::size_t kernel_nodes_ = 0, graph_nodes_ = 0;
  capture::Topology topology_;
};

}  // namespace graphward
