// Note [DLPack] on the CPU: capsules made by hand (tests/runtime/dlpack_abi.h) read without a copy
// and released once; tensors exported and kept alive until their deleter; every dtype both ways;
// an imported parameter trained and its gradient read back; every malformed capsule refused by
// name with nothing taken.
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/dlpack_abi.h"
#include "test_util.h"

namespace graphward {
namespace {
namespace dl = testing::dl;

// A capsule made by hand over host memory of its own, counting its deleter's calls. It stays where
// it is made (its fields point into it).
template <class Managed>
struct HandMade {
  Managed m{};
  std::vector<std::int64_t> shape, strides;
  std::vector<std::uint64_t> words;  // the data (8-byte aligned)
  int deletes = 0;

  HandMade(std::vector<std::int64_t> s, dl::DataType dtype, std::size_t bytes)
      : shape(std::move(s)), words(bytes / 8 + 2) {
    m.dl_tensor.data = words.data();
    m.dl_tensor.device = {dl::kCPU, 0};
    m.dl_tensor.ndim = static_cast<std::int32_t>(shape.size());
    m.dl_tensor.dtype = dtype;
    m.dl_tensor.shape = shape.data();
    m.dl_tensor.strides = nullptr;
    m.dl_tensor.byte_offset = 0;
    m.manager_ctx = this;
    m.deleter = [](Managed* self) { ++static_cast<HandMade*>(self->manager_ctx)->deletes; };
    if constexpr (requires { m.version; }) {
      m.version = {1, 0};
      m.flags = 0;
    }
  }
  // float32 values, row-major.
  HandMade(std::vector<std::int64_t> s, const std::vector<float>& values)
      : HandMade(std::move(s), {2, 32, 1}, values.size() * sizeof(float)) {
    if (!values.empty()) std::memcpy(words.data(), values.data(), values.size() * sizeof(float));
  }
  HandMade(const HandMade&) = delete;
  HandMade& operator=(const HandMade&) = delete;
  float* data() { return reinterpret_cast<float*>(words.data()); }
  void set_shape(std::vector<std::int64_t> s) {
    shape = std::move(s);
    m.dl_tensor.shape = shape.data();
  }
  void set_strides(std::vector<std::int64_t> st) {
    strides = std::move(st);
    m.dl_tensor.strides = strides.data();
  }
};

template <class Managed>
void reads_without_a_copy_and_releases_once() {
  HandMade<Managed> h({2, 3}, {1, 2, 3, 4, 5, 6});
  {
    Tensor t = from_dlpack(&h.m);
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.dtype(), DType::kFloat32);
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_EQ(t.raw_data(), static_cast<void*>(h.words.data())) << "a copy was made";
    EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    copy_(t, mul(t, 10.0));  // written through graphward, seen in the capsule's memory
    EXPECT_EQ(h.data()[5], 60.f);
    Tensor v = t.view({3, 2});  // another handle on the same storage
    t = Tensor();
    EXPECT_EQ(h.deletes, 0) << "released while a view still held the memory";
  }
  EXPECT_EQ(h.deletes, 1);
}

TEST(DLPack, AHandMadeCpuTensorIsReadWithoutACopyAndReleasedOnce) {
  reads_without_a_copy_and_releases_once<dl::ManagedTensor>();
  reads_without_a_copy_and_releases_once<dl::ManagedTensorVersioned>();
}

TEST(DLPack, RowMajorStridesAndAnyStrideOfASizeOneDimensionAreAccepted) {
  HandMade<dl::ManagedTensor> a({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  a.set_strides({3, 99, 1});  // the size-1 dimension's stride is never used
  EXPECT_EQ(from_dlpack(&a.m).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(a.deletes, 1);
  HandMade<dl::ManagedTensor> b({2, 3}, {1, 2, 3, 4, 5, 6});
  b.set_strides({3, 1});
  EXPECT_EQ(from_dlpack(&b.m).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(DLPack, TheByteOffsetIsWhereTheTensorStarts) {
  HandMade<dl::ManagedTensor> h({2}, {1, 2, 3, 4});
  h.m.dl_tensor.byte_offset = 2 * sizeof(float);
  const Tensor t = from_dlpack(&h.m);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_EQ(t.raw_data(), static_cast<void*>(h.data() + 2));
}

TEST(DLPack, EveryDtypeGoesOutAndComesBackOverTheSameMemory) {
  const std::vector<Tensor> tensors = {
      from_vector(std::vector<float>{1.5f, -2.f, 3.f}, {3}),
      from_vector(std::vector<double>{1.25, -2.5}, {2, 1}),
      from_vector(std::vector<std::int32_t>{7, -8, 9, 10}, {2, 2}),
      cast(from_vector(std::vector<float>{1.f, 2.f}, {2}), DType::kBFloat16),
  };
  const int codes[] = {2, 2, 0, 4}, bits[] = {32, 64, 32, 16};
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    SCOPED_TRACE(t.str());
    dl::ManagedTensorVersioned* out = to_dlpack<dl::ManagedTensorVersioned>(t);
    EXPECT_EQ(out->version.major, 1u);
    EXPECT_EQ(out->flags, 0u);
    EXPECT_EQ(out->dl_tensor.device.device_type, dl::kCPU);
    EXPECT_EQ(out->dl_tensor.dtype.code, codes[i]);
    EXPECT_EQ(out->dl_tensor.dtype.bits, bits[i]);
    EXPECT_EQ(out->dl_tensor.dtype.lanes, 1);
    ASSERT_EQ(out->dl_tensor.ndim, t.dim());
    for (std::int64_t d = 0; d < t.dim(); ++d) EXPECT_EQ(out->dl_tensor.shape[d], t.size(d));
    EXPECT_EQ(out->dl_tensor.strides[t.dim() - 1], 1);
    EXPECT_EQ(out->dl_tensor.strides[0], t.numel() / t.size(0));
    EXPECT_EQ(out->dl_tensor.byte_offset, 0u);
    EXPECT_EQ(out->dl_tensor.data, t.raw_data());
    const Tensor back = from_dlpack(out);  // takes the capsule: its deleter runs with `back`
    EXPECT_EQ(back.dtype(), t.dtype());
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(back.raw_data(), t.raw_data());
  }
}

TEST(DLPack, AnExportKeepsItsTensorAliveUntilItsDeleter) {
  dl::ManagedTensor* out = nullptr;
  {
    const Tensor t = from_vector(std::vector<float>{4, 5, 6}, {3});
    out = to_dlpack<dl::ManagedTensor>(t);
  }  // graphward's last handle is gone
  const float* p = static_cast<const float*>(out->dl_tensor.data);
  EXPECT_EQ(p[0], 4.f);
  EXPECT_EQ(p[2], 6.f);
  out->deleter(out);
}

TEST(DLPack, ATensorOfNoElementsTakesTheCapsuleAndReleasesItAtOnce) {
  HandMade<dl::ManagedTensor> h({0, 4}, std::vector<float>{});
  h.m.dl_tensor.data = nullptr;  // allowed with no elements
  const Tensor t = from_dlpack(&h.m);
  EXPECT_EQ(t.shape(), (Shape{0, 4}));
  EXPECT_EQ(h.deletes, 1);
}

TEST(DLPack, AnImportedParameterTrainsAndItsGradientIsReadBack) {
  HandMade<dl::ManagedTensor> w({3}, {1, 2, 3});
  const Tensor param = from_dlpack(&w.m).set_requires_grad(true);
  const Tensor x = from_vector(std::vector<float>{4, 5, 6}, {3});
  backward(sum(mul(param, x)));
  dl::ManagedTensor* g = to_dlpack<dl::ManagedTensor>(param.grad());
  const float* gp = static_cast<const float*>(g->dl_tensor.data);
  EXPECT_EQ((std::vector<float>(gp, gp + 3)), (std::vector<float>{4, 5, 6}));
  g->deleter(g);
  Sgd({param}, {.lr = 0.5}).step();  // in place, in the capsule's memory
  EXPECT_EQ((std::vector<float>(w.data(), w.data() + 3)), (std::vector<float>{-1, -0.5f, 0}));
}

// A malformed capsule: how it is made so, and what the error must say.
struct Malformed {
  const char* what;
  std::function<void(HandMade<dl::ManagedTensor>&)> make;
  std::vector<std::string> says;
};

TEST(DLPack, EveryMalformedCapsuleIsRefusedByNameAndNothingIsTaken) {
  const std::string no_gpu = cuda_available() ? "does not exist" : "no CUDA device is usable";
  const std::vector<Malformed> cases = {
      {"negative ndim", [](auto& h) { h.m.dl_tensor.ndim = -1; }, {"ndim is -1"}},
      {"no shape", [](auto& h) { h.m.dl_tensor.shape = nullptr; }, {"the shape is null"}},
      {"negative size",
       [](auto& h) {
         h.set_shape({2, -3});
       },
       {"[2, -3]", "negative size"}},
      {"too many elements",
       [](auto& h) {
         h.set_shape({std::int64_t{1} << 40, std::int64_t{1} << 40});
       },
       {"more elements than fit in int64"}},
      {"too many bytes",
       [](auto& h) {
         h.set_shape({std::int64_t{1} << 62, 1});
       },
       {"more bytes than fit in int64"}},
      {"null data", [](auto& h) { h.m.dl_tensor.data = nullptr; }, {"null data"}},
      {"misaligned",
       [](auto& h) { h.m.dl_tensor.byte_offset = 2; },
       {"not aligned to its elements' 4 bytes"}},
      {"offset past the address space",
       [](auto& h) { h.m.dl_tensor.byte_offset = ~std::uint64_t{0}; },
       {"byte_offset"}},
      {"transposed",
       [](auto& h) {
         h.set_strides({1, 2});
       },
       {"strides [1, 2] of shape [2, 3]", "contiguous", ".contiguous()"}},
      {"gapped rows",
       [](auto& h) {
         h.set_strides({4, 1});
       },
       {"strides [4, 1]"}},
      {"vector lanes", [](auto& h) { h.m.dl_tensor.dtype.lanes = 4; }, {"4 lanes"}},
      {"float16",
       [](auto& h) { h.m.dl_tensor.dtype.bits = 16; },
       {"code 2 with 16 bits", "expected float32"}},
      {"uint8",
       [](auto& h) {
         h.m.dl_tensor.dtype = {1, 8, 1};
       },
       {"code 1 with 8 bits"}},
      {"complex",
       [](auto& h) {
         h.m.dl_tensor.dtype = {5, 64, 1};
       },
       {"code 5 with 64 bits"}},
      {"pinned host",
       [](auto& h) {
         h.m.dl_tensor.device = {dl::kCUDAHost, 0};
       },
       {"device type 3", "kDLCUDAHost", "expected kDLCPU (1) or kDLCUDA (2)"}},
      {"OpenCL",
       [](auto& h) {
         h.m.dl_tensor.device = {dl::kOpenCL, 0};
       },
       {"kDLOpenCL"}},
      {"ROCm",
       [](auto& h) {
         h.m.dl_tensor.device = {dl::kROCM, 0};
       },
       {"kDLROCM"}},
      {"unknown device",
       [](auto& h) {
         h.m.dl_tensor.device = {static_cast<dl::DeviceType>(99), 0};
       },
       {"device type 99 (an unknown device type)"}},
      {"negative CUDA device",
       [](auto& h) {
         h.m.dl_tensor.device = {dl::kCUDA, -1};
       },
       {"CUDA device id -1"}},
      {"CUDA device not there",
       [](auto& h) {
         h.m.dl_tensor.device = {dl::kCUDA, 999};
       },
       {"from_dlpack", no_gpu}},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    HandMade<dl::ManagedTensor> h({2, 3}, {1, 2, 3, 4, 5, 6});
    c.make(h);
    std::vector<std::string> says = c.says;
    says.push_back("from_dlpack");
    try {
      (void)from_dlpack(&h.m);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      for (const std::string& part : says) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << "message lacks \"" << part << "\": " << e.what();
      }
    }
    EXPECT_EQ(h.deletes, 0) << "a refused capsule was released";
  }
  GW_EXPECT_ERROR(from_dlpack(static_cast<dl::ManagedTensor*>(nullptr)), "got null");
  // And the library goes on working.
  HandMade<dl::ManagedTensor> ok({2}, {1, 2});
  EXPECT_EQ(from_dlpack(&ok.m).to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(DLPack, AVersionedCapsuleOfAnotherMajorVersionOrReadOnlyIsRefused) {
  HandMade<dl::ManagedTensorVersioned> v2({2}, {1, 2});
  v2.m.version = {2, 1};
  GW_EXPECT_ERROR(from_dlpack(&v2.m), "from_dlpack: a DLPack 2.1 tensor; expected DLPack 1.x");
  HandMade<dl::ManagedTensorVersioned> ro({2}, {1, 2});
  ro.m.flags = 1;
  GW_EXPECT_ERROR(from_dlpack(&ro.m), "read-only", "expected a writable one");
  EXPECT_EQ(v2.deletes + ro.deletes, 0);
  ro.m.flags = 2;  // a copy: fine
  EXPECT_EQ(from_dlpack(&ro.m).to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(DLPack, NeitherWayInsideACapture) {
  HandMade<dl::ManagedTensor> h({2}, {1, 2});
  const Tensor t = zeros({2});
  CaptureModeScope capture("a test's graph");
  GW_EXPECT_ERROR(from_dlpack(&h.m), "from_dlpack", "a test's graph");
  GW_EXPECT_ERROR(to_dlpack<dl::ManagedTensor>(t), "to_dlpack", "a test's graph");
  GW_EXPECT_ERROR(to_dlpack<dl::ManagedTensor>(Tensor()), "to_dlpack");
  EXPECT_EQ(h.deletes, 0);
}

// A managed tensor is consumed once: imported again while its first tensor lives, it is refused
// by name and its deleter still runs once (it ran twice: a double free of the producer's memory);
// once that tensor is gone the same struct (its producer reused it) imports again.
template <class Managed>
void imported_twice_is_refused() {
  HandMade<Managed> h({4}, {1, 2, 3, 4});
  {
    const Tensor a = from_dlpack(&h.m);
    GW_EXPECT_ERROR(from_dlpack(&h.m), "from_dlpack", "imported already", "consumed once");
    EXPECT_EQ(h.deletes, 0);
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  }
  EXPECT_EQ(h.deletes, 1);
  { const Tensor again = from_dlpack(&h.m); }
  EXPECT_EQ(h.deletes, 2);
}

TEST(DLPack, ACapsuleImportedTwiceIsRefusedAndItsDeleterRunsOnce) {
  imported_twice_is_refused<dl::ManagedTensor>();
  imported_twice_is_refused<dl::ManagedTensorVersioned>();
}

// The strides of an export are the products of the sizes after each dimension: of a tensor with
// no elements they need not fit in int64, and then the export is refused by name (it exported
// wrapped strides: a signed overflow); every other shape exports its exact strides.
TEST(DLPack, AnExportWhoseStridesDoNotFitInInt64IsRefusedNotWrapped) {
  const std::int64_t kMax = INT64_MAX;
  for (const Shape& shape : std::vector<Shape>{{0, kMax, kMax},
                                               {0, kMax, 2},
                                               {0, std::int64_t{1} << 32, std::int64_t{1} << 32},
                                               {kMax, kMax, 0},
                                               {0, kMax},
                                               {0, 1, kMax},
                                               {2, 0, 3}}) {
    const Tensor t = zeros(shape);
    __int128 stride = 1;
    bool fits = true;
    std::vector<std::int64_t> expect(shape.size(), 1);
    for (std::size_t d = shape.size(); d-- > 1;) {
      stride *= shape[d];
      if (stride > kMax) fits = false;
      expect[d - 1] = static_cast<std::int64_t>(stride);
    }
    if (!fits) {
      GW_EXPECT_ERROR(to_dlpack<dl::ManagedTensor>(t), "to_dlpack", "strides", "int64");
      continue;
    }
    dl::ManagedTensor* m = to_dlpack<dl::ManagedTensor>(t);
    EXPECT_EQ(std::vector<std::int64_t>(m->dl_tensor.strides, m->dl_tensor.strides + shape.size()),
              expect)
        << shape_str(shape);
    m->deleter(m);
  }
}

}  // namespace
}  // namespace graphward
