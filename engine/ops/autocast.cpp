// The Autocast scope (Note [Autocast], engine/ops/autocast.h).
#include "graphward/engine/ops/autocast.h"

#include <algorithm>

#include "graphward/base/error.h"
#include "graphward/engine/ops/ops.h"
#include "graphward/engine/tape/autograd.h"

namespace graphward {

namespace {
thread_local Autocast* t_scope = nullptr;

// Whether a and b are the same parameter: one storage, address and shape.
bool same_parameter(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.raw_data() == b.raw_data() && a.shape() == b.shape();
}
}  // namespace

struct AutocastAccess {
  static Autocast* active() {
    Autocast* s = t_scope;
    return s && s->enabled_ ? s : nullptr;
  }
  static Tensor cast_parameter(Autocast& scope, const Tensor& t) {
    const bool recorded = grad_mode_enabled();
    for (const Autocast::Copy& c : scope.cache_) {
      if (same_parameter(c.source, t) && c.version == t.version() && c.recorded == recorded) {
        return c.copy;
      }
    }
    Tensor copy = cast(t, scope.dtype_);
    scope.cache_.push_back({t, t.version(), recorded, copy});
    return copy;
  }
  static DType dtype(const Autocast& scope) { return scope.dtype_; }
};

Autocast::Autocast(DType dtype, bool enabled)
    : dtype_(dtype), enabled_(enabled), previous_(t_scope) {
  GW_CHECK(dtype == DType::kBFloat16, "Autocast: dtype is ", dtype_name(dtype),
           "; expected bfloat16 (float16 needs loss scaling, which graphward does not do; "
           "float32 is Autocast's enabled = false)");
  t_scope = this;
}

Autocast::Autocast(const std::vector<Tensor>& parameters, DType dtype) : Autocast(dtype, true) {
  std::vector<Tensor> todo;
  for (const Tensor& p : parameters) {
    if (!p.defined() || p.dtype() != DType::kFloat32 || !p.is_leaf() || !p.requires_grad()) {
      continue;
    }
    const auto given = [&p](const Tensor& t) { return same_parameter(t, p); };
    if (std::none_of(todo.begin(), todo.end(), given)) todo.push_back(p);  // twice: cast once
  }
  const bool recorded = grad_mode_enabled();
  const std::vector<Tensor> copies = ops_detail::cast_to_bf16_batched(todo);
  for (std::size_t i = 0; i < todo.size(); ++i) {
    cache_.push_back({todo[i], todo[i].version(), recorded, copies[i]});
  }
}

Autocast::~Autocast() {
  t_scope = previous_;
}

std::vector<Tensor> Autocast::cast_parameters() const {
  std::vector<Tensor> out;
  out.reserve(cache_.size());
  for (const Copy& c : cache_) out.push_back(c.source);
  return out;
}

bool autocast_enabled() {
  return AutocastAccess::active() != nullptr;
}

namespace ops_detail {

bool autocast_matrix_operands(std::initializer_list<Tensor*> operands) {
  Autocast* scope = AutocastAccess::active();
  if (!scope) return false;
  bool changed = false;
  for (Tensor* t : operands) {
    if (!t->defined() || t->dtype() != DType::kFloat32) continue;
    *t = t->is_leaf() && t->requires_grad() ? AutocastAccess::cast_parameter(*scope, *t)
                                            : cast(*t, AutocastAccess::dtype(*scope));
    changed = true;
  }
  return changed;
}

void autocast_promote(std::initializer_list<Tensor*> operands) {
  if (!AutocastAccess::active()) return;
  bool f32 = false, low = false;
  for (const Tensor* t : operands) {
    if (!t->defined()) continue;
    f32 = f32 || t->dtype() == DType::kFloat32;
    low = low || t->dtype() == DType::kBFloat16;
  }
  if (!f32 || !low) return;
  for (Tensor* t : operands) {
    if (t->defined() && t->dtype() == DType::kBFloat16) *t = cast(*t, DType::kFloat32);
  }
}

}  // namespace ops_detail
}  // namespace graphward
