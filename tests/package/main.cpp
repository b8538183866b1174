// The README's training loop, as a consumer of the package: exits non-zero unless it trains.
#include <cstdio>

#include <graphward/graphward.h>
namespace gw = graphward;

int main() {
  const gw::Device dev = gw::cuda_available() ? gw::Device::cuda(0) : gw::Device::cpu();
  const gw::TensorOptions f32{gw::DType::kFloat32, dev};
  auto param = [&](gw::Shape s, std::uint64_t seed) {
    return gw::uniform(s, -0.1, 0.1, seed, f32).set_requires_grad(true);
  };
  gw::Tensor w1 = param({256, 64}, 1), b1 = param({256}, 2), w2 = param({8, 256}, 3),
             b2 = param({8}, 4);
  const gw::Tensor teacher = gw::randn({8, 64}, 5, f32);
  gw::AdamW opt({w1, b1, w2, b2}, {.lr = 3e-3});
  gw::StepArena arena(dev);   // the step's tensors at the same addresses every step
  gw::BackwardGraph bw(dev);  // the backward captured once, then replayed
  double first = 0, last = 0;
  for (int step = 0; step <= 300; ++step) {
    const gw::Tensor x = gw::randn({128, 64}, 100 + step, f32);  // a new batch every step
    const gw::Tensor t = gw::linear(x, teacher).detach();        // its regression targets
    gw::Tensor loss;
    {
      gw::StepScope scope(arena);
      const gw::Tensor h = gw::linear(x, w1, b1, gw::Activation::kGelu);  // eager, recorded
      loss = gw::mse_loss(gw::linear(h, w2, b2), t);
      bw.backward(loss, gw::GradWrite::kOverwrite);  // checks the tape, launches one graph
      arena.record_step_end(dev.is_cuda() ? gw::current_stream(dev) : nullptr);
    }
    opt.step();  // .grads are ready on the current stream: no synchronization needed
    if (step % 100 == 0) std::printf("step %3d  loss %.4f\n", step, loss.item());
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  std::printf("%llu capture(s), %llu replays\n", (unsigned long long)bw.stats().counters.captures,
              (unsigned long long)bw.stats().counters.replays);
  std::printf("consumer: %s, loss %.4f -> %.4f\n", last < first / 10 ? "trained" : "did NOT train",
              first, last);
  return last < first / 10 ? 0 : 1;
}
