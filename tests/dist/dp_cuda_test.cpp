// Data parallelism on one GPU (Note [Gradient reduction]): a ProcessGroup of one runs NCCL for
// real (a communicator of one rank), so the reductions are issued, waited for and captured as
// with more ranks; averaging over one process must leave the plain gradients bit for bit — eager,
// replayed from a BackwardGraph, and inside a StepGraph — and a timed backward shows each bucket's
// reduction on its own track, starting after the step that finished its last gradient; a bucket
// of many small gradients goes through the flat buffer and back unchanged; gradients placed in
// their bucket's buffer stay there, hold the plain values, and are written there afterwards.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstdint>
#include <cstdlib>

#include "graphward/graphward_dist.h"  // the public header, as a training loop includes it
#include "test_util.h"

namespace graphward {
namespace {

constexpr Device kGpu = Device::cuda(0);
const TensorOptions kF32Gpu{DType::kFloat32, kGpu};

struct Model {
  std::vector<Tensor> w;
  Model() {
    for (int l = 0; l < 3; ++l) {
      w.push_back(mul(randn({32, 32}, 10 + l, kF32Gpu), 0.2).detach().set_requires_grad(true));
      w.push_back(zeros({32}, kF32Gpu).set_requires_grad(true));
    }
  }
  Tensor loss(const Tensor& x, const Tensor& t) const {
    Tensor h = x;
    for (int l = 0; l < 3; ++l) {
      h = linear(h, w[2 * l], w[2 * l + 1], l < 2 ? Activation::kGelu : Activation::kNone);
    }
    return mse_loss(h, t);
  }
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> out;
    for (const Tensor& p : w) out.push_back(p.grad().to_vector<float>());
    return out;
  }
};

TEST(CudaDataParallel, AGroupOfOneGivesThePlainGradientsEagerReplayedAndInAStepGraph) {
  GW_REQUIRE_GPU();
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu, .bucket_bytes = 4096});
  const Tensor x = randn({16, 32}, 1, kF32Gpu), t = randn({16, 32}, 2, kF32Gpu);
  Model plain, eager, replayed, stepped;
  backward(plain.loss(x, t));
  backward(eager.loss(x, t), {.reduce_gradients = &pg});
  EXPECT_EQ(eager.grads(), plain.grads());

  BackwardGraph bw(kGpu, {.backward = {.reduce_gradients = &pg}});
  for (int s = 0; s < 3; ++s) bw.backward(replayed.loss(x, t), GradWrite::kOverwrite);
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  EXPECT_EQ(replayed.grads(), plain.grads());

  StepGraph step(kGpu, {x, t});
  for (int s = 0; s < 3; ++s) {
    (void)step.run([&] {
      const Tensor loss = stepped.loss(x, t);
      backward(loss, {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &pg});
      return loss;
    });
  }
  EXPECT_EQ(step.counters().captures, 1u) << step.last_reason();
  EXPECT_EQ(stepped.grads(), plain.grads());
}

TEST(CudaDataParallel, ATimedBackwardShowsEachReductionAfterTheStepThatFinishedItsBucket) {
  GW_REQUIRE_GPU();
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu, .bucket_bytes = 4096,
                         .first_bucket_bytes = 1024});
  const Tensor x = randn({16, 32}, 1, kF32Gpu), t = randn({16, 32}, 2, kF32Gpu);
  Model m;
  const Tensor loss = m.loss(x, t);
  const BackwardPlan plan = plan_for({loss});
  const std::vector<GradBucket> buckets = plan_grad_buckets(plan, 4096, 1024);
  ASSERT_GT(buckets.size(), 1u);
  std::vector<StepTiming> timings;
  backward(loss, {.timings = &timings, .reduce_gradients = &pg});
  const std::size_t n = plan.steps.size();
  ASSERT_EQ(timings.size(), n + buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const StepTiming& r = timings[n + b];
    EXPECT_EQ(r.stream, static_cast<int>(plan.streams.size()));
    EXPECT_EQ(r.label.rfind("reduce bucket " + std::to_string(b + 1), 0), 0u) << r.label;
    EXPECT_GE(r.end_ms, r.start_ms);
    const int after = buckets[b].issue_after;
    if (after >= 0) {
      EXPECT_GE(r.start_ms, timings[static_cast<std::size_t>(after)].end_ms) << r.label;
    }
  }
  EXPECT_EQ(stream_names(plan, true).size(), plan.streams.size() + 1);
}

// Note [NCCL graph mixing]: the group reads NCCL_GRAPH_MIXING_SUPPORT from the environment and
// never writes it (ctest and scripts/gpu_check.sh run this with it "0", as the launcher does).
// With mixing off: eager reductions before any capture never wait for the device; once a
// BackwardGraph captured the group's reductions and replayed them, each uncaptured collective (a
// broadcast, an eager backward's bucket) first waits for the device. With mixing on, none waits.
// The gradients are the plain ones either way.
TEST(CudaDataParallel, AfterACapturedReductionUncapturedCollectivesWaitForTheDevice) {
  GW_REQUIRE_GPU();
  const char* before = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");
  const std::string env_before = before ? before : "(unset)";
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu, .bucket_bytes = 4096});
  const char* after = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");
  EXPECT_EQ(after ? std::string(after) : std::string("(unset)"), env_before)
      << "the group changed the process's environment";
  EXPECT_EQ(pg.nccl_graph_mixing(), env_before != "0")
      << "NCCL_GRAPH_MIXING_SUPPORT=" << env_before;
  const bool waits = !pg.nccl_graph_mixing();
  const Tensor x = randn({16, 32}, 1, kF32Gpu), t = randn({16, 32}, 2, kF32Gpu);
  Model plain, m;
  backward(plain.loss(x, t));
  backward(m.loss(x, t), {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &pg});
  EXPECT_EQ(pg.device_waits(), 0u) << "no capture yet: nothing to wait for";
  EXPECT_EQ(m.grads(), plain.grads());
  BackwardGraph bw(kGpu, {.backward = {.reduce_gradients = &pg}});
  for (int s = 0; s < 3; ++s) bw.backward(m.loss(x, t), GradWrite::kOverwrite);
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  const std::uint64_t after_graphs = pg.device_waits();
  pg.broadcast(m.w);  // uncaptured, after replays: two collectives
  EXPECT_EQ(pg.device_waits(), after_graphs + (waits ? 2 : 0))
      << "the agreement's gather and the broadcast, each after a wait (mixing off)";
  backward(m.loss(x, t), {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &pg});
  if (waits) {
    EXPECT_GT(pg.device_waits(), after_graphs + 2) << "an eager backward's buckets wait too";
  } else {
    EXPECT_EQ(pg.device_waits(), 0u) << "mixing on: NCCL orders them itself";
  }
  EXPECT_EQ(m.grads(), plain.grads());
}

// Note [Gradient buckets]: two branches of three layers, each branch's forward on a stream of its
// own, in buckets of two layers: each bucket holds the same layer of both branches (the leaves
// ready together; plan order would put a whole branch first), and waits for both streams. A group
// of one then reduces them, eager and replayed, and leaves the plain gradients.
TEST(CudaDataParallel, BranchesOnTheirStreamsAreBucketedLayerByLayerAcrossTheStreams) {
  GW_REQUIRE_GPU();
  std::vector<std::vector<Tensor>> w(2);
  for (std::size_t b = 0; b < 2; ++b) {
    for (int l = 0; l < 3; ++l) {
      w[b].push_back(mul(randn({32, 32}, 50 + 3 * b + l, kF32Gpu), 0.2).detach().set_requires_grad(true));
    }
  }
  Stream s0(kGpu), s1(kGpu);
  Stream* on[] = {&s0, &s1};
  const Tensor x = randn({16, 32}, 1, kF32Gpu), t = randn({16, 32}, 2, kF32Gpu);
  auto loss = [&] {
    Tensor sum;
    for (std::size_t b = 0; b < 2; ++b) {
      Tensor h = x;
      {
        StreamGuard guard(*on[b]);
        for (int l = 0; l < 3; ++l) h = linear(h, w[b][static_cast<std::size_t>(l)], Tensor(), Activation::kRelu);
      }
      sum = sum.defined() ? add(sum, h) : h;
    }
    return mse_loss(sum, t);
  };
  auto grads = [&] {
    std::vector<std::vector<float>> out;
    for (const auto& branch : w) {
      for (const Tensor& p : branch) out.push_back(p.grad().to_vector<float>());
    }
    return out;
  };
  const Tensor l = loss();
  const BackwardPlan plan = plan_for({l});
  const std::size_t layer = 32 * 32 * sizeof(float);
  const std::vector<GradBucket> buckets = plan_grad_buckets(plan, 2 * layer, 0);
  ASSERT_EQ(buckets.size(), 3u) << plan.dump();
  for (std::size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(buckets[k].buffers.size(), 2u) << plan.dump();
    const int depth = 2 - static_cast<int>(k);  // the last layers are final first
    std::vector<const void*> in_bucket, expected;
    for (int i : buckets[k].buffers) in_bucket.push_back(plan.buffers[i].leaf.raw_data());
    for (const auto& branch : w) expected.push_back(branch[static_cast<std::size_t>(depth)].raw_data());
    std::sort(in_bucket.begin(), in_bucket.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(in_bucket, expected) << "bucket " << k << "\n" << plan.dump();
    EXPECT_EQ(buckets[k].ready.size(), 2u) << "bucket " << k << " waits for both branches' streams";
  }
  backward(l);
  const std::vector<std::vector<float>> plain = grads();
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu, .bucket_bytes = 2 * layer,
                         .first_bucket_bytes = 0});
  for (const auto& branch : w) {
    for (const Tensor& p : branch) p.grad() = Tensor();
  }
  backward(loss(), {.grad_write = GradWrite::kOverwrite, .reduce_gradients = &pg});
  EXPECT_EQ(grads(), plain);
  BackwardGraph bw(kGpu, {.backward = {.reduce_gradients = &pg}});
  for (int s = 0; s < 3; ++s) bw.backward(loss(), GradWrite::kOverwrite);
  EXPECT_EQ(bw.stats().counters.captures, 1u);
  EXPECT_EQ(grads(), plain);
}

// Note [Flat buckets]: a bucket of many small gradients (more than one launch of copies: over 64;
// fp32 and bf16, odd byte counts) and a large one, reduced by a group of one, comes back bit for
// bit — every part copied into the flat buffer and back to its own tensor — in place, on the
// group's stream; the next reduction that needs more room allocates more and keeps the old.
TEST(CudaDataParallel, AFlatBucketOfManySmallGradientsComesBackBitForBit) {
  GW_REQUIRE_GPU();
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu});
  std::vector<Tensor> grads;
  for (int i = 0; i < 70; ++i) {
    const Tensor f = randn({1 + 37 * i}, 100 + i, kF32Gpu);
    grads.push_back(i % 3 == 2 ? cast(f, DType::kBFloat16) : f);
  }
  grads.push_back(randn({512, 1024}, 7, kF32Gpu));  // 2 MiB: in place
  auto bytes_of = [](const std::vector<Tensor>& ts) {
    std::vector<std::vector<float>> out;
    for (const Tensor& t : ts) {
      out.push_back((t.dtype() == DType::kFloat32 ? t : cast(t, DType::kFloat32)).to_vector<float>());
    }
    return out;
  };
  const std::vector<std::vector<float>> before = bytes_of(grads);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the reducer's caller orders its stream
  std::vector<const void*> where;
  for (const Tensor& g : grads) where.push_back(g.raw_data());
  pg.reduce(grads);
  ASSERT_EQ(cudaStreamSynchronize(pg.stream()), cudaSuccess);
  EXPECT_EQ(bytes_of(grads), before);
  for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(grads[i].raw_data(), where[i]);
  // More small gradients than fit the flat buffer made above: a larger one, the same result.
  std::vector<Tensor> more;
  for (int i = 0; i < 40; ++i) more.push_back(randn({20000 + i}, 300 + i, kF32Gpu));
  const std::vector<std::vector<float>> more_before = bytes_of(more);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pg.reduce(more);
  ASSERT_EQ(cudaStreamSynchronize(pg.stream()), cudaSuccess);
  EXPECT_EQ(bytes_of(more), more_before);
  // One large gradient alone.
  const std::vector<Tensor> one = {randn({1024, 1024}, 9, kF32Gpu)};
  const std::vector<std::vector<float>> one_before = bytes_of(one);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pg.reduce(one);
  ASSERT_EQ(cudaStreamSynchronize(pg.stream()), cudaSuccess);
  EXPECT_EQ(bytes_of(one), one_before);
}

// Note [Gradients in buckets]: place() moves a bucket's gradients (more than one launch of copies)
// into one flat buffer of the group's — in bucket order, each part 256-byte aligned, right after
// the one before — with their values; reduce() then averages the buffer in one all-reduce and
// leaves them there. A bucket placed already, or mixing dtypes, stays where it is.
TEST(CudaDataParallel, PlacedGradientsShareOneFlatBufferInBucketOrder) {
  GW_REQUIRE_GPU();
  dist::ProcessGroup pg({.rank = 0, .world_size = 1, .device = kGpu});
  std::vector<Tensor> grads;
  for (int i = 0; i < 70; ++i) grads.push_back(randn({1 + 37 * i}, 100 + i, kF32Gpu));
  std::vector<std::vector<float>> before;
  for (const Tensor& g : grads) before.push_back(g.to_vector<float>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the executor orders the group's stream
  std::vector<Tensor*> slots;
  for (Tensor& g : grads) slots.push_back(&g);
  pg.place(slots);
  EXPECT_EQ(pg.placed_buckets(), 1u);
  auto address = [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()); };
  EXPECT_EQ(address(grads[0]) % 256, 0u);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(grads[i].storage()->borrowed()) << i;
    if (i == 0) continue;
    const std::size_t padded = (grads[i - 1].nbytes() + 255) / 256 * 256;
    EXPECT_EQ(address(grads[i]), address(grads[i - 1]) + padded) << i;
  }
  ASSERT_EQ(cudaStreamSynchronize(pg.stream()), cudaSuccess);
  std::vector<std::vector<float>> placed;
  for (const Tensor& g : grads) placed.push_back(g.to_vector<float>());
  EXPECT_EQ(placed, before);
  std::vector<std::uintptr_t> where;
  for (const Tensor& g : grads) where.push_back(address(g));
  pg.reduce(grads);
  pg.place(slots);  // placed already: nothing moves
  ASSERT_EQ(cudaStreamSynchronize(pg.stream()), cudaSuccess);
  EXPECT_EQ(pg.placed_buckets(), 1u);
  std::vector<std::vector<float>> reduced;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    reduced.push_back(grads[i].to_vector<float>());
    EXPECT_EQ(address(grads[i]), where[i]) << i;
  }
  EXPECT_EQ(reduced, before);  // the average over one rank
  std::vector<Tensor> mixed = {randn({10}, 1, kF32Gpu),
                               cast(randn({10}, 2, kF32Gpu), DType::kBFloat16)};
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pg.place({&mixed[0], &mixed[1]});
  EXPECT_EQ(pg.placed_buckets(), 1u);
  EXPECT_FALSE(mixed[0].storage()->borrowed());
}

// Note [Gradients in buckets], through the backward: after the first backward with the group, the
// leaves' .grads are the group's (borrowed, 256-byte aligned) and hold the plain gradients; the
// next backwards write them in place, at the same addresses, and still give the plain gradients.
// With gradients_in_buckets off they stay the backward's own.
TEST(CudaDataParallel, AfterTheFirstBackwardTheGradientsLiveInTheirBuckets) {
  GW_REQUIRE_GPU();
  dist::ProcessGroup pg(
      {.rank = 0, .world_size = 1, .device = kGpu, .bucket_bytes = 4096, .first_bucket_bytes = 0});
  const Tensor x = randn({16, 32}, 1, kF32Gpu), t = randn({16, 32}, 2, kF32Gpu);
  Model plain, dp;
  backward(plain.loss(x, t));
  backward(dp.loss(x, t), {.reduce_gradients = &pg});
  EXPECT_EQ(dp.grads(), plain.grads());
  EXPECT_GE(pg.placed_buckets(), 2u);  // 4 KiB buckets (the first too): several
  std::vector<const void*> where;
  for (const Tensor& p : dp.w) {
    EXPECT_TRUE(p.grad().storage()->borrowed());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.grad().raw_data()) % 256, 0u);
    where.push_back(p.grad().raw_data());
  }
  const std::size_t placed = pg.placed_buckets();
  for (int s = 0; s < 2; ++s) {
    backward(plain.loss(x, t));  // accumulates
    backward(dp.loss(x, t), {.reduce_gradients = &pg});
  }
  EXPECT_EQ(dp.grads(), plain.grads());
  EXPECT_EQ(pg.placed_buckets(), placed);
  for (std::size_t i = 0; i < dp.w.size(); ++i) EXPECT_EQ(dp.w[i].grad().raw_data(), where[i]) << i;

  dist::ProcessGroup off({.rank = 0, .world_size = 1, .device = kGpu, .bucket_bytes = 4096,
                          .gradients_in_buckets = false});
  Model kept;
  backward(kept.loss(x, t), {.reduce_gradients = &off});
  EXPECT_EQ(off.placed_buckets(), 0u);
  for (const Tensor& p : kept.w) EXPECT_FALSE(p.grad().storage()->borrowed());
  Model once;
  backward(once.loss(x, t));
  EXPECT_EQ(kept.grads(), once.grads());
}

// The rendezvous of a rank other than 0 refuses, at once and naming the file, an id file that is
// a directory, holds garbage or is large (each waited out the timeout and said "expected rank 0
// to start and write it"); a path with a NUL byte is refused before anything is written.
TEST(CudaProcessGroup, AnIdFileThatIsNoIdIsRefusedAtOnceByName) {
  GW_REQUIRE_GPU();
#if !GRAPHWARD_HAS_NCCL
  GTEST_SKIP() << "graphward was built without NCCL";
#else
  const std::string dir = ::testing::TempDir() + "gw_id_files";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/a_directory");
  {
    std::ofstream(dir + "/garbage") << "not an id at all\n";
    std::ofstream big(dir + "/big", std::ios::binary);
    const std::string mib(1 << 20, 'a');
    for (int i = 0; i < 64; ++i) big << mib;
  }
  const struct {
    const char* file;
    const char* says;
  } cases[] = {{"/a_directory", "not a regular file"},
               {"/garbage", "does not hold an NCCL id"},
               {"/big", "holds 67108864 bytes"}};
  for (const auto& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    GW_EXPECT_ERROR(dist::ProcessGroup({.rank = 1, .world_size = 2, .device = kGpu,
                                        .id_file = dir + c.file, .timeout_s = 60}),
                    "rank 1", c.file, c.says);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s, 5.0) << c.file << ": waited instead of refusing";
  }
  GW_EXPECT_ERROR(dist::ProcessGroup({.rank = 0, .world_size = 2, .device = kGpu,
                                      .id_file = dir + std::string("/x\0y", 4)}),
                  "NCCL id file", "NUL");
  std::filesystem::remove_all(dir);
#endif
}

}  // namespace
}  // namespace graphward
