#pragma once
// Data parallelism: one process per GPU, the leaf gradients averaged across the processes inside
// the backward (Note [Gradient reduction], engine/backward/backward.h), with NCCL.
//
//   gw::dist::ProcessGroup pg({.rank = r, .world_size = n, .device = gw::Device::cuda(r),
//                              .id_file = "/tmp/run-42.ncclid"});
//   pg.broadcast(params);                        // every rank starts from rank 0's parameters
//   gw::BackwardGraph bw(dev, {.backward = {.reduce_gradients = &pg}});
//   for (...) { bw.backward(model.loss(my_shard_of_the_batch)); opt.step(); }
//   pg.check_identical(params, "parameters");    // every rank holds the same parameters
//
// Rendezvous (how the processes find each other), as NCCL does it: rank 0 makes NCCL's unique id
// and the others read it — from a file every process can reach (`id_file`, or the environment
// variable GRAPHWARD_NCCL_ID_FILE; a path not used by an earlier run: rank 0 writes it, the
// others wait for it up to `timeout_s`), or from the environment variable GRAPHWARD_NCCL_ID (the
// id in hex, made by new_unique_id_hex() and handed to every process by a launcher). The same code
// runs on one machine or several. rank and world_size default to GRAPHWARD_RANK and
// GRAPHWARD_WORLD_SIZE; the device to cuda(GRAPHWARD_LOCAL_RANK, else rank).
//
// A group of one needs no rendezvous and works on the CPU backend too (averaging over one process
// changes nothing). Without NCCL (graphward built without it), only a group of one can be made.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "graphward/dist/watchdog.h"
#include "graphward/engine/backward/backward.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/runtime/tensor.h"

namespace graphward::dist {

struct ProcessGroupOptions {
  int rank = -1;        // -1: GRAPHWARD_RANK (0 when unset)
  int world_size = -1;  // -1: GRAPHWARD_WORLD_SIZE (1 when unset)
  // Unset: cuda(GRAPHWARD_LOCAL_RANK, else rank). Device::cpu(): a group of one on the CPU.
  std::optional<Device> device = {};
  std::string id_file = {};  // "": GRAPHWARD_NCCL_ID_FILE, else GRAPHWARD_NCCL_ID
  double timeout_s = 120;  // how long a rank waits for rank 0's id file
  // How long a rank waits for the others where it synchronizes with them (the agreement, gathers,
  // the end): past it the group is aborted and an error says so, instead of a hang when a rank
  // stopped or runs something else.
  double collective_timeout_s = 300;
  // Note [Gradient buckets]: the most bytes a bucket collects before it is reduced, and the
  // first bucket's (as PyTorch's DistributedDataParallel: 25 MiB, and 1 MiB first; 0: the same
  // as the others).
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // Note [Gradients in buckets]: the gradients live in their bucket's flat buffer from the first
  // eager backward on (their .grad tensors replaced once), so that a bucket is reduced where the
  // backward wrote it, with no copies (PyTorch's gradient_as_bucket_view). false: they stay
  // where the backward made them, the small ones staged (Note [Flat buckets]), the others reduced
  // in place — for a caller that keeps .grad handles across the first backward.
  bool gradients_in_buckets = true;
  // The most CTAs NCCL's kernels on this group's communicator may take (ncclConfig_t::maxCTAs:
  // the SMs the reductions hold while the backward computes); 0: NCCL's choice. The best cap
  // depends on the model: one whose GEMMs fill the GPU in one wave keeps them whole with a small
  // one.
  int nccl_max_ctas = 0;
  // Not options, each measured against its alternative (docs/DECISIONS.md, "data parallelism:
  // what the defaults are and why"): the reductions' stream is at the device's highest priority
  // (they gate the step); a backward that overwrites the gradients sums its buckets (Note [Summed
  // reductions]); placed buckets are symmetric NCCL windows where NCCL can (Note [Symmetric
  // buckets]); only gradients under 1 MiB are staged (Note [Flat buckets]).
};

// Note [Gradients in buckets]
// With gradients_in_buckets (the default), at the first eager backward that reduces a bucket the
// group moves the bucket's gradients into one flat buffer of its own (zeroed padding between
// them, each part 256-byte aligned): each leaf's .grad becomes a tensor over its part of the
// buffer (Storage::borrow), holding the same values. The backwards after it write the gradients
// there in place (a defined .grad is written in place), and the bucket is averaged by one
// all-reduce over the whole buffer: no copies in or out, and one NCCL call a bucket. As with
// PyTorch's gradient_as_bucket_view: a .grad handle taken before that first backward no longer
// is the leaf's gradient afterwards (read leaf.grad() again); a graph captured before it sees a
// new .grad and is captured again. Gradients the group did not place (a bucket first reduced in a
// capture, a bucket mixing dtypes, a .grad replaced by its owner since) take the staged or
// in-place path. The buffers live as long as a .grad over them, or the group, does.

// Note [Summed reductions]
// NCCL's average (ncclAvg: each rank's part multiplied by 1/world size, then summed) is slower
// than its sum (docs/DECISIONS.md, "data parallelism: what the defaults are and why") — and
// its symmetric kernels (Note [Symmetric buckets]) sum only. So in a backward that overwrites the
// gradients the executor asks the group (GradientReducer::begin_backward) and multiplies the
// seeds by 1/world size: every gradient of the backward comes out divided by it (a backward is
// linear in its seed), and the group sums the buckets — the average, up to rounding (exact for a
// power-of-two world size: the factor is a power of two). A backward that accumulates keeps the
// average: its .grads hold earlier backwards' averages, the same on every rank, which a sum would
// multiply by the world size. The public all_reduce_average() always averages.

// Note [Symmetric buckets]
// A placed bucket's buffer (Note [Gradients in buckets]) is allocated with ncclMemAlloc and
// registered with the communicator as a symmetric window (ncclCommWindowRegister, a collective:
// every rank places the same buckets in the same order), so that NCCL 2.27+ reduces it with its
// symmetric kernels, faster and on fewer CTAs than its ring kernels at the buckets' sizes
// (docs/DECISIONS.md, "data parallelism: what the defaults are and why"). NCCL uses them for
// sums only (an average falls back to its ring kernels at their speed). Where the allocation or
// the registration fails (no CUDA VMM, no peer access, NCCL before 2.27) the bucket takes plain
// device memory — on every rank alike, NCCL's registration being collective; a registration that
// failed on some ranks only would not be detected. The windows are deregistered before the
// communicator is destroyed; the memory is freed with the last tensor over it.

// Note [NCCL graph mixing]
// NCCL supports, by default, collectives of captured graphs and uncaptured ones outstanding at
// once on a communicator, at a cost in every replay (docs/DECISIONS.md, "data parallelism: what
// the defaults are and why"); NCCL_GRAPH_MIXING_SUPPORT=0 in the process's environment turns it
// off. graphward never changes the process's environment: the launcher sets the variable
// (scripts/run_dp.sh sets it to 0 unless it is set), and the group reads it, says what it found
// (nccl_graph_mixing()) and keeps NCCL's conditions when it is off. Without it, NCCL is correct
// only when (1) no two graphs holding the communicator's collectives run at once on unordered
// streams, and (2) no uncaptured collective follows a graph launch that may still be running —
// whatever the stream order. graphward keeps both: its graphs (BackwardGraph, StepGraph) launch on
// the caller's stream, one after the other (launching two of them on unordered streams is the
// caller's to avoid), and once a collective of this group was captured, the group waits for the
// whole device (bounded, as its other waits) before each uncaptured one — a broadcast, a check, an
// eager backward's buckets. NCCL reads the variable once, when the process makes its first
// communicator: a group made after another NCCL communicator in the same process gets what that one
// got (the group reads the variable and waits for the device whenever it is not "0").

class ProcessGroup final : public GradientReducer {
 public:
  explicit ProcessGroup(ProcessGroupOptions options = {});
  ~ProcessGroup() override;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Device device() const { return device_; }

  // Every rank's `tensors` become rank `root`'s, in place (the same shapes and dtypes on every
  // rank). Ordered after their earlier users and before their later ones, like any op.
  void broadcast(const std::vector<Tensor>& tensors, int root = 0);
  // Every rank's `tensors` become their average over the ranks, in place.
  void all_reduce_average(const std::vector<Tensor>& tensors);
  // Throws a graphward::Error naming the ranks that differ unless every rank holds bitwise the
  // same values in `tensors` (a hash of each rank's bytes, gathered). Reads them on the host.
  void check_identical(const std::vector<Tensor>& tensors, const std::string& what);
  // One value from every rank, in rank order (synchronizes).
  std::vector<std::uint64_t> all_gather(std::uint64_t value);
  // Note [NCCL graph mixing]: how many times an uncaptured collective waited for the device.
  std::uint64_t device_waits() const { return device_waits_; }
  // Note [NCCL graph mixing]: whether NCCL's graph mixing support is on for this group — its
  // environment's NCCL_GRAPH_MIXING_SUPPORT is not "0" (the faster replays want it "0").
  bool nccl_graph_mixing() const { return nccl_graph_mixing_; }

  // GradientReducer (Note [Gradient reduction]).
  std::size_t bucket_bytes() const override { return bucket_bytes_; }
  std::size_t first_bucket_bytes() const override { return first_bucket_bytes_; }
  cudaStream_t stream() const override;
  void agree(std::uint64_t layout, const std::string& description, bool in_capture) override;
  // Note [Flat buckets]: the small gradients of a bucket (under 1 MiB, the same dtype) are copied
  // into one contiguous buffer, averaged by one all-reduce and copied back (two kernels); the
  // others are averaged in place. NCCL pays a fixed cost for every tensor it reduces, which for a
  // bucket of many small gradients (biases, a branch model's layers) costs more than the copies.
  void reduce(const std::vector<Tensor>& grads) override;
  // Note [Gradients in buckets]: moves a bucket's gradients into a flat buffer of their own.
  void place(const std::vector<Tensor*>& grads) override;
  // How many buckets have their gradients in a flat buffer of this group (placed so far), and how
  // many of those buffers are symmetric NCCL windows (Note [Symmetric buckets]).
  std::size_t placed_buckets() const { return flat_.size(); }
  std::size_t symmetric_buckets() const;
  // Note [Summed reductions]: 1/world size when this backward's buckets are summed (the seeds
  // scaled by it), else 1.
  double begin_backward(GradWrite grad_write) override;
  // Whether the last backward's buckets were summed rather than averaged.
  bool summed() const { return sum_; }

  // A fresh NCCL unique id in hex, for a launcher to hand every process as GRAPHWARD_NCCL_ID.
  static std::string new_unique_id_hex();
  // Why the group was aborted — a collective that did not finish within collective_timeout_s, in
  // a wait of the group's or in a replay (Note [Replay watchdog], dist/watchdog.h), or an error
  // NCCL reported — or "" while it works. Any thread.
  std::string aborted() const;

 private:
  // `sum`: with average_not_broadcast, sum instead (Note [Summed reductions]).
  void reduce_on_stream(const std::vector<Tensor>& tensors, bool average_not_broadcast, int root,
                        bool sum = false);
  // Waits for the group's stream, polling NCCL's asynchronous error, at most the collective
  // timeout; past it, or on an NCCL error, aborts the communicator and throws naming `what`.
  void wait_for_stream(const std::string& what);
  void wait_for_device(const std::string& what);  // the same, for the whole device
  // Polls `done` (true: finished) and NCCL's asynchronous error, at most the collective timeout.
  void wait_until(const std::function<bool()>& done, const std::string& what);
  // Note [NCCL graph mixing]: notes a captured collective, or waits for the device before an
  // uncaptured one once one was captured (NCCL's mixing support off).
  void before_collective(cudaStream_t stream, const char* what);
  void check_usable(const char* what) const;  // throws once the group was aborted
  // Marks the group aborted with `why` (the first reason stays) and then aborts the communicator,
  // waiting for NCCL's abort a bounded time. Any thread (Note [Replay watchdog]).
  void abort_group(const std::string& why);
  // Note [Replay watchdog]: this group's, made at its first captured collective.
  std::shared_ptr<ReplayWatchdog> watchdog();
  // Host calls into NCCL, and comm_ and aborted_, under this lock (the watchdog's thread aborts).
  mutable std::recursive_mutex nccl_mutex_;
  std::shared_ptr<ReplayWatchdog> watchdog_;
  int rank_ = 0;
  int world_size_ = 1;
  Device device_ = Device::cpu();
  std::size_t bucket_bytes_;
  std::size_t first_bucket_bytes_;
  double collective_timeout_s_;
  bool nccl_graph_mixing_ = true;  // NCCL_GRAPH_MIXING_SUPPORT is not "0"
  bool captured_ = false;          // a collective of this group was captured
  std::uint64_t device_waits_ = 0;
  std::string aborted_;  // why the communicator was aborted ("" while it works)
  std::unordered_set<std::uint64_t> agreed_;  // bucket layouts every rank has
  void* comm_ = nullptr;                      // ncclComm_t (nullptr: a group of one without NCCL)
  std::unique_ptr<Stream> stream_;            // the reductions' stream (CUDA)
  DeviceBuffer gather_;                       // world_size words for all_gather (CUDA)
  // Note [Flat buckets]: contiguous buffers the gradients of a bucket are copied into and reduced
  // in, the last the largest; none freed while the group lives (captured graphs keep their
  // addresses).
  void add_staging(std::size_t bytes);  // zeroed, on the group's stream
  std::vector<DeviceBuffer> staging_;
  // Note [Gradients in buckets]: per placed bucket, keyed by its buffer's address: the buffer, the
  // parts' addresses in bucket order, its dtype and its bytes (padding included).
  // Note [Symmetric buckets]: `window` is its ncclWindow_t, or nullptr (plain device memory).
  struct FlatBucket {
    std::shared_ptr<void> memory;
    std::vector<const void*> parts;
    DType dtype;
    std::size_t bytes;
    void* window = nullptr;
  };
  bool gradients_in_buckets_ = true;
  bool sum_ = false;  // this backward's buckets are summed (Note [Summed reductions])
  std::vector<void*> windows_;  // ncclWindow_t, in the order they were registered
  std::unordered_map<const void*, FlatBucket> flat_;
  // Note [Symmetric buckets]: `bytes` of ncclMemAlloc memory registered as a symmetric window
  // (*window), or nullptr when NCCL cannot (the caller takes plain memory).
  std::shared_ptr<void> symmetric_memory(std::size_t bytes, void** window);
  // Reduces `grads` with one all-reduce when they are a placed bucket, in order; false otherwise.
  bool reduce_placed(const std::vector<Tensor>& grads);
};

}  // namespace graphward::dist
