// Note [DLPack] on the GPU: a CUDA capsule read without a copy and released once; the producer's
// stream waited for before a read on another stream; the owner's reuse ordered after every stream
// that used the memory; an export read and written in the consumer's stream order; memory that is
// not where the capsule says is refused.
#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include "runtime/dlpack_abi.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace dl = testing::dl;

constexpr Device kGpu = Device::cuda(0);

class CudaDLPack : public testing::PoisonedCudaTest {};

// A capsule over cudaMalloc'd float32 memory of its own. Its deleter counts, and enqueues on
// `reuse_on` (if set) what an owner that reuses memory in stream order would: a memset of it to 0.
struct CudaCapsule {
  dl::ManagedTensor m{};
  std::vector<std::int64_t> shape;
  float* data = nullptr;
  std::size_t bytes = 0;
  cudaStream_t reuse_on = nullptr;
  int deletes = 0;

  CudaCapsule(std::vector<std::int64_t> s, const std::vector<float>& values) : shape(std::move(s)) {
    bytes = values.size() * sizeof(float);
    GW_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), bytes));
    GW_CUDA_CHECK(cudaMemcpy(data, values.data(), bytes, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before its copy lands: the data is ready on no
    // stream until the device is synchronized.
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    m.dl_tensor = {data,       {dl::kCUDA, 0}, static_cast<std::int32_t>(shape.size()),
                   {2, 32, 1}, shape.data(),   nullptr,
                   0};
    m.manager_ctx = this;
    m.deleter = [](dl::ManagedTensor* self) {
      auto* c = static_cast<CudaCapsule*>(self->manager_ctx);
      ++c->deletes;
      if (c->reuse_on) GW_CUDA_CHECK(cudaMemsetAsync(c->data, 0, c->bytes, c->reuse_on));
    };
  }
  ~CudaCapsule() {
    GW_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
    GW_CUDA_CHECK_NOTHROW(cudaFree(data));
  }
  CudaCapsule(const CudaCapsule&) = delete;
  CudaCapsule& operator=(const CudaCapsule&) = delete;
  std::vector<float> read() const {
    std::vector<float> v(bytes / sizeof(float));
    GW_CUDA_CHECK(cudaDeviceSynchronize());
    GW_CUDA_CHECK(cudaMemcpy(v.data(), data, bytes, cudaMemcpyDeviceToHost));
    return v;
  }
};

struct RawStream {
  cudaStream_t s = nullptr;
  RawStream() { GW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~RawStream() { GW_CUDA_CHECK_NOTHROW(cudaStreamDestroy(s)); }
};

TEST_F(CudaDLPack, ACudaCapsuleIsReadWithoutACopyAndReleasedOnce) {
  CudaCapsule c({2, 3}, {1, 2, 3, 4, 5, 6});
  {
    Tensor t = from_dlpack(&c.m);
    EXPECT_EQ(t.device(), kGpu);
    EXPECT_EQ(t.raw_data(), static_cast<void*>(c.data)) << "a copy was made";
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    copy_(t, mul(t, 10.0));  // written by graphward, in the capsule's memory
    EXPECT_EQ(c.read()[5], 60.f);
    EXPECT_EQ(c.deletes, 0);
  }
  EXPECT_EQ(c.deletes, 1);
}

TEST_F(CudaDLPack, AReadOnAnotherStreamWaitsForTheProducersStream) {
  RawStream producer;
  const std::vector<float> values = {1, 2, 3, 4};
  CudaCapsule c({4}, {NAN, NAN, NAN, NAN});
  const Tensor src = from_vector(values, {4}).to(kGpu);
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  // The producer writes the data late: a read that did not wait for its stream sees NaN.
  testing::stall(producer.s, 100);
  GW_CUDA_CHECK(
      cudaMemcpyAsync(c.data, src.raw_data(), c.bytes, cudaMemcpyDeviceToDevice, producer.s));
  const Tensor t = from_dlpack(&c.m, {.stream = producer.s});
  ASSERT_NE(current_stream(kGpu), producer.s);
  EXPECT_EQ(mul(t, 2.0).to_vector<float>(), (std::vector<float>{2, 4, 6, 8}));
}

TEST_F(CudaDLPack, TheOwnerReusesTheMemoryOnlyAfterEveryStreamThatUsedIt) {
  RawStream producer;
  CudaCapsule c({4}, {1, 2, 3, 4});
  c.reuse_on = producer.s;  // the deleter zeroes the memory there, as a reuse would
  Stream side(kGpu);
  Tensor y;
  {
    Tensor t = from_dlpack(&c.m, {.stream = producer.s});
    StreamGuard on_side(side);
    testing::stall(side.get(), 100);
    y = mul(t, 1.0);  // read on the side stream, after the stall
  }                   // the last handle goes while the side stream still waits to read it
  EXPECT_EQ(c.deletes, 1);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}))
      << "the owner reused the memory before the side stream read it";
  EXPECT_EQ(c.read(), (std::vector<float>(4, 0.f)));  // and the reuse did happen
}

TEST_F(CudaDLPack, AnExportIsReadAndWrittenInTheConsumersStreamOrder) {
  RawStream consumer;
  const Tensor base = from_vector(std::vector<float>{1, 2, 3}, {3}).to(kGpu);
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  testing::stall(current_stream(kGpu), 100);
  const Tensor x = mul(base, 3.0);  // made late on graphward's stream
  dl::ManagedTensor* out = to_dlpack<dl::ManagedTensor>(x, {.stream = consumer.s});
  EXPECT_EQ(out->dl_tensor.device.device_type, dl::kCUDA);
  EXPECT_EQ(out->dl_tensor.data, x.raw_data());
  std::vector<float> seen(3, -1.f);
  GW_CUDA_CHECK(cudaMemcpyAsync(seen.data(), out->dl_tensor.data, 3 * sizeof(float),
                                cudaMemcpyDeviceToHost, consumer.s));
  GW_CUDA_CHECK(cudaStreamSynchronize(consumer.s));
  EXPECT_EQ(seen, (std::vector<float>{3, 6, 9})) << "the consumer read before graphward wrote";
  // The consumer writes it late on its stream: graphward's next read waits for that.
  testing::stall(consumer.s, 100);
  GW_CUDA_CHECK(cudaMemsetAsync(out->dl_tensor.data, 0, 3 * sizeof(float), consumer.s));
  EXPECT_EQ(add(x, 1.0).to_vector<float>(), (std::vector<float>{1, 1, 1}))
      << "graphward read before the consumer wrote";
  out->deleter(out);
}

TEST_F(CudaDLPack, MemoryThatIsNotWhereTheCapsuleSaysIsRefused) {
  // Host memory said to be on cuda:0.
  std::vector<float> host = {1, 2};
  std::vector<std::int64_t> shape = {2};
  int deletes = 0;
  dl::ManagedTensor h{};
  h.dl_tensor = {host.data(), {dl::kCUDA, 0}, 1, {2, 32, 1}, shape.data(), nullptr, 0};
  h.manager_ctx = &deletes;
  h.deleter = [](dl::ManagedTensor* self) { ++*static_cast<int*>(self->manager_ctx); };
  GW_EXPECT_ERROR(from_dlpack(&h),
                  "from_dlpack: the tensor says cuda:0 but its data is not "
                  "device memory");
  // Device memory said to be on the CPU.
  CudaCapsule c({2}, {1, 2});
  c.m.dl_tensor.device = {dl::kCPU, 0};
  GW_EXPECT_ERROR(from_dlpack(&c.m), "the tensor says kDLCPU but its data is memory of cuda:0");
  // float64 on the GPU.
  c.m.dl_tensor.device = {dl::kCUDA, 0};
  c.m.dl_tensor.dtype = {2, 64, 1};
  c.m.dl_tensor.shape[0] = 1;
  GW_EXPECT_ERROR(from_dlpack(&c.m), "a float64 tensor on cuda:0");
  EXPECT_EQ(deletes + c.deletes, 0);
}

TEST_F(CudaDLPack, NotOnAStreamBeingCaptured) {
  CudaCapsule c({2}, {1, 2});
  Stream s(kGpu);
  const Tensor x = zeros({2}, {DType::kFloat32, kGpu});
  GW_CUDA_CHECK(cudaDeviceSynchronize());
  GW_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeRelaxed));
  GW_EXPECT_ERROR(from_dlpack(&c.m, {.stream = s.get()}), "being captured");
  GW_EXPECT_ERROR(to_dlpack<dl::ManagedTensor>(x, {.stream = s.get()}), "being captured");
  cudaGraph_t graph = nullptr;
  GW_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  if (graph) GW_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_EQ(c.deletes, 0);
}

}  // namespace
}  // namespace graphward
