// The fused LSTM and GRU cells and the LSTM layer on CUDA against the CPU reference: output and
// every input's gradient (through the tape, written and then accumulated by a second backward),
// with and without biases, with x a matrix or the output of a layer below, at widths that are not
// multiples of 32. New memory is poisoned with NaN, so an element a kernel forgot to write fails
// the comparison.
// Tolerance (‖out − ref‖ / ‖ref‖, float32, TF32 off): 1e-4, the GEMMs'.
#include <cmath>

#include "graphward/engine/ops/rnn.h"
#include "test_util.h"

namespace graphward {
namespace {
using testing::rel_error;
using testing::values;

constexpr Device kGpu = Device::cuda(0);

class CudaRnn : public testing::PoisonedCudaTest {};

struct Leaves {
  std::vector<Tensor> all;  // x, state, W_ih, W_hh, then the biases where there are
};

Leaves leaves_on(const std::vector<Tensor>& values_cpu, Device device) {
  Leaves l;
  for (const Tensor& v : values_cpu) {
    l.all.push_back(v.defined() ? v.to(device).detach().set_requires_grad(true) : Tensor());
  }
  return l;
}

// The cell's output and sum(out · r): its gradient is r, a gradient with no symmetry to hide an
// element written to the wrong place.
Tensor cell_loss(const Leaves& l, const Tensor& r, Tensor* out, bool gru = false) {
  *out = gru ? fused_gru_cell(l.all[0], l.all[1], l.all[2], l.all[3], l.all[4], l.all[5])
             : fused_lstm_cell(l.all[0], l.all[1], l.all[2], l.all[3], l.all[4], l.all[5]);
  return sum(mul(*out, r));
}

TEST_F(CudaRnn, TheFusedLstmCellMatchesTheCpuForwardAndBackward) {
  const std::int64_t B = 7, in = 9, H = 33;
  std::uint64_t seed = 500;
  for (bool packed : {false, true}) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(std::string(packed ? "x a state" : "x a matrix") +
                   (bias ? ", biases" : ", no biases"));
      auto r = [&](const Shape& s) { return mul(randn(s, seed++), 0.3); };
      const std::vector<Tensor> init{packed ? r({2, B, in}) : r({B, in}),
                                     r({2, B, H}),
                                     r({4 * H, in}),
                                     r({4 * H, H}),
                                     bias ? r({4 * H}) : Tensor(),
                                     bias ? r({4 * H}) : Tensor()};
      const Tensor weight = randn({2, B, H}, seed++);
      const Leaves cpu = leaves_on(init, Device::cpu()), gpu = leaves_on(init, kGpu);
      Tensor out_cpu, out_gpu;
      backward(cell_loss(cpu, weight, &out_cpu));
      backward(cell_loss(gpu, weight.to(kGpu), &out_gpu));
      EXPECT_LT(rel_error(out_gpu.to(Device::cpu()), out_cpu), 1e-4);
      for (int pass = 0; pass < 2; ++pass) {  // written, then accumulated
        for (std::size_t i = 0; i < init.size(); ++i) {
          if (!init[i].defined()) continue;
          SCOPED_TRACE("pass " + std::to_string(pass) + ", leaf " + std::to_string(i));
          EXPECT_LT(rel_error(gpu.all[i].grad().to(Device::cpu()), cpu.all[i].grad()), 1e-4);
        }
        if (pass == 0) {
          backward(cell_loss(cpu, weight, &out_cpu));
          backward(cell_loss(gpu, weight.to(kGpu), &out_gpu));
        }
      }
      if (packed) {  // the layer below's c has no gradient from this cell: zeros, not poison
        const std::vector<double> g = values(gpu.all[0].grad().to(Device::cpu()));
        for (std::size_t j = static_cast<std::size_t>(B * in); j < g.size(); ++j) {
          ASSERT_EQ(g[j], 0.0) << "element " << j;
        }
      }
    }
  }
}

TEST_F(CudaRnn, TheFusedLstmLayerMatchesTheCpuForwardAndBackward) {
  const std::int64_t T = 5, B = 7, in = 9, H = 33;
  std::uint64_t seed = 700;
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "x a layer's output" : "x a matrix");
    auto r = [&](const Shape& s) { return mul(randn(s, seed++), 0.3); };
    const std::vector<Tensor> init{packed ? r({2, T * B, in}) : r({T * B, in}),
                                   r({2, B, H}),
                                   r({4 * H, in}),
                                   r({4 * H, H}),
                                   r({4 * H}),
                                   r({4 * H})};
    const Tensor weight = randn({2, T * B, H}, seed++);
    const Leaves cpu = leaves_on(init, Device::cpu()), gpu = leaves_on(init, kGpu);
    auto loss = [&](const Leaves& l, const Tensor& w) {
      return sum(
          mul(fused_lstm_layer(l.all[0], l.all[1], l.all[2], l.all[3], l.all[4], l.all[5]), w));
    };
    for (int pass = 0; pass < 2; ++pass) {  // written, then accumulated
      const Tensor lc = loss(cpu, weight), lg = loss(gpu, weight.to(kGpu));
      EXPECT_NEAR(lg.item(), lc.item(), 1e-4 * (1 + std::abs(lc.item())));
      backward(lc);
      backward(lg);
      for (std::size_t i = 0; i < init.size(); ++i) {
        SCOPED_TRACE("pass " + std::to_string(pass) + ", leaf " + std::to_string(i));
        EXPECT_LT(rel_error(gpu.all[i].grad().to(Device::cpu()), cpu.all[i].grad()), 1e-4);
      }
    }
  }
}

TEST_F(CudaRnn, TheFusedGruCellMatchesTheCpuForwardAndBackward) {
  const std::int64_t B = 7, in = 9, H = 33;
  std::uint64_t seed = 900;
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "biases" : "no biases");
    auto r = [&](const Shape& s) { return mul(randn(s, seed++), 0.3); };
    const std::vector<Tensor> init{r({B, in}),
                                   r({B, H}),
                                   r({3 * H, in}),
                                   r({3 * H, H}),
                                   bias ? r({3 * H}) : Tensor(),
                                   bias ? r({3 * H}) : Tensor()};
    const Tensor weight = randn({B, H}, seed++);
    const Leaves cpu = leaves_on(init, Device::cpu()), gpu = leaves_on(init, kGpu);
    Tensor out_cpu, out_gpu;
    for (int pass = 0; pass < 2; ++pass) {  // written, then accumulated
      backward(cell_loss(cpu, weight, &out_cpu, true));
      backward(cell_loss(gpu, weight.to(kGpu), &out_gpu, true));
      EXPECT_LT(rel_error(out_gpu.to(Device::cpu()), out_cpu), 1e-4);
      for (std::size_t i = 0; i < init.size(); ++i) {
        if (!init[i].defined()) continue;
        SCOPED_TRACE("pass " + std::to_string(pass) + ", leaf " + std::to_string(i));
        EXPECT_LT(rel_error(gpu.all[i].grad().to(Device::cpu()), cpu.all[i].grad()), 1e-4);
      }
    }
  }
}

}  // namespace
}  // namespace graphward
