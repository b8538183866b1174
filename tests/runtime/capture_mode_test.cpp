// Note [Capture-unsafe ops]: inside a CaptureModeScope every op that would wait for the GPU or read
// a tensor's value on the host is refused by name before it does anything; the backward's own code
// makes no such call, so a plain backward runs inside the scope.
#include "test_util.h"

namespace graphward {
namespace {

TEST(CaptureMode, HostReadsAndTransfersAreRefusedByNameInsideACapture) {
  const Tensor t = full({1}, 2.0);
  EXPECT_FALSE(capturing());
  EXPECT_EQ(t.item(), 2.0);  // fine outside
  {
    CaptureModeScope scope("the backward of step 3");
    EXPECT_TRUE(capturing());
    GW_EXPECT_ERROR(t.item(), "Tensor::item", "the backward of step 3", "CUDA graph");
    GW_EXPECT_ERROR(t.to_vector<float>(), "Tensor::to_vector");
    GW_EXPECT_ERROR(t.to(Device::cuda(0)), "Tensor::to");  // refused before any CUDA call
    EXPECT_EQ(t.to(Device::cpu()).numel(), 1);             // a copy within the host is no read
    GW_EXPECT_ERROR(check_capturable("my_op"), "my_op cannot run while graphward is capturing");
  }
  EXPECT_FALSE(capturing());
  EXPECT_EQ(t.item(), 2.0);
}

TEST(CaptureMode, ScopesNestAndTheInnermostNamesTheCapture) {
  {
    CaptureModeScope outer("outer");
    {
      CaptureModeScope inner("inner");
      GW_EXPECT_ERROR(check_capturable("op"), "inner");
    }
    EXPECT_TRUE(capturing());
    GW_EXPECT_ERROR(check_capturable("op"), "outer");
  }
  EXPECT_FALSE(capturing());
}

TEST(CaptureMode, ABackwardThatReadsAValueOnTheHostIsRefusedAndAPlainOneRuns) {
  const Tensor w = randn({4}, 1).set_requires_grad(true);
  // A hand-made op whose backward reads its incoming gradient on the host.
  auto reads_on_host = [&] {
    const Tensor y = mul(w, 3.0);
    const Tensor out = Tensor::empty({4});
    InputMeta in{y.shape(), y.dtype(), y.device(), nullptr, {y.grad_fn(), Tensor()}};
    out.set_grad_fn(
        make_node("peek", Device::cpu(), nullptr, {in}, {4},
                  [](const Tensor& g, const std::vector<Tensor>&, std::span<GradSlot> grads) {
                    (void)g.to_vector<float>();  // a host read
                    scale_backward(g, 1.0, grads[0]);
                  }));
    return sum(out);
  };
  {
    CaptureModeScope scope("a test backward");
    GW_EXPECT_ERROR(backward(reads_on_host()), "Tensor::to_vector", "a test backward");
    EXPECT_FALSE(w.grad().defined()) << "the refused backward reached the leaf";
    // The same model without the host read: the executor itself reads nothing on the host.
    backward(sum(mul(w, 3.0)));
  }
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(4, 3.0f));
}

// Note [Watched replays]: a watcher registered inside a CaptureWatchers scope is collected once
// (a group's collectives register it for every one), by the innermost scope; outside any scope a
// registration does nothing.
TEST(CaptureMode, WatchersRegisteredDuringACaptureAreCollectedOnceByTheInnermostScope) {
  struct Counting final : ReplayWatcher {
    void before_launch(const std::string&) override {}
    void after_launch(void*, const std::string&) override {}
  };
  const auto a = std::make_shared<Counting>(), b = std::make_shared<Counting>();
  watch_this_capture(a);  // no scope: nothing holds it
  EXPECT_EQ(a.use_count(), 1);
  CaptureWatchers outer;
  watch_this_capture(a);
  watch_this_capture(a);
  {
    CaptureWatchers inner;
    watch_this_capture(b);
    const auto got = inner.take();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], b);
  }
  watch_this_capture(nullptr);
  const auto got = outer.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], a);
}

}  // namespace
}  // namespace graphward
