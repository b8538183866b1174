#pragma once
// The program of a backward: its plan lowered to a flat list of instructions, what the executor
// runs one after another, eagerly or under capture.
//
// Note [The backward program]
// A BackwardPlan (backward_plan.h) says what a backward does step by step: each step's waits, its
// gradient's parts, its side part, the events it records; the forks and joins of the streams; and,
// with data parallelism, the buckets of leaf gradients reduced while it runs (Note [Gradient
// buckets]). lower_plan turns all of it into one list, in the order the host issues it: every
// event is recorded by an instruction before the one that waits on it, every stream is forked
// before its first step and joined at the end, every event index is fixed here (those of the
// buckets past the plan's). The executor (eager_executor.cpp) is a loop over the list; what a run
// adds — its timing marks, a check after each step that localizes a kernel fault — are observers
// of the instructions, not branches inside them. dump() prints the list: exactly what runs.
//
// Streams are the plan's indices, and one more past them: the reducer's stream (kReduceStream of
// the plan: plan.streams.size()). Events are indices into the executor's pool: the plan's
// (0 … num_events − 1), the fork's, one a join, the reducer's join, then one a bucket's ready
// point (program.num_events in all).
#include <cstdint>
#include <string>
#include <vector>

#include "graphward/engine/backward/backward_plan.h"

namespace graphward {

struct BackwardInstr {
  enum class Op : std::uint8_t {
    kSeedLeaf,    // `index`: a plan.leaf_seeds entry — the root's seed written into the leaf's
                  // .grad, on the caller's stream
    kWaitStream,  // `index`: a plan.caller_waits entry — the caller's stream waits on that stream
                  // (Note [Streams of an eager backward])
    kRecord,      // `event` recorded on `stream`
    kWait,        // `stream` waits on `event`
    kGather,      // step `step`'s gradient assembled on its stream (its seeds and staged buffers
                  // added), its slots filled
    kRunSide,     // step `step`'s leaf gradients, on its side stream `stream`
    kRun,         // step `step`'s node's backward (the rest of it) on its stream
    kRelease,     // step `step`'s saved tensors freed (a run that releases them)
    kDrop,        // step `step`'s gradient let go: the step is over
    kReduce,      // bucket `index` reduced on the reducer's stream (its waits come first)
  };
  Op op;
  int step = -1;    // the step it belongs to; -1: before the first step or after the last
  int stream = -1;  // the stream it runs on
  int event = -1;   // kRecord, kWait
  int index = -1;   // kSeedLeaf, kWaitStream, kReduce
};

struct BackwardProgram {
  std::vector<BackwardInstr> instrs;
  int join_begin = 0;  // instrs[join_begin …] join every stream into the caller's
  int num_events = 0;  // events used: the executor's pool holds at least these
  int fork_event = -1;
  int reduce_join_event = -1;  // the reducer's stream joined, and the seeds' bucket waits
  std::vector<GradBucket> buckets;  // Note [Gradient buckets]; empty without a reducer

  // One line an instruction, with the plan's labels.
  std::string dump(const BackwardPlan& plan) const;
};

// The stream index of the reducer's stream in a program of `plan`.
inline int reduce_stream(const BackwardPlan& plan) {
  return static_cast<int>(plan.streams.size());
}

// Lowers `plan` (Note [The backward program]), with `buckets` reduced as it runs (none: no
// reducer). With `events` false (a CPU plan), no kRecord or kWait is emitted.
BackwardProgram lower_plan(const BackwardPlan& plan, std::vector<GradBucket> buckets = {},
                           bool events = true);

}  // namespace graphward
