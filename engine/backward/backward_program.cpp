#include "graphward/engine/backward/backward_program.h"

#include <sstream>
#include <utility>

namespace graphward {
namespace {
using Op = BackwardInstr::Op;

struct Lowering {
  const BackwardPlan& plan;
  BackwardProgram& prog;
  const bool events;
  const int reducer;  // the reducer's stream index
  std::vector<int> ready_main, ready_side;  // per step: the event a bucket waits for, or -1
  std::size_t next_bucket = 0;

  void emit(Op op, int step, int stream, int event = -1, int index = -1) {
    prog.instrs.push_back({op, step, stream, event, index});
  }
  void record(int step, int stream, int event) {
    if (events && event >= 0) emit(Op::kRecord, step, stream, event);
  }
  void wait(int step, int stream, int event) {
    if (events && event >= 0) emit(Op::kWait, step, stream, event);
  }

  // Note [Gradient buckets]: an event after each step part a bucket waits for, past the fork's,
  // the joins' and the reducer's join.
  void number_ready_events() {
    prog.num_events = prog.reduce_join_event + 1;
    if (prog.buckets.empty() || !events) return;
    ready_main.assign(plan.steps.size(), -1);
    ready_side.assign(plan.steps.size(), -1);
    for (const GradBucket& b : prog.buckets) {
      for (const GradBucket::Ready& r : b.ready) {
        if (r.step < 0) continue;
        int& e = r.side ? ready_side[r.step] : ready_main[r.step];
        if (e < 0) e = prog.num_events++;
      }
    }
  }

  // Every bucket whose last gradient is written by step `after` (-1: by the seeds): the reducer's
  // stream waits for the latest writer on each stream, then the bucket is reduced.
  void reduce_buckets(int after) {
    for (; next_bucket < prog.buckets.size() && prog.buckets[next_bucket].issue_after == after;
         ++next_bucket) {
      for (const GradBucket::Ready& r : prog.buckets[next_bucket].ready) {
        if (!events) break;  // no streams to order: the host's order is the order
        if (r.step < 0) {  // the seeds: written on the caller's stream
          record(after, 0, prog.reduce_join_event);
          wait(after, reducer, prog.reduce_join_event);
        } else {
          wait(after, reducer, r.side ? ready_side[r.step] : ready_main[r.step]);
        }
      }
      emit(Op::kReduce, after, reducer, -1, static_cast<int>(next_bucket));
    }
  }

  void step(int k) {
    const BackwardPlan::Step& st = plan.steps[static_cast<std::size_t>(k)];
    for (int w : st.waits) wait(k, st.stream, plan.waits[w].event);
    emit(Op::kGather, k, st.stream);
    if (st.side_stream >= 0) {  // weight-gradient parallelism: the leaf gradients beside
      record(k, st.stream, st.side_fork_event);
      wait(k, st.side_stream, st.side_fork_event);
      for (int w : st.side_waits) wait(k, st.side_stream, plan.waits[w].event);
      emit(Op::kRunSide, k, st.side_stream);
      record(k, st.side_stream, st.side_event);
      if (!ready_side.empty()) record(k, st.side_stream, ready_side[k]);
    }
    emit(Op::kRun, k, st.stream);
    emit(Op::kRelease, k, st.stream);
    record(k, st.stream, st.event);
    if (!ready_main.empty()) record(k, st.stream, ready_main[k]);
    reduce_buckets(k);
    emit(Op::kDrop, k, st.stream);
  }

  // Rule [fork and join]: the caller's stream waits on every stream the backward used, the
  // reducer's too.
  void join() {
    prog.join_begin = static_cast<int>(prog.instrs.size());
    for (std::size_t j = 0; j < plan.joins.size(); ++j) {
      record(-1, plan.joins[j], prog.fork_event + 1 + static_cast<int>(j));
      wait(-1, 0, prog.fork_event + 1 + static_cast<int>(j));
    }
    if (!prog.buckets.empty()) {
      record(-1, reducer, prog.reduce_join_event);
      wait(-1, 0, prog.reduce_join_event);
    }
  }
};

const char* op_name(Op op) {
  switch (op) {
    case Op::kSeedLeaf: return "seed leaf";
    case Op::kWaitStream: return "wait stream";
    case Op::kRecord: return "record";
    case Op::kWait: return "wait";
    case Op::kGather: return "gather";
    case Op::kRunSide: return "run side";
    case Op::kRun: return "run";
    case Op::kRelease: return "release";
    case Op::kDrop: return "drop";
    case Op::kReduce: return "reduce";
  }
  return "?";
}
}  // namespace

BackwardProgram lower_plan(const BackwardPlan& plan, std::vector<GradBucket> buckets,
                           bool events) {
  BackwardProgram prog;
  prog.buckets = std::move(buckets);
  prog.fork_event = plan.num_events;
  prog.reduce_join_event = plan.num_events + 1 + static_cast<int>(plan.joins.size());
  Lowering l{plan, prog, events, reduce_stream(plan), {}, {}, 0};
  l.number_ready_events();
  const int steps = static_cast<int>(plan.steps.size());
  prog.instrs.reserve(plan.leaf_seeds.size() + plan.caller_waits.size() + plan.forks.size() +
                      6 * static_cast<std::size_t>(steps) + 2 * plan.waits.size() +
                      2 * plan.joins.size() + 3 * prog.buckets.size() + 4);
  for (std::size_t i = 0; i < plan.leaf_seeds.size(); ++i) {
    l.emit(Op::kSeedLeaf, -1, 0, -1, static_cast<int>(i));
  }
  for (std::size_t i = 0; i < plan.caller_waits.size(); ++i) {
    l.emit(Op::kWaitStream, -1, 0, -1, static_cast<int>(i));
  }
  if (!plan.forks.empty()) {  // rule [fork and join]: every other stream waits on the caller's
    l.record(-1, 0, prog.fork_event);
    for (int f : plan.forks) l.wait(-1, f, prog.fork_event);
  }
  l.reduce_buckets(-1);  // gradients only a seed writes
  for (int k = 0; k < steps; ++k) l.step(k);
  l.join();
  return prog;
}

std::string BackwardProgram::dump(const BackwardPlan& plan) const {
  std::ostringstream os;
  os << "BackwardProgram: " << instrs.size() << " instructions, " << num_events << " events\n";
  for (std::size_t i = 0; i < instrs.size(); ++i) {
    const BackwardInstr& in = instrs[i];
    if (static_cast<int>(i) == join_begin) os << "  -- join\n";
    os << "  " << i << ": " << op_name(in.op);
    if (in.stream >= 0) {
      os << (in.stream == reduce_stream(plan) ? " on the reducer's stream" : " on s")
         << (in.stream == reduce_stream(plan) ? std::string() : std::to_string(in.stream));
    }
    if (in.event >= 0) os << " e" << in.event;
    if (in.step >= 0 && in.op != Op::kRecord && in.op != Op::kWait) {
      os << " step " << in.step << " (" << plan.steps[static_cast<std::size_t>(in.step)].node->label()
         << ")";
    }
    if (in.op == Op::kReduce) os << " bucket " << in.index + 1 << " of " << buckets.size();
    if (in.op == Op::kSeedLeaf) os << " root " << plan.leaf_seeds[in.index].root;
    if (in.op == Op::kWaitStream) {
      os << " " << static_cast<const void*>(plan.caller_waits[in.index]);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace graphward
