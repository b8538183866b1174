#pragma once
// Random programs for the autograd engine: seeded, reproducible DAGs of ops over 2-d
// tensors — random fan-out (any earlier value may be read again, by any number of ops), a random
// stream per op (streams reused across unrelated branches), random shapes within small limits,
// parameters made by the ops that need them, and one to three roots (reductions of late values).
//
// A Program is plain data: generate(seed) makes one, str() prints it (every failure message
// carries it, with the seed to run it again), run() executes it on a device in a dtype, eagerly on
// one stream or on its streams, or with its backward replayed from a BackwardGraph, and returns the
// root values and every leaf's gradient as doubles. The reference is the same program run on the
// CPU in float64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "graphward/capture/backward_graph.h"
#include "graphward/graphward.h"

namespace graphward::fuzz {

enum class OpKind {
  kAdd,         // a + b (same shape; b may be a)
  kSub,         // a - b
  kMul,         // a * b
  kAddRow,      // a + row (a new [c] parameter, broadcast over a's rows)
  kScale,       // a * s
  kRelu,
  kTanh,
  kSigmoid,
  kGelu,
  kLinear,      // linear(a, W, b?) with a new W [out, in] (and b [out]), activation none/ReLU/GELU
  kMatmul,      // a · W, a new W [c, out]
  kSoftmax,     // over the last dimension
  kLayerNorm,   // with new weight and bias [c]
  kTranspose,   // [r, c] -> [c, r]
  kConcat,      // [r, c1] ++ [r, c2] along dim 1 (two values with the same rows)
  kLogSoftmax,  // over the last dimension
  kNarrow,      // columns [start, start + length) of a [r, c] value
  kCount
};

inline const char* op_name(OpKind k) {
  static const char* const names[] = {"add",     "sub",    "mul",    "add_row",    "scale",
                                      "relu",    "tanh",   "sigmoid", "gelu",      "linear",
                                      "matmul",  "softmax", "layer_norm", "transpose", "concat",
                                      "log_softmax", "narrow"};
  return names[static_cast<int>(k)];
}

struct Op {
  OpKind kind = OpKind::kAdd;
  int a = -1, b = -1;          // operand values
  int weight = -1, bias = -1;  // parameter leaves this op made (-1: none)
  Activation act = Activation::kNone;
  double scalar = 1.0;
  std::int64_t start = 0, length = 0;  // kNarrow's window
  int stream = 0;
  Shape shape;  // the result's
};

struct Program {
  std::uint64_t seed = 0;
  int num_streams = 1;
  std::vector<Shape> leaves;     // value i < leaves.size() is leaf i (all require grad)
  std::vector<Op> ops;           // value leaves.size() + j is op j's result
  std::vector<int> roots;        // values reduced to a scalar root each
  // 0: sum of the value times a fixed random matrix, 1: mean of it, 2: mse_loss against a fixed
  // target (never a plain sum: through softmax or layer_norm its gradient is zero in exact
  // arithmetic, and float32 rounding is all that is left to compare)
  std::vector<int> root_kind;

  int num_values() const { return static_cast<int>(leaves.size() + ops.size()); }
  const Shape& shape_of(int v) const {
    return v < static_cast<int>(leaves.size()) ? leaves[static_cast<std::size_t>(v)]
                                               : ops[static_cast<std::size_t>(v) - leaves.size()].shape;
  }
  std::string str() const {
    std::ostringstream os;
    os << "program seed " << seed << ", " << num_streams << " stream(s)\n";
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      os << "  v" << i << " = leaf " << shape_str(leaves[i]) << "\n";
    }
    for (std::size_t j = 0; j < ops.size(); ++j) {
      const Op& o = ops[j];
      os << "  v" << leaves.size() + j << " = " << op_name(o.kind);
      if (o.kind == OpKind::kLinear && o.act != Activation::kNone) {
        os << (o.act == Activation::kRelu ? "+relu" : "+gelu");
      }
      os << "(v" << o.a;
      if (o.b >= 0) os << ", v" << o.b;
      if (o.weight >= 0) os << ", w=v" << o.weight;
      if (o.bias >= 0) os << ", b=v" << o.bias;
      if (o.kind == OpKind::kScale) os << ", " << o.scalar;
      if (o.kind == OpKind::kNarrow) os << ", " << o.start << ", " << o.length;
      os << ") " << shape_str(o.shape) << " on s" << o.stream << "\n";
    }
    for (std::size_t r = 0; r < roots.size(); ++r) {
      static const char* const kinds[] = {"weighted sum", "weighted mean", "mse"};
      os << "  root " << r << " = " << kinds[root_kind[r]] << "(v" << roots[r] << ")\n";
    }
    return os.str();
  }
};

struct Limits {
  int min_ops = 3, max_ops = 16;
  int max_streams = 4;
  std::int64_t max_dim = 9;
};

// A random program (the same for the same seed and limits).
inline Program generate(std::uint64_t seed, Limits limits = {}) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto dim = [&] { return static_cast<std::int64_t>(uniform(2, static_cast<int>(limits.max_dim))); };
  Program p;
  p.seed = seed;
  p.num_streams = uniform(1, limits.max_streams);
  const std::int64_t rows = dim();
  const int inputs = uniform(1, 3);
  for (int i = 0; i < inputs; ++i) p.leaves.push_back({rows, dim()});
  // New parameter leaves are appended to `leaves`; values are renumbered at the end so that
  // leaves come first (op operands refer to provisional ids until then).
  struct Pending {
    bool is_leaf;
    int index;  // into p.leaves or p.ops
  };
  std::vector<Pending> values;
  for (int i = 0; i < inputs; ++i) values.push_back({true, i});
  auto shape_of = [&](int v) -> Shape {
    const Pending& pv = values[static_cast<std::size_t>(v)];
    return pv.is_leaf ? p.leaves[static_cast<std::size_t>(pv.index)]
                      : p.ops[static_cast<std::size_t>(pv.index)].shape;
  };
  auto new_leaf = [&](Shape s) {
    p.leaves.push_back(std::move(s));
    values.push_back({true, static_cast<int>(p.leaves.size()) - 1});
    return static_cast<int>(values.size()) - 1;
  };
  // Operands lean towards recent values (longer chains), any earlier one possible (fan-out); a
  // matrix always (a [c] bias or row parameter is an operand of the op that made it only).
  auto pick = [&] {
    const int n = static_cast<int>(values.size());
    for (;;) {
      const int v = uniform(0, 2) == 0 ? uniform(0, n - 1) : uniform(std::max(0, n - 3), n - 1);
      if (shape_of(v).size() == 2) return v;
    }
  };
  const int num_ops = uniform(limits.min_ops, limits.max_ops);
  for (int j = 0; j < num_ops; ++j) {
    Op o;
    o.kind = static_cast<OpKind>(uniform(0, static_cast<int>(OpKind::kCount) - 1));
    o.stream = uniform(0, p.num_streams - 1);
    o.a = pick();
    const Shape sa = shape_of(o.a);
    o.shape = sa;
    switch (o.kind) {
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul: {
        std::vector<int> same;
        for (int v = 0; v < static_cast<int>(values.size()); ++v) {
          if (shape_of(v) == sa) same.push_back(v);
        }
        o.b = same[static_cast<std::size_t>(uniform(0, static_cast<int>(same.size()) - 1))];
        break;
      }
      case OpKind::kAddRow:
        o.b = new_leaf({sa[1]});
        break;
      case OpKind::kScale:
        o.scalar = std::uniform_real_distribution<double>(-1.5, 1.5)(rng);
        break;
      case OpKind::kLinear: {
        const std::int64_t out = dim();
        o.act = static_cast<Activation>(uniform(0, 2));
        o.weight = new_leaf({out, sa[1]});
        if (uniform(0, 3) != 0) o.bias = new_leaf({out});
        o.shape = {sa[0], out};
        break;
      }
      case OpKind::kMatmul: {
        const std::int64_t out = dim();
        o.weight = new_leaf({sa[1], out});
        o.shape = {sa[0], out};
        break;
      }
      case OpKind::kLayerNorm:
        o.weight = new_leaf({sa[1]});
        o.bias = new_leaf({sa[1]});
        break;
      case OpKind::kTranspose:
        o.shape = {sa[1], sa[0]};
        break;
      case OpKind::kNarrow:
        o.length = uniform(1, static_cast<int>(sa[1]));
        o.start = uniform(0, static_cast<int>(sa[1] - o.length));
        o.shape = {sa[0], o.length};
        break;
      case OpKind::kConcat: {
        std::vector<int> same_rows;
        for (int v = 0; v < static_cast<int>(values.size()); ++v) {
          const Shape sv = shape_of(v);
          if (sv.size() == 2 && sv[0] == sa[0]) same_rows.push_back(v);
        }
        o.b = same_rows[static_cast<std::size_t>(uniform(0, static_cast<int>(same_rows.size()) - 1))];
        o.shape = {sa[0], sa[1] + shape_of(o.b)[1]};
        break;
      }
      default:
        break;
    }
    p.ops.push_back(o);
    values.push_back({false, static_cast<int>(p.ops.size()) - 1});
  }
  // Renumber: leaves first, then ops in order.
  const int num_leaves = static_cast<int>(p.leaves.size());
  std::vector<int> id(values.size());
  for (std::size_t v = 0; v < values.size(); ++v) {
    id[v] = values[v].is_leaf ? values[v].index : num_leaves + values[v].index;
  }
  auto remap = [&](int& v) {
    if (v >= 0) v = id[static_cast<std::size_t>(v)];
  };
  for (Op& o : p.ops) {
    remap(o.a);
    remap(o.b);
    remap(o.weight);
    remap(o.bias);
  }
  // Roots: one to three late values (the last op's among them), distinct.
  const int num_roots = uniform(1, 3);
  p.roots.push_back(num_leaves + num_ops - 1);
  for (int r = 1; r < num_roots; ++r) {
    const int v = num_leaves + uniform(std::max(0, num_ops - 5), num_ops - 1);
    if (std::find(p.roots.begin(), p.roots.end(), v) == p.roots.end()) p.roots.push_back(v);
  }
  for (std::size_t r = 0; r < p.roots.size(); ++r) p.root_kind.push_back(uniform(0, 2));
  return p;
}

// The number of programs a test runs: GW_FUZZ_PROGRAMS when set, else `fallback`; the first seed:
// GW_FUZZ_SEED when set, else 1 (a failure names its seed: GW_FUZZ_SEED=<seed> GW_FUZZ_PROGRAMS=1
// runs that program alone).
inline int programs_to_run(int fallback) {
  const char* env = std::getenv("GW_FUZZ_PROGRAMS");
  return env ? std::max(0, std::atoi(env)) : fallback;
}
inline std::uint64_t first_seed() {
  const char* env = std::getenv("GW_FUZZ_SEED");
  return env ? std::strtoull(env, nullptr, 10) : 1;
}

// How a program's backward runs.
enum class RunMode {
  kEagerOneStream,  // every op on the caller's stream, backward() of all roots
  kEagerStreams,    // each op on its own stream (CUDA), backward() of all roots on those streams
                    // (EagerStreams::kForward)
  kEagerAuto,       // each op on its own stream, backward() as shipped (EagerStreams::kAuto:
                    // a short backward moves onto the caller's stream)
  kReplayed,        // each op on its stream; the backward of the roots' sum replayed from a
                    // BackwardGraph (the third of three identical steps: eager, capture, replay)
};

struct Outcome {
  std::vector<double> roots;               // each root's value
  std::vector<std::vector<double>> grads;  // per leaf (empty: the leaf got no gradient)
  std::uint64_t captures = 0, replays = 0;  // kReplayed: the BackwardGraph's counters
};

namespace detail {
inline std::vector<double> as_doubles(const Tensor& t) {
  const Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  if (c.dtype() == DType::kFloat64) return c.to_vector<double>();
  const Tensor f = c.dtype() == DType::kFloat32 ? c : cast(c, DType::kFloat32);
  const std::vector<float> v = f.to_vector<float>();
  return {v.begin(), v.end()};
}

// The forward of `p` on `leaves`; returns the roots (op j on streams[op.stream] when given).
inline std::vector<Tensor> forward(const Program& p, const std::vector<Tensor>& leaves,
                                   std::vector<Stream>* streams, Device device, DType dtype) {
  std::vector<Tensor> v(leaves.begin(), leaves.end());
  for (const Op& o : p.ops) {
    std::optional<StreamGuard> guard;
    if (streams) guard.emplace(streams->at(static_cast<std::size_t>(o.stream)));
    const Tensor& a = v[static_cast<std::size_t>(o.a)];
    const Tensor b = o.b >= 0 ? v[static_cast<std::size_t>(o.b)] : Tensor();
    const Tensor w = o.weight >= 0 ? v[static_cast<std::size_t>(o.weight)] : Tensor();
    const Tensor bias = o.bias >= 0 ? v[static_cast<std::size_t>(o.bias)] : Tensor();
    Tensor y;
    switch (o.kind) {
      case OpKind::kAdd: y = add(a, b); break;
      case OpKind::kSub: y = sub(a, b); break;
      case OpKind::kMul: y = mul(a, b); break;
      case OpKind::kAddRow: y = add(a, b); break;
      case OpKind::kScale: y = mul(a, o.scalar); break;
      case OpKind::kRelu: y = relu(a); break;
      case OpKind::kTanh: y = tanh(a); break;
      case OpKind::kSigmoid: y = sigmoid(a); break;
      case OpKind::kGelu: y = gelu(a); break;
      case OpKind::kLinear: y = linear(a, w, bias, o.act); break;
      case OpKind::kMatmul: y = matmul(a, w); break;
      case OpKind::kSoftmax: y = softmax(a); break;
      // eps 0.01: rows of near-equal values (sigmoids, a transposed layer_norm) would otherwise
      // scale rounding by up to 1/sqrt(1e-5), and float32 would not be comparable with float64.
      case OpKind::kLayerNorm: y = layer_norm(a, w, bias, 1e-2); break;
      case OpKind::kTranspose: y = transpose(a, 0, 1); break;
      case OpKind::kConcat: y = concat({a, b}, 1); break;
      case OpKind::kLogSoftmax: y = log_softmax(a); break;
      case OpKind::kNarrow: y = narrow(a, o.start, o.length); break;
      case OpKind::kCount: break;
    }
    v.push_back(std::move(y));
  }
  std::vector<Tensor> roots;
  for (std::size_t r = 0; r < p.roots.size(); ++r) {
    const Tensor& x = v[static_cast<std::size_t>(p.roots[r])];
    const Tensor fixed = cast(randn(x.shape(), 1000 + r), dtype).to(device);  // not a leaf
    switch (p.root_kind[r]) {
      case 0: roots.push_back(sum(mul(x, fixed))); break;
      case 1: roots.push_back(mean(mul(x, fixed))); break;
      default: roots.push_back(mse_loss(x, fixed));
    }
  }
  return roots;
}
}  // namespace detail

// Runs `p` on `device` in `dtype` (float32, or float64 on the CPU). The leaves are the same values
// on every device and dtype: float32 draws (randn, seed per leaf), scaled by 0.5, converted.
inline Outcome run(const Program& p, Device device, DType dtype, RunMode mode) {
  std::vector<Tensor> leaves;
  for (std::size_t i = 0; i < p.leaves.size(); ++i) {
    const Tensor drawn = mul(randn(p.leaves[i], p.seed * 131 + i), 0.5);
    leaves.push_back(cast(drawn, dtype).to(device).set_requires_grad(true));
  }
  std::vector<Stream> streams;
  const bool on_streams = device.is_cuda() && mode != RunMode::kEagerOneStream;
  if (on_streams) {
    for (int s = 0; s < p.num_streams; ++s) streams.emplace_back(device);
  }
  Outcome out;
  std::vector<Tensor> roots;
  if (mode == RunMode::kReplayed) {
    BackwardGraph bw(device);
    for (int step = 0; step < 3; ++step) {  // eager warm-up, capture, replay: the same values
      roots = detail::forward(p, leaves, on_streams ? &streams : nullptr, device, dtype);
      Tensor loss = roots[0];
      for (std::size_t r = 1; r < roots.size(); ++r) loss = add(loss, roots[r]);
      bw.backward(loss, GradWrite::kOverwrite);
    }
    out.captures = bw.stats().counters.captures;
    out.replays = bw.stats().counters.replays;
  } else {
    roots = detail::forward(p, leaves, on_streams ? &streams : nullptr, device, dtype);
    backward(
        roots, {},
        {.streams = mode == RunMode::kEagerStreams ? EagerStreams::kForward : EagerStreams::kAuto});
  }
  for (const Tensor& r : roots) out.roots.push_back(detail::as_doubles(r)[0]);
  for (const Tensor& l : leaves) {
    out.grads.push_back(l.grad().defined() ? detail::as_doubles(l.grad()) : std::vector<double>{});
  }
  return out;
}

// The program's tape as nodes on fake streams (nothing runs; planning makes no CUDA call): a
// node per op on stream handle fake_stream(op.stream), reading its operands and parameters
// (leaves that require grad), and a root node per root on `caller`. For the plan's checks.
inline cudaStream_t fake_stream(int id) {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(id + 1) * 0x1000);
}
inline std::vector<PlanRoot> tape_on_fake_streams(const Program& p, cudaStream_t caller) {
  constexpr Device kDev = Device::cuda(0);
  std::vector<Tensor> leaves;
  for (const Shape& s : p.leaves) leaves.push_back(zeros(s).set_requires_grad(true));
  std::vector<std::shared_ptr<Node>> nodes;
  auto input = [&](int v) {
    if (v < static_cast<int>(leaves.size())) {
      const Tensor& l = leaves[static_cast<std::size_t>(v)];
      return InputMeta{l.shape(), DType::kFloat32, kDev, nullptr, {nullptr, l}};
    }
    const std::shared_ptr<Node>& n = nodes[static_cast<std::size_t>(v) - leaves.size()];
    return InputMeta{n->output_shape(), DType::kFloat32, kDev, n->stream(), {n, Tensor()}};
  };
  for (const Op& o : p.ops) {
    std::vector<InputMeta> in{input(o.a)};
    for (int v : {o.b, o.weight, o.bias}) {
      if (v >= 0) in.push_back(input(v));
    }
    nodes.push_back(make_node(op_name(o.kind), kDev, fake_stream(o.stream), std::move(in), o.shape));
  }
  std::vector<PlanRoot> roots;
  for (int r : p.roots) roots.push_back({make_node("root", kDev, caller, {input(r)}, {}), Tensor()});
  return roots;
}

// The largest relative difference, ‖a − b‖ / max(‖b‖, floor), over the roots and every leaf's
// gradient; `what` names the worst (or one defined in one run only). `floor` keeps gradients
// that are zero in exact arithmetic (a sum of layer_norm's outputs, a − a) from turning float32
// rounding into a large relative error: a bug shows as an error of the gradients' own size.
inline double max_difference(const Outcome& a, const Outcome& b, std::string* what,
                             double floor = 1e-2) {
  auto diff = [&](const std::vector<double>& x, const std::vector<double>& y) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += y[i] * y[i];
    }
    return std::sqrt(num) / std::max(std::sqrt(den), floor);
  };
  double worst = diff(a.roots, b.roots);
  if (what) *what = "roots";
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    if (a.grads[i].size() != b.grads[i].size()) {
      if (what) *what = "leaf " + std::to_string(i) + " has a gradient in one run only";
      return 1e30;
    }
    const double d = diff(a.grads[i], b.grads[i]);
    if (d > worst) {
      worst = d;
      if (what) *what = "leaf " + std::to_string(i) + "'s gradient";
    }
  }
  return worst;
}

}  // namespace graphward::fuzz
