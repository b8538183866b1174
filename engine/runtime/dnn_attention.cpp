// cuDNN's fused attention through the cudnn-frontend graph API (Note [Fused attention],
// engine/runtime/dnn.h).
#include "graphward/engine/runtime/dnn.h"

#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN && GRAPHWARD_HAS_CUDNN_FRONTEND
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/stream.h"
#include "graphward/engine/runtime/tensor.h"
#include "graphward/kernels/nvtx_mark.h"

namespace graphward::dnn {
namespace {
namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorAttr = fe::graph::Tensor_attributes;

enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeed, kOffset };

// t as [n, rows, cols] contiguous, cuDNN's [b, h, s, d] = [n, 1, rows, cols]; its uid.
TensorAttr& laid_out(TensorAttr& t, std::int64_t uid, std::int64_t n, std::int64_t rows,
                     std::int64_t cols) {
  return t.set_uid(uid).set_dim({n, 1, rows, cols}).set_stride(
      {rows * cols, rows * cols, cols, 1});
}
// SdpaGeom::heads > 0: a window of `heads` heads of d columns in rows of `row` elements, a row a
// position (b · tq rows): cuDNN's [b, heads, tq, d] with the row as the position's stride.
TensorAttr& packed(TensorAttr& t, std::int64_t uid, const SdpaGeom& s, std::int64_t row) {
  const std::int64_t b = s.n / s.heads;
  return t.set_uid(uid).set_dim({b, s.heads, s.tq, s.d}).set_stride({s.tq * row, s.d, row, 1});
}
// q, k, v or their gradients (row 3 · heads · d where packed), o or its gradient (heads · d).
TensorAttr& qkv_laid_out(TensorAttr& t, std::int64_t uid, const SdpaGeom& s, std::int64_t rows,
                         std::int64_t cols) {
  return s.heads > 0 ? packed(t, uid, s, 3 * s.heads * s.d) : laid_out(t, uid, s.n, rows, cols);
}
TensorAttr& o_laid_out(TensorAttr& t, std::int64_t uid, const SdpaGeom& s) {
  return s.heads > 0 ? packed(t, uid, s, s.heads * s.d) : laid_out(t, uid, s.n, s.tq, s.dv);
}
// The softmax statistics [n, tq] float32, contiguous: cuDNN's [b, h, tq, 1] as q's b and h.
TensorAttr& stats_laid_out(TensorAttr& t, const SdpaGeom& s) {
  const std::int64_t h = s.heads > 0 ? s.heads : 1;
  return t.set_uid(kStats)
      .set_dim({s.n / h, h, s.tq, 1})
      .set_stride({h * s.tq, s.tq, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}
// An input of the graph among q, k and v, laid out so.
TensorAttr qkv_input(const char* name, std::int64_t uid, const SdpaGeom& s, std::int64_t rows,
                     std::int64_t cols) {
  TensorAttr t;
  t.set_name(name);
  return qkv_laid_out(t, uid, s, rows, cols);
}
// The dropout's Philox seed or offset: one int64 on the device.
std::shared_ptr<TensorAttr> rng_word(Graph& g, const char* name, std::int64_t uid) {
  return g.tensor(TensorAttr()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}
std::shared_ptr<Graph> new_graph() {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<Graph> forward_graph(const SdpaGeom& s) {
  auto g = new_graph();
  auto q = g->tensor(qkv_input("q", kQ, s, s.tq, s.d));
  auto k = g->tensor(qkv_input("k", kK, s, s.tk, s.d));
  auto v = g->tensor(qkv_input("v", kV, s, s.tk, s.dv));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("sdpa")
                     .set_generate_stats(true)
                     .set_attn_scale(s.scale)
                     .set_causal_mask(s.causal);
  if (s.dropout > 0) {
    options.set_dropout(s.dropout, rng_word(*g, "seed", kSeed), rng_word(*g, "offset", kOffset));
  }
  auto [o, stats] = g->sdpa(q, k, v, options);
  o_laid_out(o->set_output(true), kO, s);
  stats_laid_out(stats->set_output(true), s);
  return g;
}

std::shared_ptr<Graph> backward_graph(const SdpaGeom& s) {
  auto g = new_graph();
  auto q = g->tensor(qkv_input("q", kQ, s, s.tq, s.d));
  auto k = g->tensor(qkv_input("k", kK, s, s.tk, s.d));
  auto v = g->tensor(qkv_input("v", kV, s, s.tk, s.dv));
  TensorAttr o_attr, do_attr;
  auto o = g->tensor(o_laid_out(o_attr.set_name("o"), kO, s));
  auto d_o = g->tensor(o_laid_out(do_attr.set_name("do"), kDO, s));
  TensorAttr stats_attr;
  auto stats = g->tensor(stats_laid_out(stats_attr.set_name("stats"), s));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(s.scale)
                     .set_causal_mask(s.causal)
                     .set_deterministic_algorithm(true);
  if (s.dropout > 0) {
    options.set_dropout(s.dropout, rng_word(*g, "seed", kSeed), rng_word(*g, "offset", kOffset));
  }
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  qkv_laid_out(dq->set_output(true), kDQ, s, s.tq, s.d);
  qkv_laid_out(dk->set_output(true), kDK, s, s.tk, s.d);
  qkv_laid_out(dv->set_output(true), kDV, s, s.tk, s.dv);
  return g;
}

// Builds g's plans on `handle`: "" when built, else cuDNN's reason.
std::string build(Graph& g, cudnnHandle_t handle) {
  const fe::error_object e = g.build(handle, {fe::HeurMode_t::A});
  return e.is_good() ? std::string() : e.err_msg;
}

struct SdpaPlan {
  std::shared_ptr<Graph> forward, backward;
  std::int64_t forward_workspace = 0, backward_workspace = 0;
  std::string refused;  // cuDNN's reason where it builds no plan (then no graphs)
};
struct GeomHash {
  std::size_t operator()(const SdpaGeom& g) const noexcept {
    std::uint32_t scale_bits = 0, dropout_bits = 0;
    std::memcpy(&scale_bits, &g.scale, sizeof(scale_bits));
    std::memcpy(&dropout_bits, &g.dropout, sizeof(dropout_bits));
    std::size_t h = 0;
    for (std::uint64_t v :
         {std::uint64_t(g.n), std::uint64_t(g.tq), std::uint64_t(g.tk), std::uint64_t(g.d),
          std::uint64_t(g.dv), std::uint64_t(g.causal), std::uint64_t(scale_bits),
          std::uint64_t(dropout_bits), std::uint64_t(g.heads)}) {
      h = h * 1000003u ^ std::hash<std::uint64_t>{}(v);
    }
    return h;
  }
};
// Per thread, one map per device touched (Note [cuDNN plans]: the plans are the thread's, as its
// handle is).
thread_local std::vector<std::unordered_map<SdpaGeom, SdpaPlan, GeomHash>> t_plans;

SdpaPlan& plan_for(Device device, cudaStream_t stream, const SdpaGeom& g) {
  if (t_plans.size() <= static_cast<std::size_t>(device.index)) t_plans.resize(device.index + 1);
  auto& plans = t_plans[device.index];
  auto it = plans.find(g);
  if (it != plans.end()) return it->second;
  GW_CHECK(!capturing() && !stream_is_capturing(stream),
           "scaled_dot_product_attention: the first fused attention of shape [", g.n, ", ", g.tq,
           ", ", g.d, "] x [", g.n, ", ", g.tk, ", ", g.d, "] on this thread is inside a stream "
           "capture, where cuDNN's plans cannot be built; expected one eager step on this thread "
           "before capturing");
  const cudnnHandle_t handle = thread_handle(device, stream, "scaled_dot_product_attention");
  SdpaPlan p;
  auto forward = forward_graph(g), backward = backward_graph(g);
  std::string why = build(*forward, handle);
  if (why.empty()) why = build(*backward, handle);
  if (why.empty()) {
    const bool sizes = forward->get_workspace_size(p.forward_workspace).is_good() &&
                       backward->get_workspace_size(p.backward_workspace).is_good();
    if (!sizes) why = "cuDNN gave no workspace size";
  }
  if (why.empty()) {
    p.forward = std::move(forward);
    p.backward = std::move(backward);
  } else {
    p.refused = why.empty() ? "cuDNN built no plan" : why;
  }
  return plans.emplace(g, std::move(p)).first->second;
}

// Scratch memory for one call, from the caching allocator on the op's stream (graph memory inside
// a capture); empty for none.
Tensor workspace(Device device, std::int64_t bytes) {
  if (bytes <= 0) return Tensor();
  return Tensor::empty({(bytes + 3) / 4}, {DType::kFloat32, device});
}

void execute(const Graph& g, cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack,
             const Tensor& ws) {
  const fe::error_object e = g.execute(handle, pack, ws.defined() ? ws.raw_data() : nullptr);
  GW_CHECK(e.is_good(), "scaled_dot_product_attention: cuDNN's fused attention failed: ",
           e.err_msg);
}

void* mut(const void* p) {
  return const_cast<void*>(p);  // cuDNN's variant pack takes void* for inputs too
}

// The seed and offset into the pack, where the graph drops.
void add_rng(std::unordered_map<std::int64_t, void*>& pack, const SdpaGeom& g,
             const std::int64_t* rng, const char* op) {
  if (g.dropout <= 0) return;
  GW_CHECK(rng != nullptr, op, ": dropout ", g.dropout, " and no seed and offset given");
  pack.emplace(kSeed, mut(rng));
  pack.emplace(kOffset, mut(rng + 1));
}

}  // namespace

bool sdpa_supported(Device device, cudaStream_t stream, const SdpaGeom& g, std::string* why) {
  const SdpaPlan& p = plan_for(device, stream, g);
  if (why) *why = p.refused;
  return p.refused.empty();
}

void sdpa_forward(Device device, cudaStream_t stream, const SdpaGeom& g, bf16* o, float* stats,
                  const bf16* q, const bf16* k, const bf16* v, const std::int64_t* rng) {
  const SdpaPlan& p = plan_for(device, stream, g);
  GW_CHECK(p.refused.empty(), "scaled_dot_product_attention: cuDNN refuses the shape: ",
           p.refused);
  const cudnnHandle_t handle = thread_handle(device, stream, "scaled_dot_product_attention");
  const Tensor ws = workspace(device, p.forward_workspace);
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, mut(q)}, {kK, mut(k)}, {kV, mut(v)}, {kO, o}, {kStats, stats}};
  add_rng(pack, g, rng, "scaled_dot_product_attention");
  execute(*p.forward, handle, pack, ws);
  // What the kernels wrote, for initcheck (Note [GEMM outputs and initcheck], kernels/gemm.cu):
  // o, contiguous packed or not, and the statistics.
  const auto rows = static_cast<std::size_t>(g.n * g.tq);
  kernels::mark_written(o, rows * static_cast<std::size_t>(g.dv) * sizeof(bf16), stream);
  kernels::mark_written(stats, rows * sizeof(float), stream);
}

void sdpa_backward(Device device, cudaStream_t stream, const SdpaGeom& g, bf16* dq, bf16* dk,
                   bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                   const bf16* d_o, const float* stats, const std::int64_t* rng) {
  const SdpaPlan& p = plan_for(device, stream, g);
  GW_CHECK(p.refused.empty(), "scaled_dot_product_attention_backward: cuDNN refuses the shape: ",
           p.refused);
  const cudnnHandle_t handle = thread_handle(device, stream, "scaled_dot_product_attention");
  const Tensor ws = workspace(device, p.backward_workspace);
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, mut(q)},   {kK, mut(k)},         {kV, mut(v)}, {kO, mut(o)}, {kDO, mut(d_o)},
      {kStats, mut(stats)}, {kDQ, dq}, {kDK, dk},    {kDV, dv}};
  add_rng(pack, g, rng, "scaled_dot_product_attention_backward");
  execute(*p.backward, handle, pack, ws);
  // What the kernels wrote (Note [GEMM outputs and initcheck], kernels/gemm.cu): packed, the
  // three windows tile the one [b · tq, 3 · heads · d] gradient that starts at dq; else three
  // contiguous tensors.
  const auto elems = [](std::int64_t a, std::int64_t b, std::int64_t c) {
    return static_cast<std::size_t>(a * b * c) * sizeof(bf16);
  };
  if (g.heads > 0) {
    kernels::mark_written(dq, elems(g.n, g.tq, 3 * g.d), stream);
  } else {
    kernels::mark_written(dq, elems(g.n, g.tq, g.d), stream);
    kernels::mark_written(dk, elems(g.n, g.tk, g.d), stream);
    kernels::mark_written(dv, elems(g.n, g.tk, g.dv), stream);
  }
}

}  // namespace graphward::dnn
#endif
