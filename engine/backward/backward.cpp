#include "graphward/engine/backward/backward.h"

#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/nvtx.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "graphward/base/env.h"
#include "graphward/base/error.h"
#include "graphward/engine/ops/ops.h"

namespace graphward {

namespace {

std::vector<PlanRoot> plan_roots(const std::vector<Tensor>& roots) {
  std::vector<PlanRoot> out;
  out.reserve(roots.size());
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    GW_CHECK(t.defined(), "backward: root ", r, " is an undefined tensor");
    GW_CHECK(t.requires_grad(), "backward: root ", r, " (", t.str(),
             ") does not require grad and has no grad_fn; expected a result of recorded ops on "
             "tensors that require grad");
    if (t.grad_fn()) {
      GW_CHECK(t.grad_fn()->output_shape() == t.shape(), "backward: root ", r, " is ", t.str(),
               " but its grad_fn ", t.grad_fn()->label(), " outputs ",
               shape_str(t.grad_fn()->output_shape()),
               "; expected a grad_fn of the root's own shape (Tensor::set_grad_fn)");
      out.push_back({t.grad_fn(), Tensor()});
    } else {
      out.push_back({nullptr, t});
    }
  }
  return out;
}

Device roots_device(const std::vector<Tensor>& roots) {
  GW_CHECK(!roots.empty(), "backward: expected at least one root, got none");
  for (std::size_t r = 0; r < roots.size(); ++r) {
    GW_CHECK(roots[r].defined(), "backward: root ", r, " of ", roots.size(),
             " is an undefined tensor (default-constructed or moved from); expected a result of "
             "recorded ops, such as a loss");
  }
  const Device d = roots[0].device();
  for (std::size_t r = 1; r < roots.size(); ++r) {
    GW_CHECK(roots[r].device() == d, "backward: root ", r, " is on ", roots[r].device().str(),
             ", root 0 on ", d.str(), "; expected all roots on one device");
  }
  return d;
}

}  // namespace

BackwardPlan plan_for(const std::vector<Tensor>& roots, GradWrite grad_write, PlanOptions options) {
  const Device d = roots_device(roots);
  return plan_backward(plan_roots(roots), d.is_cuda() ? current_stream(d) : nullptr, grad_write,
                       options);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds_in,
              BackwardOptions options) {
  GW_CHECK(options.streams == EagerStreams::kAuto || options.streams == EagerStreams::kForward,
           "backward: options.streams is EagerStreams(", static_cast<int>(options.streams),
           "); expected EagerStreams::kAuto or kForward");
  GW_CHECK(is_valid(options.grad_write), "backward: options.grad_write is GradWrite(",
           static_cast<int>(options.grad_write),
           "); expected GradWrite::kAccumulate or kOverwrite");
  const Device device = roots_device(roots);
  const std::vector<PlanRoot> proots = plan_roots(roots);
  GW_CHECK(seeds_in.empty() || seeds_in.size() == roots.size(), "backward: got ", seeds_in.size(),
           " seed gradients for ", roots.size(),
           " roots; expected one per root, or none for one-element roots");
  std::vector<Tensor> seeds(roots.size());
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    if (seeds_in.empty()) {
      GW_CHECK(t.numel() == 1, "backward: root ", r, " is ", t.str(),
               "; a root with more than one element needs a seed gradient of its shape");
    } else {
      const Tensor& s = seeds_in[r];
      GW_CHECK(s.defined() && s.shape() == t.shape() && s.dtype() == t.dtype() &&
                   s.device() == t.device(),
               "backward: the seed gradient of root ", r, " is ", s.str(), "; expected ", t.str());
    }
  }
  if (options.check_finite_loss) check_finite_roots("backward", roots);
  const cudaStream_t caller = device.is_cuda() ? current_stream(device) : nullptr;
  thread_local EagerExecutor executor;
  // Plan (and check) everything before creating or launching anything. Split by default in a
  // whole step that is or will be captured (BackwardOptions::split_weight_grads).
  PlanOptions plan_options{
      .split_weight_grads = options.split_weight_grads.value_or(capturing() || in_whole_step()),
      .fuse_activation_epilogues = options.fuse_activation_epilogues};
  BackwardPlan plan = plan_backward(proots, caller, options.grad_write, plan_options);
  // A capture cannot make a side stream's cuBLAS handle: where an earlier run outside it did not
  // (a capture with no split warm-up), the capture runs unsplit — the same .grads, bitwise.
  if (device.is_cuda() && capturing() && plan_options.split_weight_grads &&
      !executor.side_streams_ready(plan, device)) {
    plan_options.split_weight_grads = false;
    plan = plan_backward(proots, caller, options.grad_write, plan_options);
  }
  // Note [Streams of an eager backward] (backward_plan.h). Inside graphward's captures (a
  // StepGraph's step) the streams stay.
  if (device.is_cuda() && options.streams == EagerStreams::kAuto && !capturing() &&
      host_bound(plan, device_throughput(device))) {
    run_on_caller_stream(plan);
  }
  for (std::size_t r = 0; r < roots.size(); ++r) {
    seeds[r] = seeds_in.empty() ? ones(roots[r].shape(), {roots[r].dtype(), device}) : seeds_in[r];
  }
  executor.run(plan, seeds, device, options.timings, !options.retain_graph,
               options.localize_faults || localize_faults_from_env(), options.reduce_gradients);
}

bool localize_faults_from_env() {
  static const bool on = detail::env_switch("GRAPHWARD_LOCALIZE_FAULTS", false);
  return on;
}

// Note [Non-finite loss]
// A NaN or an infinity in a loss makes every gradient of the step non-finite, and an optimizer
// step with them ruins the parameters. The check is opt-in (BackwardOptions::check_finite_loss,
// BackwardGraphOptions::check_finite_loss) because it reads the loss on the host: a synchronize
// of its stream every step, which a replayed backward otherwise never needs. It runs before
// anything is planned, allocated or launched, so a refused step leaves the .grads, the tape (a
// later backward of the same loss may still run) and a BackwardGraph's cache as they were.
void check_finite_roots(const char* what, const std::vector<Tensor>& roots) {
  NoGradGuard no_grad;  // the cast of a bfloat16 root is no part of the tape
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const Tensor& t = roots[r];
    if (!t.defined()) continue;
    check_capturable("the finite-loss check (it reads the loss on the host)");
    const Tensor values = t.dtype() == DType::kFloat64 ? t : cast(t, DType::kFloat32);
    std::size_t bad = 0;
    double first = 0;
    const auto scan = [&](const auto& v) {
      for (const auto x : v) {
        if (!std::isfinite(static_cast<double>(x))) {
          if (bad++ == 0) first = static_cast<double>(x);
        }
      }
    };
    if (values.dtype() == DType::kFloat64) {
      scan(values.to_vector<double>());
    } else {
      scan(values.to_vector<float>());
    }
    GW_CHECK(bad == 0, what, ": root ", r, " (", t.str(), ") holds ", bad, " non-finite value",
             bad == 1 ? "" : "s", " (", first,
             "); expected a finite loss. Nothing was written: "
             "the .grads are as they were. Lower the learning rate, check the inputs, or skip "
             "this step");
  }
}

}  // namespace graphward
