#include "graphward/engine/backward/backward_plan.h"

#include <algorithm>

#include "graphward/base/dtype.h"
#include "graphward/base/error.h"

namespace graphward {

// Note [Streams of an eager backward] (engine/backward/backward_plan.h): the estimate and the move.

double estimate_device_us(const BackwardPlan& plan, DeviceThroughput throughput) {
  if (throughput.flops_per_us <= 0 || throughput.bytes_per_us <= 0) return -1;
  double us = 0;
  for (const BackwardPlan::Step& step : plan.steps) {
    const Node& n = *step.node;
    // Elements the step reads or writes at least once: its output's gradient, its inputs'
    // gradients, its saved tensors.
    double bytes = 0;
    const std::size_t out_size = n.inputs().empty() ? 4 : dtype_size(n.inputs()[0].dtype);
    bytes += static_cast<double>(shape_numel(n.output_shape())) * static_cast<double>(out_size);
    for (const InputMeta& in : n.inputs()) {
      bytes +=
          static_cast<double>(shape_numel(in.shape)) * static_cast<double>(dtype_size(in.dtype));
    }
    bytes += static_cast<double>(n.saved_bytes());
    us += n.backward_flops() / throughput.flops_per_us + bytes / throughput.bytes_per_us;
  }
  return us;
}

bool host_bound(const BackwardPlan& plan, DeviceThroughput throughput) {
  if (plan.streams.size() < 2) return false;
  for (int side : plan.side_of) {
    if (side >= 0) return false;
  }
  const double us = estimate_device_us(plan, throughput);
  return us >= 0 && us < kHostFloorUs * static_cast<double>(plan.steps.size());
}

void run_on_caller_stream(BackwardPlan& plan) {
  for (int side : plan.side_of) {
    GW_CHECK(side < 0, "run_on_caller_stream: the plan has side streams (an internal error)");
  }
  for (std::size_t i = 1; i < plan.streams.size(); ++i)
    plan.moved_streams.push_back(plan.streams[i]);
  for (int r : plan.root_steps) {
    if (r < 0 || plan.steps[r].stream == 0) continue;
    const cudaStream_t s = plan.streams[plan.steps[r].stream];
    if (std::find(plan.caller_waits.begin(), plan.caller_waits.end(), s) ==
        plan.caller_waits.end()) {
      plan.caller_waits.push_back(s);
    }
  }
  for (BackwardPlan::Step& step : plan.steps) {
    step.stream = 0;
    step.waits.clear();
    step.event = -1;
  }
  for (BackwardPlan::Buffer& b : plan.buffers) b.stream = 0;
  plan.streams.resize(1);
  if (!plan.side_of.empty()) plan.side_of.assign(1, -1);
  plan.waits.clear();
  plan.forks.clear();
  plan.joins.clear();
  plan.num_events = 0;
}

}  // namespace graphward
