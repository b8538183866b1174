#include "graphward/engine/backward/optim.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>

#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/engine/tape/host_state.h"
#include "graphward/kernels/elementwise.h"

namespace graphward {
using namespace ops_detail;
namespace k = kernels;

namespace {

void check_params(const char* what, const std::vector<Tensor>& params) {
  GW_CHECK(!params.empty(), what, ": expected at least one parameter, got none");
  const Tensor& first = params.front();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    GW_CHECK(p.defined() && p.numel() > 0, what, ": parameter ", i,
             " is undefined or empty; expected a tensor with elements");
    GW_CHECK(p.device() == first.device() && p.dtype() == first.dtype(), what, ": parameter ", i,
             " is ", p.str(), " and parameter 0 is ", first.str(),
             "; expected one device and one dtype");
    GW_CHECK(is_floating(p.dtype()), what, ": parameter ", i, " is ", p.str(),
             "; expected a float32, bfloat16 or float64 tensor");
    if (p.is_cuda()) {
      GW_CHECK(p.dtype() == DType::kFloat32 || p.dtype() == DType::kBFloat16, what,
               ": parameter ", i, " is ", p.str(), "; CUDA parameters are float32 or bfloat16");
    }
    const Tensor& g = p.grad();
    if (g.defined()) {
      GW_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device(), what,
               ": parameter ", i, "'s .grad is ", g.str(),
               "; expected the parameter's shape, "
               "dtype and device (",
               p.str(), ")");
    }
  }
}

// A hyperparameter, finite also as the parameters' type: the kernels read it in float32 unless
// the parameters are float64 (1e39 is a finite double and an infinite float).
void check_hyper(const char* what, const char* name, double v, double low, bool low_open,
                 DType dtype, double high = INFINITY) {
  const bool ok = std::isfinite(v) && (low_open ? v > low : v >= low) && v <= high;
  GW_CHECK(ok, what, ": ", name, " is ", v, "; expected a finite value ",
           low_open ? ">" : ">=", " ", low,
           high < INFINITY ? " and <= " + std::to_string(high) : std::string());
  GW_CHECK(finite_as(v, dtype), what, ": ", name, " is ", v, ", which is infinite as ",
           dtype_name(dtype), " (the parameters' type); expected a magnitude of at most ", FLT_MAX);
  // A value that must be positive must stay positive as the kernels read it: eps = 1e-50 is 0 as
  // a float32, and every update would divide by zero.
  const bool as_float = dtype != DType::kFloat64;
  GW_CHECK(!low_open || low != 0 || !as_float || static_cast<float>(v) > 0.f, what, ": ", name,
           " is ", v, ", which is 0 as ", dtype_name(dtype),
           " (the parameters' type); expected at least ", FLT_TRUE_MIN);
}

// Once, when an optimizer is made: every parameter a leaf, none given twice (two handles on one
// storage update it twice a step).
void check_distinct_leaves(const char* what, const std::vector<Tensor>& params) {
  std::unordered_map<const Storage*, std::size_t> seen;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    GW_CHECK(p.is_leaf(), what, ": parameter ", i, " (", p.str(),
             ") is the result of a recorded "
             "op (",
             p.grad_fn()->label(),
             "); expected a leaf: a tensor made by the user, not "
             "computed from one (pass the tensor it came from, or detach() it)");
    const auto [it, fresh] = seen.emplace(p.storage().get(), i);
    GW_CHECK(fresh, what, ": parameters ", it->second, " and ", i, " are the same tensor (",
             p.str(), ", one storage); expected each parameter once");
  }
}

#if GRAPHWARD_HAS_CUDA
float* f32(const Tensor& t) {
  return static_cast<float*>(t.raw_data());
}
#endif


// The groups' parameters, in order.
std::vector<Tensor> flatten(const std::vector<ParamGroup>& groups) {
  std::vector<Tensor> params;
  for (const ParamGroup& g : groups) params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}

// A CPU step's rate (Note [Learning-rate schedule], kernels/optim.h): the peak held in `lr`,
// scheduled at the parameter's count, in the parameters' type.
template <class T>
T scheduled(const Tensor& lr, double step, const kernels::LrSchedule& schedule) {
  return static_cast<T>(
      kernels::scheduled_lr(static_cast<double>(ptr<T>(lr)[0]), step, schedule));
}

}  // namespace

std::vector<ParamGroup> decay_matrices_only(const std::vector<Tensor>& params) {
  std::vector<ParamGroup> groups(2);
  groups[1].weight_decay = 0.0;
  for (const Tensor& p : params) groups[p.defined() && p.dim() >= 2 ? 0 : 1].params.push_back(p);
  return groups;
}

Optimizer::Optimizer(const char* name, std::vector<ParamGroup> groups, double lr,
                     double weight_decay, const std::optional<LrSchedule>& schedule)
    : name_(name), params_(flatten(groups)), lr_value_(lr) {
  if (schedule) {
    const LrSchedule& sc = *schedule;
    GW_CHECK(sc.warmup_steps >= 0 && sc.total_steps > sc.warmup_steps &&
                 sc.total_steps <= (std::int64_t{1} << 53),
             name, ": a schedule of ", sc.warmup_steps, " warm-up steps in ", sc.total_steps,
             "; expected 0 <= warmup_steps < total_steps <= 2^53");
    GW_CHECK(sc.final_lr_fraction >= 0 && sc.final_lr_fraction <= 1, name,
             ": final_lr_fraction is ", sc.final_lr_fraction, "; expected a number in [0, 1]");
    schedule_ = {static_cast<double>(sc.warmup_steps), static_cast<double>(sc.total_steps),
                 sc.final_lr_fraction};
  }
  check_params(name_, params_);
  check_distinct_leaves(name_, params_);
  dtype_ = statistics_dtype(params_.front().dtype());  // bfloat16 parameters: float32 math
  if (params_.front().dtype() == DType::kBFloat16) {
    // Note [Master weights]: each bfloat16 parameter's float32 master, its values as they are.
    for (const Tensor& p : params_) masters_.push_back(cast(p.detach(), DType::kFloat32));
  }
  check_hyper(name_, "lr", lr, 0, false, dtype_);
  check_hyper(name_, "weight_decay", weight_decay, 0, false, dtype_);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double wd = groups[g].weight_decay.value_or(weight_decay);
    if (groups[g].weight_decay) {
      const std::string what = "weight_decay of group " + std::to_string(g);
      check_hyper(name_, what.c_str(), wd, 0, false, dtype_);
    }
    weight_decay_.insert(weight_decay_.end(), groups[g].params.size(), wd);
  }
  device_ = params_.front().device();
  const TensorOptions opt{dtype_, device_};
  lr_ = full({1}, lr, opt);
  // float64 counts: exact far past what float32 holds (2^24 steps, hours of replays).
  step_ = zeros({static_cast<std::int64_t>(params_.size())}, {DType::kFloat64, device_});
  if (device_.is_cuda()) done_ = zeros({1}, {DType::kInt32, device_});
}

const Tensor& Optimizer::master(std::size_t param) const {
  GW_CHECK(param < params_.size(), name_, "::master: parameter ", param, " of ", params_.size(),
           "; expected an index below ", params_.size());
  return masters_.empty() ? params_[param] : masters_[param];
}

double Optimizer::weight_decay(std::size_t param) const {
  GW_CHECK(param < params_.size(), name_, "::weight_decay: parameter ", param, " of ",
           params_.size(), "; expected an index below ", params_.size());
  return weight_decay_[param];
}

void Optimizer::set_lr(double lr) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_hyper(name_, "lr", lr, 0, false, dtype_);
  Tensor target = lr_;
  if (device_.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(device_);
    target.storage()->sync_for_write(scope.stream());
    k::fill(f32(target), static_cast<float>(lr), 1, scope.stream());
#endif
  } else {
    dispatch_cpu(target.dtype(), [&]<class T>() { ptr<T>(target)[0] = static_cast<T>(lr); });
  }
  target.bump_version();
  lr_value_ = lr;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, Tensor>> out{{"step", step_}};
  for (int j = 0; j < 2; ++j) {
    for (std::size_t i = 0; i < state_[j].size(); ++i) {
      if (state_[j][i].defined()) {
        out.emplace_back(std::string(state_names_[j]) + "." + std::to_string(i), state_[j][i]);
      }
    }
  }
  for (std::size_t i = 0; i < masters_.size(); ++i) {
    out.emplace_back("master." + std::to_string(i), masters_[i]);
  }
  return out;
}

double Optimizer::lr_at(std::int64_t step) const {
  GW_CHECK(step >= 0, name_, "::lr_at: step ", step, "; expected at least 0");
  return kernels::scheduled_lr(lr_value_, static_cast<double>(step), schedule_);
}

std::int64_t Optimizer::steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::vector<double> counts = step_.to_vector<double>();
  return static_cast<std::int64_t>(*std::max_element(counts.begin(), counts.end()));
}

std::int64_t Optimizer::steps(std::size_t param) const {
  std::lock_guard<std::mutex> lock(mutex_);
  GW_CHECK(param < params_.size(), name_, "::steps: parameter ", param, " of ", params_.size(),
           "; expected an index below ", params_.size());
  return static_cast<std::int64_t>(step_.to_vector<double>()[param]);
}

void Optimizer::set_steps(std::size_t param, std::int64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  GW_CHECK(param < params_.size(), name_, "::set_steps: parameter ", param, " of ", params_.size(),
           "; expected an index below ", params_.size());
  constexpr std::int64_t kExact = std::int64_t{1} << 53;
  GW_CHECK(count >= 0 && count <= kExact, name_, "::set_steps: a count of ", count,
           "; expected 0 to 2^53 (", kExact, ")");
  check_capturable("Optimizer::set_steps (an upload from the host)");
  const double value = static_cast<double>(count);
  if (device_.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(device_);
    step_.storage()->sync_for_write(scope.stream());
    GW_CUDA_CHECK(cudaMemcpyAsync(static_cast<double*>(step_.raw_data()) + param, &value,
                                  sizeof value, cudaMemcpyHostToDevice, scope.stream()));
    GW_CUDA_CHECK(cudaStreamSynchronize(scope.stream()));  // `value` is on this stack
#endif
  } else {
    static_cast<double*>(step_.raw_data())[param] = value;
  }
  step_.bump_version();
}

void Optimizer::step_params(const std::vector<std::size_t>& which) {
  std::vector<bool> seen(params_.size(), false);
  for (std::size_t i : which) {
    GW_CHECK(i < params_.size() && !seen[i], name_, "::step_params: parameter ", i,
             i < params_.size() ? " is listed twice" : " does not exist", "; expected indices of ",
             "params() (", params_.size(), " parameters), each at most once");
    seen[i] = true;
  }
  run_step(name_, &which);
}

// ---- Note [Optimizer steps in the backward] (optim.h) -------------------------------------------

StepInBackward::StepInBackward(Optimizer& optimizer, std::size_t bucket_bytes)
    : optimizer_(optimizer), bucket_bytes_(bucket_bytes) {
  GW_CHECK(bucket_bytes > 0, "StepInBackward: bucket_bytes is 0; expected the gradient bytes a ",
           "bucket collects before its parameters are stepped (e.g. 1 MiB)");
  const std::vector<Tensor>& params = optimizer.params();
  if (!params.empty() && params.front().is_cuda()) stream_.emplace(params.front().device());
}

double StepInBackward::begin_backward(GradWrite grad_write) {
  GW_CHECK(grad_write == GradWrite::kOverwrite,
           "StepInBackward: a backward with GradWrite::kAccumulate; expected kOverwrite (each "
           "backward steps the parameters as its gradients are final, so one that adds to earlier "
           "gradients would step with their sum: accumulate micro-batches without StepInBackward, "
           "then step)");
  return 1.0;
}

cudaStream_t StepInBackward::stream() const {
  return stream_ ? stream_->get() : nullptr;
}

void StepInBackward::reduce(const std::vector<Tensor>& grads) {
  const std::vector<Tensor>& params = optimizer_.params();
  std::vector<std::size_t> which;
  for (const Tensor& g : grads) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor& pg = params[i].grad();
      if (pg.defined() && pg.storage() == g.storage() && pg.raw_data() == g.raw_data()) {
        which.push_back(i);
        break;
      }
    }
  }
  if (which.empty()) return;
  PlannedSyncScope unplanned(false);  // the plan did not order these writes: they order themselves
  std::optional<StreamGuard> on;
  if (stream_) on.emplace(*stream_);
  optimizer_.step_params(which);
}

void Optimizer::run_step(const char* what, const std::vector<std::size_t>* which) {
  std::lock_guard<std::mutex> lock(mutex_);
  detail::NvtxRange range(what);
  check_params(name_, params_);
  const std::size_t count = which ? which->size() : params_.size();
  auto index = [&](std::size_t k) { return which ? (*which)[k] : k; };
  // Note [Host state of a captured step] (engine/tape/host_state.h): which parameters have a .grad.
  if (HostStateLog* log = detail::host_state_log()) {
    for (std::size_t k = 0; k < count; ++k) detail::note_grad(*log, params_[index(k)]);
  }
  if (device_.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    CudaScope scope(device_);
    const cudaStream_t s = scope.stream();
    lr_.storage()->sync_for_read(s);
    step_.storage()->sync_for_write(s);
    done_.storage()->sync_for_write(s);
    slices_.clear();
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = index(k);
      const Tensor& p = params_[i];
      const Tensor& g = p.grad();
      if (!g.defined()) continue;  // skipped
      g.storage()->sync_for_read(s);
      p.storage()->sync_for_write(s);
      p.bump_version();
      kernels::ParamSlice slice;
      slice.step = static_cast<double*>(step_.raw_data()) + i;
      slice.n = p.numel();
      slice.weight_decay = static_cast<float>(weight_decay_[i]);
      if (masters_.empty()) {
        slice.p = f32(p);
        slice.grad = f32(g);
      } else {  // Note [Master weights]
        const Tensor& master = masters_[i];
        master.storage()->sync_for_write(s);
        master.bump_version();
        slice.p = f32(master);
        slice.grad16 = static_cast<const bf16*>(g.raw_data());
        slice.copy = static_cast<bf16*>(p.raw_data());
      }
      float** state[2] = {&slice.s1, &slice.s2};
      for (int j = 0; j < 2; ++j) {
        if (state_[j].empty() || !state_[j][i].defined()) continue;
        const Tensor& st = state_[j][i];
        st.storage()->sync_for_write(s);
        st.bump_version();
        *state[j] = f32(st);
      }
      slices_.push_back(slice);
    }
    launch_cuda(slices_, static_cast<unsigned*>(done_.raw_data()), s);  // and counts the steps
    step_.bump_version();
    return;
#endif
  }
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t i = index(k);
    const Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    p.bump_version();
    if (!masters_.empty()) masters_[i].bump_version();
    for (const auto& state : state_) {
      if (!state.empty() && state[i].defined()) state[i].bump_version();
    }
    update_cpu(i);
    static_cast<double*>(step_.raw_data())[i] += 1.0;
  }
  step_.bump_version();
}

void Optimizer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  detail::NvtxRange range("zero_grad");
  check_params(name_, params_);  // a .grad of another shape or dtype is refused, nothing written
  if (HostStateLog* log = detail::host_state_log()) {  // Note [Host state of a captured step]
    for (const Tensor& p : params_) detail::note_grad(*log, p);
  }
  for (const Tensor& p : params_) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (g.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
      CudaScope scope(device_);
      g.storage()->sync_for_write(scope.stream());
      GW_CUDA_CHECK(cudaMemsetAsync(g.raw_data(), 0, g.nbytes(), scope.stream()));
#endif
    } else {
      std::memset(g.raw_data(), 0, g.nbytes());  // +0.0 in float32, float64 and bfloat16
    }
    g.bump_version();
  }
}

Sgd::Sgd(std::vector<Tensor> params, SgdOptions o)
    : Sgd(std::vector<ParamGroup>{{.params = std::move(params)}}, o) {}

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions o)
    : Optimizer("Sgd", std::move(groups), o.lr, o.weight_decay, o.schedule) {
  check_hyper(name_, "momentum", o.momentum, 0, false, dtype_);
  check_hyper(name_, "dampening", o.dampening, 0, false, dtype_, 1);
  GW_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), name_,
           ": nesterov needs momentum > 0 and dampening 0; got momentum ", o.momentum,
           ", dampening ", o.dampening);
  hp_ = {o.momentum, o.dampening, o.weight_decay, o.nesterov, schedule_};
  state_names_[0] = "momentum_buffer";
  if (o.momentum != 0) {
    for (const Tensor& p : params_) state_[0].push_back(zeros(p.shape(), {dtype_, device_}));
  }
}

void Sgd::step() {
  run_step("Sgd::step");
}

#if GRAPHWARD_HAS_CUDA
void Sgd::launch_cuda(const std::vector<kernels::ParamSlice>& slices, unsigned* done,
                      cudaStream_t stream) {
  k::sgd_step(slices.data(), slices.size(), f32(lr_), done, hp_, stream);
}
#endif

void Sgd::update_cpu(std::size_t i) {
  const Tensor& p = params_[i];
  const Tensor* buf = state_[0].empty() ? nullptr : &state_[0][i];
  k::SgdParams hp = hp_;
  hp.weight_decay = weight_decay_[i];
  const double step = static_cast<double*>(step_.raw_data())[i];
  if (!masters_.empty()) {  // Note [Master weights]: the master stepped, p its rounding
    CpuData<float> d(true);
    float* master = ptr<float>(masters_[i]);
    k::cpu::sgd_step<float>(master, d.in(p.grad()), buf ? ptr<float>(*buf) : nullptr, p.numel(),
                            scheduled<float>(lr_, step, schedule_), step, hp);
    std::copy_n(master, p.numel(), d.out(p));
    d.commit();
    return;
  }
  dispatch_cpu(p.dtype(), [&]<class T>() {
    k::cpu::sgd_step<T>(ptr<T>(p), ptr<T>(p.grad()), buf ? ptr<T>(*buf) : nullptr, p.numel(),
                        scheduled<T>(lr_, step, schedule_), step, hp);
  });
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : AdamW(std::vector<ParamGroup>{{.params = std::move(params)}}, o) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions o)
    : Optimizer("AdamW", std::move(groups), o.lr, o.weight_decay, o.schedule) {
  check_hyper(name_, "beta1", o.beta1, 0, false, dtype_, 1);
  check_hyper(name_, "beta2", o.beta2, 0, false, dtype_, 1);
  GW_CHECK(o.beta1 < 1 && o.beta2 < 1, name_, ": betas must be < 1; got ", o.beta1, ", ", o.beta2);
  check_hyper(name_, "eps", o.eps, 0, true, dtype_);
  hp_ = {o.beta1, o.beta2, o.eps, o.weight_decay, schedule_};
  state_names_[0] = "exp_avg";
  state_names_[1] = "exp_avg_sq";
  for (const Tensor& p : params_) {
    state_[0].push_back(zeros(p.shape(), {dtype_, device_}));
    state_[1].push_back(zeros(p.shape(), {dtype_, device_}));
  }
}

void AdamW::step() {
  run_step("AdamW::step");
}

#if GRAPHWARD_HAS_CUDA
void AdamW::launch_cuda(const std::vector<kernels::ParamSlice>& slices, unsigned* done,
                        cudaStream_t stream) {
  k::adamw_step(slices.data(), slices.size(), f32(lr_), done, hp_, stream);
}
#endif

void AdamW::update_cpu(std::size_t i) {
  const Tensor& p = params_[i];
  const Tensor& m = state_[0][i];
  const Tensor& v = state_[1][i];
  k::AdamWParams hp = hp_;
  hp.weight_decay = weight_decay_[i];
  const double step = static_cast<double*>(step_.raw_data())[i];
  if (!masters_.empty()) {  // Note [Master weights]: the master stepped, p its rounding
    CpuData<float> d(true);
    float* master = ptr<float>(masters_[i]);
    k::cpu::adamw_step<float>(master, d.in(p.grad()), ptr<float>(m), ptr<float>(v), p.numel(),
                              scheduled<float>(lr_, step, schedule_), step, hp);
    std::copy_n(master, p.numel(), d.out(p));
    d.commit();
    return;
  }
  dispatch_cpu(p.dtype(), [&]<class T>() {
    k::cpu::adamw_step<T>(ptr<T>(p), ptr<T>(p.grad()), ptr<T>(m), ptr<T>(v), p.numel(),
                          scheduled<T>(lr_, step, schedule_), step, hp);
  });
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const char* what = "clip_grad_norm";
  detail::NvtxRange range(what);
  check_params(what, params);
  check_hyper(what, "max_norm", max_norm, 0, true, params.front().dtype());
  std::vector<const Tensor*> grads;
  HostStateLog* log = detail::host_state_log();  // Note [Host state of a captured step]
  for (const Tensor& p : params) {
    if (log) detail::note_grad(*log, p);
    if (p.grad().defined()) grads.push_back(&p.grad());
  }
  const Device device = params.front().device();
  const TensorOptions opt{statistics_dtype(params.front().dtype()), device};
  if (grads.empty()) return zeros({}, opt);
  Tensor norm = Tensor::empty({}, opt);
  if (device.is_cuda()) {
#if GRAPHWARD_HAS_CUDA
    const bool low = params.front().dtype() == DType::kBFloat16;
    CudaScope scope(device);
    const cudaStream_t s = scope.stream();
    // Each gradient's sum of squares in parts (kernels/optim.h), all the parts summed in one.
    std::int64_t count = 0;
    for (const Tensor* g : grads) count += k::sum_squares_parts(g->numel());
    Tensor parts = Tensor::empty({count}, opt);
    Tensor scale = Tensor::empty({1}, opt);
    std::int64_t at = 0;
    for (const Tensor* g : grads) {
      g->storage()->sync_for_read(s);
      if (low) {
        k::sum_squares(f32(parts) + at, static_cast<const bf16*>(g->raw_data()), g->numel(), s);
      } else {
        k::sum_squares(f32(parts) + at, f32(*g), g->numel(), s);
      }
      at += k::sum_squares_parts(g->numel());
    }
    k::clip_coefficient(f32(norm), f32(scale), f32(parts), count, static_cast<float>(max_norm), s);
    for (const Tensor* g : grads) {
      g->storage()->sync_for_write(s);
      if (low) {
        k::scale_by(static_cast<bf16*>(g->raw_data()), f32(scale), g->numel(), s);
      } else {
        k::scale_by(f32(*g), f32(scale), g->numel(), s);
      }
      g->bump_version();
    }
    return norm;
#endif
  }
  // bfloat16 gradients widened, scaled in float32 and rounded back (Note [bfloat16 on the CPU]).
  dispatch_cpu_data(params.front().dtype(), [&]<class T>(CpuData<T>& data) {
    double total = 0;
    for (const Tensor* g : grads)
      total += static_cast<double>(k::cpu::sum_squares<T>(data.inout(*g), g->numel()));
    const double nrm = std::sqrt(total);
    ptr<T>(norm)[0] = static_cast<T>(nrm);
    // A NaN norm makes every gradient NaN (torch.nn.utils.clip_grad_norm_), not none.
    const double ratio = max_norm / (nrm + 1e-6);
    const double c = std::isnan(ratio) ? ratio : std::min(1.0, ratio);
    for (const Tensor* g : grads) {
      T* d = data.inout(*g);
      for (std::int64_t j = 0; j < g->numel(); ++j) d[j] *= static_cast<T>(c);
      g->bump_version();
    }
  });
  return norm;
}

}  // namespace graphward
