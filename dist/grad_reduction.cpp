#include "graphward/dist/process_group.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "graphward/base/error.h"
#include "graphward/dist/nccl_detail.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/memory.h"

// ProcessGroup as the backward's GradientReducer (Note [Gradient reduction], engine/backward/backward.h):
// its buckets, their placement in flat buffers, and their reduction.

namespace graphward::dist {

double ProcessGroup::begin_backward(GradWrite grad_write) {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  sum_ = comm_ != nullptr && world_size_ > 1 && grad_write == GradWrite::kOverwrite;
  return sum_ ? 1.0 / world_size_ : 1.0;
}

std::size_t ProcessGroup::symmetric_buckets() const {
  return static_cast<std::size_t>(std::count_if(
      flat_.begin(), flat_.end(), [](const auto& f) { return f.second.window != nullptr; }));
}

std::shared_ptr<void> ProcessGroup::symmetric_memory(std::size_t bytes, void** window) {
  *window = nullptr;
#if GRAPHWARD_HAS_NCCL  // (nested: without nccl.h, NCCL_VERSION is no macro to call)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (!comm_ || world_size_ < 2) return nullptr;
  // Note [Symmetric buckets]: a window covers whole pages; every rank registers the same sizes.
  const std::size_t size = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT *
                           NCCL_WIN_REQUIRED_ALIGNMENT;
  void* p = nullptr;
  if (ncclMemAlloc(&p, size) != ncclSuccess || !p) return nullptr;
  const Device device = device_;
  std::shared_ptr<void> memory(p, [device](void* q) {
    try {
      DeviceGuard guard(device);
      const ncclResult_t r = ncclMemFree(q);
      if (r != ncclSuccess) {
        detail::log_error(__FILE__, __LINE__,
                          detail::concat("ProcessGroup: ncclMemFree: ", ncclGetErrorString(r)));
      }
    } catch (const std::exception& e) {
      detail::log_error(__FILE__, __LINE__, e.what());
    }
  });
  ncclWindow_t w = nullptr;
  if (ncclCommWindowRegister(static_cast<ncclComm_t>(comm_), p, size, &w,
                             NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess ||
      !w) {
    return nullptr;  // plain device memory instead (the allocation is freed here)
  }
  windows_.push_back(w);
  *window = w;
  return memory;
#endif
#endif
  (void)bytes;
  return nullptr;
}

void ProcessGroup::place(const std::vector<Tensor*>& grads) {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);  // Note [Replay watchdog]
#if GRAPHWARD_HAS_CUDA
  if (!gradients_in_buckets_ || grads.empty() || !device_.is_cuda() || capturing()) return;
  // Only a bucket of one dtype whose gradients are all the leaves' own (none placed already).
  const DType dtype = grads.front()->dtype();
  for (const Tensor* g : grads) {
    if (!g->defined() || g->dtype() != dtype || g->device() != device_ ||
        g->storage()->borrowed()) {
      return;
    }
  }
  constexpr std::size_t kAlign = 256;  // every part aligned as cudaMalloc's blocks are
  std::vector<std::size_t> offsets;
  std::size_t bytes = 0;
  for (const Tensor* g : grads) {
    offsets.push_back(bytes);
    bytes += (g->nbytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (bytes == 0) return;
  check_usable("place");
  DeviceGuard guard(device_);
  const cudaStream_t s = stream_->get();
  void* window = nullptr;
  std::shared_ptr<void> memory = symmetric_memory(bytes, &window);  // Note [Symmetric buckets]
  if (!memory) {
    auto buffer = std::make_shared<DeviceBuffer>(device_, bytes);
    memory = std::shared_ptr<void>(buffer, buffer->data());
  }
  char* base = static_cast<char*>(memory.get());
  GW_CUDA_CHECK(cudaMemsetAsync(base, 0, bytes, s));  // the padding: zero on every rank
  SegmentCopier copier(s);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    copier.add(grads[i]->raw_data(), base + offsets[i], grads[i]->nbytes());
  }
  copier.flush();
  FlatBucket flat{memory, {}, dtype, bytes, window};
  for (std::size_t i = 0; i < grads.size(); ++i) {
    Tensor& g = *grads[i];
    const std::shared_ptr<const void> owner = memory;
    Tensor moved = Tensor::from_storage(
        Storage::borrow(device_, base + offsets[i], g.nbytes(), s, owner), g.shape(), g.dtype());
    flat.parts.push_back(moved.raw_data());
    g = std::move(
        moved);  // the old gradient's memory is released after the copy (rule [reuse after use])
  }
  flat_[base] = std::move(flat);
#else
  (void)grads;
#endif
}

bool ProcessGroup::reduce_placed(const std::vector<Tensor>& grads) {
#if GRAPHWARD_HAS_NCCL
  if (!comm_ || grads.empty() || !grads.front().defined()) return false;
  const auto it = flat_.find(grads.front().raw_data());
  if (it == flat_.end()) return false;
  const FlatBucket& flat = it->second;
  if (flat.parts.size() != grads.size()) return false;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || grads[i].raw_data() != flat.parts[i] ||
        grads[i].dtype() != flat.dtype || !grads[i].storage()->borrowed()) {
      return false;
    }
  }
  check_usable("reduce");
  DeviceGuard guard(device_);
  const cudaStream_t s = stream_->get();
  before_collective(s, "reduction of a gradient bucket");
  auto comm = static_cast<ncclComm_t>(comm_);
  void* base = flat.memory.get();
  nccl_check(ncclAllReduce(base, base, flat.bytes / dtype_size(flat.dtype), nccl_type(flat.dtype),
                           sum_ ? ncclSum : ncclAvg, comm, s),  // Note [Summed reductions]
             "ncclAllReduce", comm);
  return true;
#else
  (void)grads;
  return false;
#endif
}

void ProcessGroup::reduce(const std::vector<Tensor>& grads) {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);  // Note [Replay watchdog]
  // The executor ordered the stream after the writers and recorded the uses (planned).
#if GRAPHWARD_HAS_NCCL
  if (reduce_placed(grads)) return;  // Note [Gradients in buckets]
  if (!comm_ || grads.size() < 2) {
    return reduce_on_stream(grads, /*average=*/true, 0, sum_);
  }
  check_usable("reduce");
  // Note [Flat buckets]: the gradients to stage, by dtype, in rank order; each dtype's run is a
  // flat chunk when it has two or more. Parts start 16-byte
  // aligned in the chunk; the padding between them is zero on every rank and reduced too.
  constexpr std::size_t kSmall = std::size_t{1} << 20, kAlign = 16;
  auto padded = [](const Tensor& t) { return (t.nbytes() + kAlign - 1) / kAlign * kAlign; };
  std::vector<Tensor> in_place;
  std::vector<std::pair<DType, std::vector<Tensor>>> runs;
  for (const Tensor& g : grads) {
    GW_CHECK(g.defined(),
             "ProcessGroup: a gradient to reduce is undefined (default-constructed or "
             "moved from); expected a tensor on ",
             device_.str(), " (this rank's device)");
    GW_CHECK(g.device() == device_, "ProcessGroup: a gradient to reduce is ", g.str(),
             "; expected a tensor on ", device_.str(), " (this rank's device)");
    if (g.numel() == 0) continue;
    if (g.nbytes() >= kSmall) {
      in_place.push_back(g);
      continue;
    }
    auto run =
        std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.first == g.dtype(); });
    if (run == runs.end()) run = runs.insert(runs.end(), {g.dtype(), {}});
    run->second.push_back(g);
  }
  std::size_t need = 0;
  for (auto& [dtype, parts] : runs) {
    if (parts.size() < 2) {
      in_place.insert(in_place.end(), parts.begin(), parts.end());
      parts.clear();
      continue;
    }
    for (const Tensor& t : parts) need += padded(t);
  }
  if (need > 0 && (staging_.empty() || staging_.back().bytes() < need)) {
    if (capturing()) {  // no allocation in a capture: these are reduced in place
      for (auto& [dtype, parts] : runs) {
        in_place.insert(in_place.end(), parts.begin(), parts.end());
        parts.clear();
      }
      need = 0;
    } else {
      add_staging(std::max(need, 2 * (staging_.empty() ? 0 : staging_.back().bytes())));
    }
  }
  DeviceGuard guard(device_);
  const cudaStream_t s = stream_->get();
  before_collective(s, "reduction of a gradient bucket");
  auto comm = static_cast<ncclComm_t>(comm_);
  char* flat = need > 0 ? static_cast<char*>(staging_.back().data()) : nullptr;
  // Copies every flat chunk's parts in (to_flat) or out, kMaxSegments to a launch.
  auto copy = [&](bool to_flat) {
    SegmentCopier copier(s);
    std::size_t offset = 0;
    for (const auto& [dtype, parts] : runs) {
      for (const Tensor& t : parts) {
        char* slot = flat + offset;
        if (to_flat) {
          copier.add(t.raw_data(), slot, t.nbytes());
        } else {
          copier.add(slot, t.raw_data(), t.nbytes());
        }
        offset += padded(t);
      }
    }
    copier.flush();
  };
  if (need > 0) copy(/*to_flat=*/true);
  const ncclRedOp_t op = sum_ ? ncclSum : ncclAvg;  // Note [Summed reductions]
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  std::size_t offset = 0;
  for (const auto& [dtype, parts] : runs) {
    if (parts.empty()) continue;
    std::size_t bytes = 0;
    for (const Tensor& t : parts) bytes += padded(t);
    const std::size_t n = bytes / dtype_size(dtype);  // padding between parts is reduced too
    if (r == ncclSuccess) {
      r = ncclAllReduce(flat + offset, flat + offset, n, nccl_type(dtype), op, comm, s);
    }
    offset += bytes;
  }
  for (const Tensor& t : in_place) {
    if (r != ncclSuccess) break;
    const auto n = static_cast<std::size_t>(t.numel());
    r = ncclAllReduce(t.raw_data(), t.raw_data(), n, nccl_type(t.dtype()), op, comm, s);
  }
  const ncclResult_t end = ncclGroupEnd();
  nccl_check(r, "ncclAllReduce", comm);
  nccl_check(end, "ncclGroupEnd", comm);
  if (need > 0) copy(/*to_flat=*/false);
#else
  reduce_on_stream(grads, /*average=*/true, 0, sum_);
#endif
}

void ProcessGroup::add_staging(std::size_t bytes) {
#if GRAPHWARD_HAS_CUDA
  staging_.emplace_back(device_, bytes);
  // Zeros, at first: the padding between parts is reduced but never copied back; later it holds
  // zeros or what an earlier bucket's reduction left there — the same on every rank either way.
  DeviceGuard guard(device_);
  GW_CUDA_CHECK(cudaMemsetAsync(staging_.back().data(), 0, bytes, stream_->get()));
#else
  (void)bytes;
#endif
}

}  // namespace graphward::dist
