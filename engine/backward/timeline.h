#pragma once
// The built-in timeline (Note [Timeline]): a timed backward as a Chrome-trace JSON file, one track
// per stream, loadable in Perfetto (ui.perfetto.dev) or chrome://tracing — overlap without a
// profiler.
//
// Note [Timeline]
// A timed backward — backward(loss, {.timings = &t}) eagerly, or BackwardGraph::trace() for a
// replay of the captured graph — gives one StepTiming per plan step: its start and end on its
// stream by CUDA timing events (milliseconds since the backward began on the caller's stream),
// and its side part (the weight gradients under weight-gradient parallelism) on the side stream.
// chrome_trace() turns them into complete ("X") events, one thread track per stream of the plan,
// named by stream_names(plan): "stream 0 (caller)", "stream 2 (forward)", "stream 5 (side of
// stream 2)". Timing events cost two records a step: for inspection, not for training.
#include <string>
#include <vector>

#include "graphward/engine/backward/backward.h"

namespace graphward {

// The name of each stream of `plan`, by plan index; with `reductions`, one more: the track of a
// data-parallel backward's gradient reductions (Note [Gradient reduction]).
std::vector<std::string> stream_names(const BackwardPlan& plan, bool reductions = false);

// The trace as Chrome-trace JSON: {"traceEvents": [...], "displayTimeUnit": "ms"}; `title` names
// the process track. Each step's args carry its index and host time.
std::string chrome_trace(const std::vector<StepTiming>& steps,
                         const std::vector<std::string>& stream_names, const std::string& title);

// Writes chrome_trace() to `path`; throws graphward::Error when the file cannot be written.
void write_chrome_trace(const std::string& path, const std::vector<StepTiming>& steps,
                        const std::vector<std::string>& stream_names, const std::string& title);

}  // namespace graphward
