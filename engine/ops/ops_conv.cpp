// conv2d, max_pool2d and avg_pool2d: cuDNN on CUDA (engine/runtime/dnn.h), the references on the CPU
// (kernels/conv.h).
#include <initializer_list>

#include "graphward/engine/ops/autocast.h"
#include "graphward/engine/ops/ops_common.h"
#include "graphward/engine/runtime/blas.h"
#include "graphward/engine/runtime/dnn.h"
#include "graphward/engine/runtime/nvtx.h"
#include "graphward/engine/tape/autograd.h"
#include "graphward/kernels/conv.h"
#include "graphward/kernels/elementwise.h"
#include "graphward/kernels/shape.h"

namespace graphward {
using namespace ops_detail;
using autograd_detail::needs_grad;
using autograd_detail::record;
using autograd_detail::save;
namespace k = kernels;

namespace {
void check_cudnn(const char* op, const Tensor& x) {
  (void)op;
  (void)x;
#if !GRAPHWARD_HAS_CUDNN
  GW_CHECK(!x.is_cuda(), op,
           ": graphward was built without cuDNN, which CUDA convolution and "
           "pooling use; expected a CPU tensor (or a build that finds cuDNN)");
#endif
}

// Note [Checked sizes] (base/dtype.h): every size, stride and padding of a convolution or a
// pooling, and its output's, is below 2^31 — cuDNN's int parameters, and small enough that no
// size arithmetic here can overflow int64 — on both backends alike.
constexpr std::int64_t kMaxGeom = (std::int64_t{1} << 31) - 1;
void check_geom(const char* op, std::initializer_list<std::int64_t> sizes) {
  for (std::int64_t v : sizes) {
    GW_CHECK(v >= 1 && v <= kMaxGeom, op, ": a size of ", v,
             " in the input, the kernel or the output; expected sizes from 1 to 2^31 - 1");
  }
}

k::ConvGeom check_conv(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Conv2dOptions& o) {
  if (bias.defined()) {
    check_inputs(op, {{"x", &x}, {"weight", &weight}, {"bias", &bias}}, Bf16::kEverywhere);
  } else {
    check_inputs(op, {{"x", &x}, {"weight", &weight}}, Bf16::kEverywhere);
  }
  check_dim(op, {"x", &x}, 4);
  check_dim(op, {"weight", &weight}, 4);
  check_cudnn(op, x);
  GW_CHECK(o.activation == Activation::kNone || o.activation == Activation::kRelu, op,
           ": options.activation is ", o.activation == Activation::kGelu ? "kGelu" : "out of range",
           "; expected Activation::kNone or Activation::kRelu (the activations a convolution "
           "applies)");
  GW_CHECK(o.stride >= 1 && o.padding >= 0 && o.stride <= kMaxGeom && o.padding <= kMaxGeom, op,
           ": stride ", o.stride, " and padding ", o.padding,
           "; expected 1 <= stride and 0 <= padding, both below 2^31");
  // Channels last: x [N, H, W, C], weight [K, R, S, C].
  const bool cl = o.channels_last;
  const k::ConvGeom g{.n = x.size(0),
                      .c = x.size(cl ? 3 : 1),
                      .h = x.size(cl ? 1 : 2),
                      .w = x.size(cl ? 2 : 3),
                      .k = weight.size(0),
                      .r = weight.size(cl ? 1 : 2),
                      .s = weight.size(cl ? 2 : 3),
                      .pad = o.padding,
                      .stride = o.stride,
                      .deterministic = o.deterministic,
                      .bf16 = x.dtype() == DType::kBFloat16,
                      .nhwc = cl};
  GW_CHECK(weight.size(cl ? 3 : 1) == g.c, op, ": x ", shape_str(x.shape()), " has ", g.c,
           " channels and weight is ", shape_str(weight.shape()),
           cl ? "; expected weight [K, R, S, C] with C == x.shape[3] (channels last)"
              : "; expected weight [K, C, R, S] with C == x.shape[1]");
  check_geom(op, {g.n, g.c, g.h, g.w, g.k, g.r, g.s});
  GW_CHECK(g.h + 2 * g.pad >= g.r && g.w + 2 * g.pad >= g.s, op, ": the ", g.r, "x", g.s,
           " kernel does not fit the padded ", g.h, "x", g.w, " input (padding ", g.pad,
           "); expected a kernel no larger than the padded input");
  check_geom(op, {g.out_h(), g.out_w()});
  if (bias.defined()) {
    GW_CHECK(bias.shape() == Shape({g.k}), op, ": bias is ", shape_str(bias.shape()),
             "; expected [", g.k, "] (one per filter)");
  }
  return g;
}
// Note [A few-tap convolution as GEMMs]: a convolution with few taps a filter (C·R·S ≤ 32: a
// first convolution on images) is work cuDNN's algorithms run off the tensor cores: its
// channels-last bfloat16 weight gradient for 3 channels ran 1041 µs of a 2277 µs step, its
// forward 82 µs (docs/DECISIONS.md, "a channels-last convnet in bfloat16"). NCHW: the weight
// gradient by our own kernel (kernels::conv2d_weight_grad_small). Channels last in bfloat16:
// the input's patches as rows (kernels::conv2d_patches_nhwc, each row padded with zeros to a
// multiple of 8 for the tensor cores), then the forward is y = patches·Wᵀ, one cuBLASLt GEMM
// with the bias and ReLU in its epilogue (W's rows padded alike), and the weight gradient
// dW = dYᵀ·patches, one GEMM whose patches carry a column of ones after the taps, so that the
// product's column there is the bias gradient (cuBLASLt's bias-gradient epilogue ran as a kernel
// of its own after its split-K GEMM: docs/DECISIONS.md), the padding's columns dropped. The
// patches (made again in the backward, not saved) take at most 256 MiB.
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
std::int64_t patches_ld(const k::ConvGeom& g) {
  return (g.c * g.r * g.s + 7) / 8 * 8;
}
// The weight gradient's patches: a column of ones after the taps (the bias gradient's).
std::int64_t patches_ld_with_ones(const k::ConvGeom& g) {
  return (g.c * g.r * g.s + 1 + 7) / 8 * 8;
}
bool patches_fit(const k::ConvGeom& g) {
  const std::int64_t bytes = g.n * g.out_h() * g.out_w() * patches_ld_with_ones(g) * 2;
  return g.bf16 && g.nhwc && g.c * g.r * g.s <= 32 && bytes <= (std::int64_t{256} << 20);
}
// y = act(patches(x)·Wᵀ + bias) (Note [A few-tap convolution as GEMMs]); bias may be undefined.
void patches_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const k::ConvGeom& g, bool relu, const Tensor& y, cudaStream_t s) {
  const std::int64_t ld = patches_ld(g), rows = g.n * g.out_h() * g.out_w();
  const TensorOptions opt{x.dtype(), x.device()};
  const Tensor cols = Tensor::empty({rows, ld}, opt), w = Tensor::empty({g.k, ld}, opt);
  const bf16* b = bias.defined() ? ptr<bf16>(bias) : nullptr;
  k::conv2d_patches_nhwc(ptr<bf16>(cols), ptr<bf16>(x), g, ld, s);
  k::conv2d_pad_filters(ptr<bf16>(w), ptr<bf16>(weight), g, ld, s);
  using E = k::Epilogue;
  const E epilogue = relu ? (b ? E::kBiasRelu : E::kRelu) : (b ? E::kBias : E::kNone);
  if (epilogue == E::kNone ||
      !graphward::gemm_epilogue(x.device(), s, false, true, rows, g.k, ld, ptr<bf16>(cols),
                                ptr<bf16>(w), ptr<bf16>(y), epilogue, b)) {
    graphward::gemm(x.device(), s, false, true, rows, g.k, ld, 1.f, ptr<bf16>(cols),
                    ptr<bf16>(w), 0.f, ptr<bf16>(y));
    if (b || relu) k::conv2d_bias_act(ptr<bf16>(y), b, g, relu, s);
  }
}
#endif
Shape conv_out(const k::ConvGeom& g) {
  if (g.nhwc) return {g.n, g.out_h(), g.out_w(), g.k};
  return {g.n, g.k, g.out_h(), g.out_w()};
}
}  // namespace

namespace {
// A conv2d_relu node's backward: dz = grad_out where the output y is positive (relu_backward),
// then the convolution's backward of dz.
void conv2d_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                          const Tensor& y, Conv2dOptions options, GradSlot grad_x,
                          GradSlot grad_weight, GradSlot grad_bias) {
  const char* op = "conv2d_relu_backward";
  options.activation = Activation::kNone;
  const k::ConvGeom g = check_conv(op, x, weight, Tensor(), options);
  check_inputs(op, {{"grad_out", &grad_out}, {"output", &y}, {"x", &x}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == conv_out(g) && y.shape() == conv_out(g), op, ": grad_out ",
           shape_str(grad_out.shape()), " and output ", shape_str(y.shape()),
           "; expected both the output's shape ", shape_str(conv_out(g)));
  Tensor dz;
  relu_backward(grad_out, y, {&dz});
  conv2d_backward(dz, x, weight, options, grad_x, grad_weight, grad_bias);
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options) {
  if (Tensor x16 = x, w16 = weight, b16 = bias;
      autocast_matrix_operands({&x16, &w16, &b16})) {  // Note [Autocast]
    return conv2d(x16, w16, b16, options);
  }
  const bool relu = options.activation == Activation::kRelu;
  const char* op = relu ? "conv2d_relu" : "conv2d";
  detail::NvtxRange range(op);
  const k::ConvGeom g = check_conv(op, x, weight, bias, options);
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
    CudaScope scope(x.device());
    if (bias.defined()) {
      scope.read({&x, &weight, &bias});
    } else {
      scope.read({&x, &weight});
    }
    y = new_output(conv_out(g), x);
    const void* b = bias.defined() ? bias.raw_data() : nullptr;
    if (patches_fit(g)) {  // the bias and ReLU in the GEMM's epilogue
      patches_forward(x, weight, bias, g, relu, y, scope.stream());
    } else {
      dnn::conv2d_forward(x.device(), scope.stream(), g, y.raw_data(), x.raw_data(),
                          weight.raw_data(), relu ? nullptr : b);
      if (relu) {
        dispatch_cuda(x.dtype(), [&]<class T>() {
          k::conv2d_bias_act(ptr<T>(y), static_cast<const T*>(b), g, /*relu=*/true,
                             scope.stream());
        });
      }
    }
#endif
  } else {
    y = new_output(conv_out(g), x);
    dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
      T* out = d.out(y);
      k::cpu::conv2d_forward<T>(out, d.in(x), d.in(weight), bias.defined() ? d.in(bias) : nullptr,
                                g);
      if (relu) k::cpu::relu_forward<T>(out, out, y.numel());
    });
  }
  if (needs_grad({&x, &weight, &bias})) {
    auto backward = [options](const Tensor& gr, const std::vector<Tensor>& s,
                              std::span<GradSlot> grads) {
      const GradSlot gb = grads.size() > 2 ? grads[2] : GradSlot{};
      if (options.activation == Activation::kRelu) {
        conv2d_relu_backward(gr, s[0], s[1], s[2], options, grads[0], grads[1], gb);
      } else {
        conv2d_backward(gr, s[0], s[1], options, grads[0], grads[1], gb);
      }
    };
    std::vector<SavedTensor> saved{save("x", x), save("weight", weight)};
    if (relu) saved.push_back(save("output", y));
    // Note [Node attributes]: what the backward's convolutions are made of besides the shapes.
    const std::initializer_list<NodeAttribute> attributes{
        NodeAttribute::integer(options.stride), NodeAttribute::integer(options.padding),
        NodeAttribute::integer(options.deterministic),
        NodeAttribute::integer(static_cast<std::int64_t>(options.activation)),
        NodeAttribute::integer(options.channels_last)};
    if (bias.defined()) {
      record(op, y, {&x, &weight, &bias}, std::move(saved), backward, attributes);
    } else {
      record(op, y, {&x, &weight}, std::move(saved), backward, attributes);
    }
    // Per output element, a multiply-add per weight of its output channel; two products back.
    Node& node = *y.grad_fn();
    node.set_backward_flops(4.0 * static_cast<double>(y.numel()) *
                            static_cast<double>(weight.numel() / weight.size(0)));
    // Note [Backward epilogue fusion] (engine/ops/ops.h): a conv2d_relu whose output feeds one pooling
    // alone leaves its ReLU's backward to the pooling's (one kernel fewer per layer).
    if (relu) {
      node.set_activation_fusion(
          {.act = Activation::kRelu,
           .act_input_saved = 2,
           .from_preactivation = [options](const Tensor& gr, const std::vector<Tensor>& s,
                                           std::span<GradSlot> grads) {
             Conv2dOptions plain = options;
             plain.activation = Activation::kNone;
             conv2d_backward(gr, s[0], s[1], plain, grads[0], grads[1],
                             grads.size() > 2 ? grads[2] : GradSlot{});
           }});
    }
  }
  return y;
}

void conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                     Conv2dOptions options, GradSlot grad_x, GradSlot grad_weight,
                     GradSlot grad_bias) {
  const char* op = "conv2d_backward";
  GW_CHECK(options.activation == Activation::kNone, op, ": options.activation is set; expected ",
           "Activation::kNone (this is the convolution's own backward: apply the activation's ",
           "backward to grad_out first)");
  const k::ConvGeom g = check_conv(op, x, weight, Tensor(), options);
  check_inputs(op, {{"grad_out", &grad_out}, {"x", &x}}, Bf16::kEverywhere);
  GW_CHECK(grad_out.shape() == conv_out(g), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ", shape_str(conv_out(g)));
  const bool want_x = check_slot(op, "grad_x", grad_x, x);
  bool want_w = check_slot(op, "grad_weight", grad_weight, weight);
  bool want_b = check_slot(op, "grad_bias", grad_bias, {g.k}, weight);
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
    CudaScope scope(x.device());
    scope.read({&grad_out, &x, &weight});
    const cudaStream_t s = scope.stream();
    if (want_x) {
      const bool acc = open_slot(grad_x, x, s);
      dnn::conv2d_backward_data(x.device(), s, g, grad_x.tensor->raw_data(), grad_out.raw_data(),
                                weight.raw_data(), acc);
    }
    if (want_w && patches_fit(g)) {
      // Note [A few-tap convolution as GEMMs]: dW = dYᵀ·patches, one GEMM, the patches' column
      // of ones after the taps giving the bias gradient as its column.
      const std::int64_t ld = patches_ld_with_ones(g);
      const std::int64_t rows = g.n * g.out_h() * g.out_w();
      const TensorOptions opt{x.dtype(), x.device()};
      const Tensor cols = Tensor::empty({rows, ld}, opt), dw = Tensor::empty({g.k, ld}, opt);
      const bool acc_w = open_slot(grad_weight, weight, s);
      const bool acc_b = want_b && open_slot(grad_bias, {g.k}, weight, s);
      dispatch_cuda(x.dtype(), [&]<class T>() {
        k::conv2d_patches_nhwc<T>(ptr<T>(cols), ptr<T>(x), g, ld, s, /*ones=*/want_b);
        graphward::gemm(x.device(), s, true, false, g.k, ld, rows, 1.f, ptr<T>(grad_out),
                        ptr<T>(cols), 0.f, ptr<T>(dw));
        k::conv2d_split_patch_grads(ptr<T>(*grad_weight.tensor), acc_w,
                                    want_b ? ptr<T>(*grad_bias.tensor) : nullptr, acc_b,
                                    ptr<T>(dw), g, ld, s);
      });
      want_w = want_b = false;
    }
    if (want_w && k::conv2d_weight_grad_small_fits(g)) {
      // Few taps a filter (a first convolution on images): the weight and bias gradients by our
      // own kernels (kernels/conv.h says why).
      const bool acc_w = open_slot(grad_weight, weight, s);
      const bool acc_b = want_b && open_slot(grad_bias, {g.k}, weight, s);
      const std::int64_t ws = k::conv2d_weight_grad_small_workspace(g);
      const Tensor partial = ws > 0 ? Tensor::empty({ws}, {DType::kFloat32, x.device()}) : Tensor();
      dispatch_cuda(x.dtype(), [&]<class T>() {
        k::conv2d_weight_grad_small<T>(ptr<T>(*grad_weight.tensor), acc_w,
                                       want_b ? ptr<T>(*grad_bias.tensor) : nullptr, acc_b,
                                       ptr<T>(grad_out), ptr<T>(x), g,
                                       ws > 0 ? partial.data<float>() : nullptr, s);
      });
      want_w = want_b = false;
    }
    if (want_w) {
      const bool acc = open_slot(grad_weight, weight, s);
      dnn::conv2d_backward_filter(x.device(), s, g, grad_weight.tensor->raw_data(),
                                  grad_out.raw_data(), x.raw_data(), acc);
    }
    if (want_b) {
      const bool acc = open_slot(grad_bias, {g.k}, weight, s);
      dnn::conv2d_backward_bias(x.device(), s, g, grad_bias.tensor->raw_data(),
                                grad_out.raw_data(), acc);
    }
    return;
#endif
  }
  dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
    if (want_x) {
      const bool acc = open_slot(grad_x, x, nullptr);
      k::cpu::conv2d_backward_data<T>(slot_out(d, grad_x, acc), d.in(grad_out), d.in(weight), g,
                                      acc);
    }
    if (want_w) {
      const bool acc = open_slot(grad_weight, weight, nullptr);
      k::cpu::conv2d_backward_filter<T>(slot_out(d, grad_weight, acc), d.in(grad_out), d.in(x),
                                        g, acc);
    }
    if (want_b) {
      const bool acc = open_slot(grad_bias, {g.k}, weight, nullptr);
      k::cpu::conv2d_backward_bias<T>(slot_out(d, grad_bias, acc), d.in(grad_out), g, acc);
    }
  });
}

// ---- pooling ----------------------------------------------------------------------------------
namespace {
const char* pool_name(k::PoolMode mode, bool backward) {
  if (mode == k::PoolMode::kMax) return backward ? "max_pool2d_backward" : "max_pool2d";
  return backward ? "avg_pool2d_backward" : "avg_pool2d";
}
k::PoolGeom check_pool(const char* op, const Shape& x, const Pool2dOptions& o, DType dtype) {
  GW_CHECK(x.size() == 4, op, ": x has shape ", shape_str(x), "; expected a 4-d tensor ",
           o.channels_last ? "[N, H, W, C] (channels last)" : "[N, C, H, W]");
  const std::int64_t stride = o.stride == 0 ? o.kernel : o.stride;
  GW_CHECK(o.kernel >= 1 && o.kernel <= kMaxGeom && o.stride >= 0 && o.stride <= kMaxGeom &&
               o.padding >= 0 && o.padding <= o.kernel / 2,
           op, ": kernel ", o.kernel, ", stride ", o.stride, ", padding ", o.padding,
           "; expected 1 <= kernel < 2^31, 0 <= stride < 2^31 (0: the kernel) and "
           "0 <= padding <= kernel / 2");
  const bool cl = o.channels_last;
  const k::PoolGeom g{.n = x[0],
                      .c = x[cl ? 3 : 1],
                      .h = x[cl ? 1 : 2],
                      .w = x[cl ? 2 : 3],
                      .window = o.kernel,
                      .pad = o.padding,
                      .stride = stride,
                      .bf16 = dtype == DType::kBFloat16,
                      .nhwc = cl};
  check_geom(op, {g.n, g.c, g.h, g.w});
  GW_CHECK(g.h + 2 * g.pad >= g.window && g.w + 2 * g.pad >= g.window, op, ": the ", g.window, "x",
           g.window, " window does not fit the padded ", g.h, "x", g.w,
           " input; expected a window no larger than the padded input");
  check_geom(op, {g.out_h(), g.out_w()});
  return g;
}
Shape pool_out(const k::PoolGeom& g) {
  if (g.nhwc) return {g.n, g.out_h(), g.out_w(), g.c};
  return {g.n, g.c, g.out_h(), g.out_w()};
}

Tensor pool_forward(k::PoolMode mode, const Tensor& x, const Pool2dOptions& o) {
  const char* op = pool_name(mode, false);
  detail::NvtxRange range(op);
  check_inputs(op, {{"x", &x}}, Bf16::kEverywhere);
  check_cudnn(op, x);
  const k::PoolGeom g = check_pool(op, x.shape(), o, x.dtype());
  Tensor y;
  if (x.is_cuda()) {
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
    CudaScope scope(x.device());
    scope.read({&x});
    y = new_output(pool_out(g), x);
    if (k::pool2d_tiled_nhwc_fits(g)) {  // kernels/conv.h says why
      dispatch_cuda(x.dtype(), [&]<class T>() {
        k::pool2d_forward_tiled_nhwc(mode, ptr<T>(y), ptr<T>(x), g, scope.stream());
      });
    } else {
      dnn::pool2d_forward(x.device(), scope.stream(), mode, g, y.raw_data(), x.raw_data());
    }
#endif
  } else {
    y = new_output(pool_out(g), x);
    dispatch_cpu_data(x.dtype(), [&]<class T>(CpuData<T>& d) {
      k::cpu::pool2d_forward<T>(mode, d.out(y), d.in(x), g);
    });
  }
  return y;
}

// Note [Backward epilogue fusion]: the checks of grad_x's epilogue (before anything is written):
// a plain ReLU (no mask) whose output is the pooling's input — for max pooling x itself; average
// pooling saves no x, so a tensor of its shape, dtype and device.
void check_pool_epilogue(const char* op, const GradEpilogue& ep, const Shape& input_shape,
                         const Tensor& x, const Tensor& grad_out, const GradSlot& grad_x) {
  GW_CHECK(ep.act == Activation::kRelu && !ep.relu_mask.defined(), op,
           ": grad_x's epilogue is not a plain ReLU; expected the ReLU of the convolution whose "
           "output the pooling read");
  const bool is_input = ep.act_input.defined() &&
                        (x.defined() ? ep.act_input.storage() == x.storage() &&
                                           ep.act_input.raw_data() == x.raw_data() &&
                                           ep.act_input.shape() == x.shape()
                                     : ep.act_input.shape() == input_shape) &&
                        ep.act_input.dtype() == grad_out.dtype() &&
                        ep.act_input.device() == grad_out.device();
  GW_CHECK(is_input, op, ": grad_x's epilogue reads ",
           ep.act_input.defined() ? ep.act_input.str() : std::string("an undefined tensor"),
           "; expected the pooling's input (the ReLU's output), ",
           x.defined() ? x.str()
                       : shape_str(input_shape) + " " + dtype_name(grad_out.dtype()) + " on " +
                             grad_out.device().str());
  GW_CHECK(!grad_x.accumulate, op,
           ": grad_x has an epilogue and accumulates; an epilogue writes the sole gradient of "
           "its layer");
}

// The shared backward: max pooling passes x and y, average pooling neither.
void pool_backward(k::PoolMode mode, const Tensor& grad_out, const Shape& input_shape,
                   const Tensor& x, const Tensor& y, const Pool2dOptions& o, GradSlot grad_x) {
  const char* op = pool_name(mode, true);
  if (mode == k::PoolMode::kMax) {
    check_inputs(op, {{"grad_out", &grad_out}, {"x", &x}, {"y", &y}}, Bf16::kEverywhere);
  } else {
    check_inputs(op, {{"grad_out", &grad_out}}, Bf16::kEverywhere);
  }
  check_cudnn(op, grad_out);
  const k::PoolGeom g = check_pool(op, input_shape, o, grad_out.dtype());
  GW_CHECK(grad_out.shape() == pool_out(g), op, ": grad_out has shape ",
           shape_str(grad_out.shape()), "; expected the output's shape ", shape_str(pool_out(g)));
  if (mode == k::PoolMode::kMax) {
    GW_CHECK(x.shape() == input_shape && y.shape() == pool_out(g), op, ": x ", shape_str(x.shape()),
             " and y ", shape_str(y.shape()), "; expected ", shape_str(input_shape), " and ",
             shape_str(pool_out(g)));
  }
  if (!check_slot(op, "grad_x", grad_x, input_shape, grad_out)) return;
  const bool max = mode == k::PoolMode::kMax;
  // Note [Backward epilogue fusion] (engine/ops/ops.h): grad_x is then the pre-activation gradient of
  // the conv2d_relu whose output is the pooling's input: the ReLU's backward, from that output.
  const GradEpilogue* ep = grad_x.epilogue;
  if (ep) check_pool_epilogue(op, *ep, input_shape, x, grad_out, grad_x);
  if (grad_out.is_cuda()) {
#if GRAPHWARD_HAS_CUDA && GRAPHWARD_HAS_CUDNN
    CudaScope scope(grad_out.device());
    if (max) {
      scope.read({&grad_out, &x, &y});
    } else {
      scope.read({&grad_out});
    }
    if (ep && !max) scope.read({&ep->act_input});  // max pooling's is x, read above
    const bool acc = open_slot(grad_x, input_shape, grad_out, scope.stream());
    if (ep) {
      dispatch_cuda(grad_out.dtype(), [&]<class T>() {
        k::pool2d_backward_relu(mode, slot_ptr<T>(grad_x), ptr<T>(grad_out),
                                ptr<T>(ep->act_input), max ? ptr<T>(y) : nullptr, g, acc,
                                scope.stream());
      });
      return;
    }
    dnn::pool2d_backward(grad_out.device(), scope.stream(), mode, g, grad_x.tensor->raw_data(),
                         grad_out.raw_data(), max ? x.raw_data() : nullptr,
                         max ? y.raw_data() : nullptr, acc);
    return;
#endif
  }
  const bool acc = open_slot(grad_x, input_shape, grad_out, nullptr);
  dispatch_cpu_data(grad_out.dtype(), [&]<class T>(CpuData<T>& d) {
    k::cpu::pool2d_backward<T>(mode, slot_out(d, grad_x, acc), d.in(grad_out),
                               max ? d.in(x) : nullptr, max ? d.in(y) : nullptr, g, acc,
                               ep ? d.in(ep->act_input) : nullptr);
  });
}
}  // namespace

Tensor max_pool2d(const Tensor& x, Pool2dOptions options) {
  Tensor y = pool_forward(k::PoolMode::kMax, x, options);
  if (needs_grad({&x})) {
    record("max_pool2d", y, {&x}, {save("x", x), save("output", y)},
           [options](const Tensor& g, const std::vector<Tensor>& s, std::span<GradSlot> grads) {
             max_pool2d_backward(g, s[0], s[1], options, grads[0]);
           },
           {NodeAttribute::integer(options.kernel), NodeAttribute::integer(options.stride),
            NodeAttribute::integer(options.padding),
            NodeAttribute::integer(options.channels_last)});
    // Note [Backward epilogue fusion]: takes the ReLU of a conv2d_relu before it.
    y.grad_fn()->set_takes_input_epilogue();
  }
  return y;
}

void max_pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& y,
                         Pool2dOptions options, GradSlot grad_x) {
  pool_backward(k::PoolMode::kMax, grad_out, x.defined() ? x.shape() : Shape{}, x, y, options,
                grad_x);
}

Tensor avg_pool2d(const Tensor& x, Pool2dOptions options) {
  Tensor y = pool_forward(k::PoolMode::kAverage, x, options);
  if (needs_grad({&x})) {
    const Shape in_shape = x.shape();
    record("avg_pool2d", y, {&x}, {},
           [in_shape, options](const Tensor& g, const std::vector<Tensor>&,
                               std::span<GradSlot> grads) {
             avg_pool2d_backward(g, in_shape, options, grads[0]);
           },
           {NodeAttribute::integer(options.kernel), NodeAttribute::integer(options.stride),
            NodeAttribute::integer(options.padding),
            NodeAttribute::integer(options.channels_last)});
    // Note [Backward epilogue fusion]: takes the ReLU of a conv2d_relu before it.
    y.grad_fn()->set_takes_input_epilogue();
  }
  return y;
}

void avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, Pool2dOptions options,
                         GradSlot grad_x) {
  pool_backward(k::PoolMode::kAverage, grad_out, input_shape, Tensor(), Tensor(), options, grad_x);
}

}  // namespace graphward
