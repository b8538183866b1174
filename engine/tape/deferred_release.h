#pragma once
// Note [Deferred release]
// After a replayed backward is launched, the step's saved tensors are released, as a backward
// without retain_graph releases them. Most of those handles are the last ones of the step's
// activations, so releasing them destroys tensors and storages and hands their memory back to the
// step arena or the block cache: a cost a tape node that was most of a replayed backward's host
// time (docs/DECISIONS.md, "a replayed backward's saved tensors dropped on a worker thread").
// A ReleaseWorker does the destroying on a thread
// of its own while the caller's thread goes on (the optimizer, the next step's forward).
//
// What stays on the caller's thread is everything another thread could see: each node is marked
// released and its storages' saved counts dropped (Node::release_saved with a hand-off), and the
// reads are recorded for rule [reuse after use] (Storage::record_read) before the hand-off — or,
// for a step a replay released as a whole, one record of the step's read that every node and
// storage of the step consults (Note [Reads of a replayed step], engine/runtime/memory.h). The worker
// receives the saved tensors, moved out of their nodes (for a step released as a whole: the nodes,
// whose saved tensors it drops itself), and a handle that keeps the tape alive until then. A handle
// dropped there is either not the last one (someone else still holds the tensor: nothing is
// destroyed) or the last one (no other thread can reach what it destroys); what a destructor
// reaches that is shared — the step arena, the block cache, the event pool, the list of frees
// deferred during a capture, reference counts — is behind a mutex or atomic.
//
// The caller's thread waits for the worker only where it must:
//   * before a StepScope begins (wait_for_releases): the next step's allocations must find the
//     arena's slots free, or they would be served fresh, at other addresses (Note [Step arena]);
//   * before graphward begins a stream capture (capture::capture_stream): a free or an event the
//     worker enqueues must not land on a stream while it is being captured;
//   * before handing the worker the next step's tensors (one release in flight at a time);
//   * when the worker is destroyed.
// The hand-off itself is one atomic store while the worker is awake (Note [Waking the release
// worker], engine/tape/deferred_release.cpp). One thread hands a worker its releases at a time (a
// BackwardGraph's caller).
//
// Outside those, the worker's frees and events may interleave with the caller's next launches on
// the same streams: each orders a block's reuse after the uses that were enqueued before the hand-
// off (all of them), and at worst after some later ones too. A capture a program begins itself
// (cudaStreamBeginCapture) must call wait_for_releases() first.
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "graphward/engine/tape/autograd.h"

namespace graphward::detail {

class ReleaseWorker {
 public:
  ReleaseWorker();
  ~ReleaseWorker();  // finishes the release in flight, stops the thread
  ReleaseWorker(const ReleaseWorker&) = delete;
  ReleaseWorker& operator=(const ReleaseWorker&) = delete;

  // Drops `saved` and `keep` on the worker's thread (started at the first call), after the release
  // in flight, if any, finished. On return `saved` is an empty vector (the buffer of an earlier
  // release, its capacity kept for the next). `before` (tests) runs on the worker first. Where no
  // thread can be started, everything is dropped here.
  void release(std::vector<SavedTensor>& saved, Tensor keep, std::function<void()> before = {});
  // The same for a step a replay released as a whole (Note [Reads of a replayed step],
  // engine/runtime/memory.h): the worker drops the saved tensors of `nodes` (each node's
  // drop_saved_of_replayed_step; `keep` keeps them alive until then), then `tensors` and `keep`.
  // On return both vectors are empty (with an earlier release's capacity).
  void release_step(std::vector<Node*>& nodes, std::vector<Tensor>& tensors, Tensor keep);

  struct State;

 private:
  void hand(std::vector<SavedTensor>& saved, std::vector<Node*>& nodes,
            std::vector<Tensor>& tensors, Tensor keep, std::function<void()> before);
  std::shared_ptr<State> state_;
};

// Waits for every release the calling thread handed to a ReleaseWorker (StepScope calls it).
void wait_for_releases();

}  // namespace graphward::detail
