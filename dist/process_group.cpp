#include "graphward/dist/process_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <unistd.h>

#include "graphward/base/error.h"
#include "graphward/dist/nccl_detail.h"
#include "graphward/engine/runtime/capture_mode.h"
#include "graphward/engine/runtime/memory.h"
#include "graphward/kernels/shape.h"

#if GRAPHWARD_HAS_NCCL
#include <nccl.h>
#endif

namespace graphward::dist {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  GW_CHECK(end && *end == '\0' && x >= 0 && x < (1 << 20), "ProcessGroup: ", name, "=\"", v,
           "\"; expected a number from 0");
  return static_cast<int>(x);
}

[[maybe_unused]] std::string env_str(const char* name) {  // unused without NCCL
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

using detail::fnv1a;

std::string ranks_str(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (std::size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

#if GRAPHWARD_HAS_NCCL
constexpr std::size_t kIdBytes = sizeof(ncclUniqueId);

std::string to_hex(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < kIdBytes; ++i) {
    const auto b = static_cast<unsigned char>(id.internal[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool from_hex(const std::string& hex, ncclUniqueId* id) {
  if (hex.size() != 2 * kIdBytes) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < kIdBytes; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id->internal[i] = static_cast<char>(hi * 16 + lo);
  }
  return true;
}

// The rendezvous (see the header): rank 0's unique id, through a file or the environment.
ncclUniqueId rendezvous(int rank, const std::string& id_file_option, double timeout_s) {
  ncclUniqueId id{};
  std::string file = id_file_option.empty() ? env_str("GRAPHWARD_NCCL_ID_FILE") : id_file_option;
  if (file.empty()) {
    const std::string hex = env_str("GRAPHWARD_NCCL_ID");
    GW_CHECK(!hex.empty(), "ProcessGroup: rank ", rank, " has no way to meet the other ranks; "
             "expected an id file (ProcessGroupOptions::id_file or GRAPHWARD_NCCL_ID_FILE) or "
             "GRAPHWARD_NCCL_ID (ProcessGroup::new_unique_id_hex())");
    GW_CHECK(from_hex(hex, &id), "ProcessGroup: GRAPHWARD_NCCL_ID is not an NCCL unique id; "
             "expected ", 2 * kIdBytes, " hex digits (ProcessGroup::new_unique_id_hex())");
    return id;
  }
  detail::check_output_path("ProcessGroup: the NCCL id file", file);
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << to_hex(id);
      GW_CHECK(out.good(), "ProcessGroup: rank 0 could not write the NCCL id to ", tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, file, ec);  // the others never see half a file
    GW_CHECK(!ec, "ProcessGroup: rank 0 could not move the NCCL id into ", file, ": ",
             ec.message());
    return id;
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    // Rank 0 renames the whole file into place: a file there is all it will ever hold, so one that
    // is not an id (garbage, a directory, another program's file) is refused at once, not waited
    // out.
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(file, ec);
    if (!ec && std::filesystem::exists(st)) {
      GW_CHECK(std::filesystem::is_regular_file(st), "ProcessGroup: rank ", rank,
               "'s NCCL id file ", file,
               " is not a regular file (a directory or a device); expected the file rank 0 "
               "writes its id to");
      const std::uintmax_t size = std::filesystem::file_size(file, ec);
      constexpr std::uintmax_t kMost = 4 * kIdBytes;
      GW_CHECK(!ec && size <= kMost, "ProcessGroup: rank ", rank, "'s NCCL id file ", file,
               " holds ", ec ? std::string("an unknown number of") : std::to_string(size),
               " bytes; an id file holds ", 2 * kIdBytes, " hex digits (is it another file?)");
      std::ifstream in(file);
      std::string hex;
      if (in && (in >> hex)) {
        GW_CHECK(from_hex(hex, &id), "ProcessGroup: rank ", rank, "'s NCCL id file ", file,
                 " does not hold an NCCL id (", hex.size(), " characters; expected ", 2 * kIdBytes,
                 " hex digits, as rank 0 writes them): remove it and start rank 0");
        return id;
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    GW_CHECK(waited < timeout_s, "ProcessGroup: rank ", rank, " waited ", timeout_s,
             " s for rank 0's NCCL id in ", file, "; expected rank 0 to start and write it (a "
             "file every rank can read, not left by an earlier run)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
#endif

}  // namespace

ProcessGroup::ProcessGroup(ProcessGroupOptions options)
    : bucket_bytes_(options.bucket_bytes),
      first_bucket_bytes_(options.first_bucket_bytes),
      collective_timeout_s_(options.collective_timeout_s),
      gradients_in_buckets_(options.gradients_in_buckets) {
  GW_CHECK(collective_timeout_s_ > 0, "ProcessGroup: collective_timeout_s is ",
           collective_timeout_s_, "; expected seconds above 0");
  rank_ = options.rank >= 0 ? options.rank : env_int("GRAPHWARD_RANK", 0);
  world_size_ = options.world_size >= 0 ? options.world_size : env_int("GRAPHWARD_WORLD_SIZE", 1);
  GW_CHECK(world_size_ >= 1 && rank_ >= 0 && rank_ < world_size_, "ProcessGroup: rank ", rank_,
           " of world size ", world_size_, "; expected 0 <= rank < world size");
  GW_CHECK(bucket_bytes_ > 0, "ProcessGroup: bucket_bytes is 0; expected a bucket size in bytes");
  GW_CHECK(options.nccl_max_ctas >= 0, "ProcessGroup: nccl_max_ctas is ", options.nccl_max_ctas,
           "; expected 0 (NCCL's choice) or a positive number of CTAs");
  device_ = options.device ? *options.device
                           : Device::cuda(env_int("GRAPHWARD_LOCAL_RANK", rank_));
  if (device_.is_cpu()) {
    GW_CHECK(world_size_ == 1, "ProcessGroup: a group of ", world_size_,
             " on the CPU; expected a CUDA device for each rank (the CPU backend runs a group of "
             "one)");
    return;
  }
  check_cuda_device(device_, "ProcessGroup");  // throws in a build without CUDA
#if GRAPHWARD_HAS_CUDA
  DeviceGuard guard(device_);
  int least = 0, greatest = 0;
  GW_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Reductions first: they gate the step.
  stream_ = std::make_unique<Stream>(device_, greatest);
  gather_ = DeviceBuffer(device_, sizeof(std::uint64_t) * static_cast<std::size_t>(world_size_));
#if GRAPHWARD_HAS_NCCL
  const ncclUniqueId id = world_size_ == 1 ? [] {
    ncclUniqueId own{};
    nccl_check(ncclGetUniqueId(&own), "ncclGetUniqueId");
    return own;
  }() : rendezvous(rank_, options.id_file, options.timeout_s);
  ncclComm_t comm = nullptr;
  // Note [NCCL graph mixing]: NCCL reads the variable once, at its first communicator; the
  // launcher sets it, never the library.
  nccl_graph_mixing_ = env_str("NCCL_GRAPH_MIXING_SUPPORT") != "0";
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (options.nccl_max_ctas > 0) config.maxCTAs = options.nccl_max_ctas;
  nccl_check(ncclCommInitRankConfig(&comm, world_size_, id, rank_, &config),
             "ncclCommInitRankConfig");
  comm_ = comm;
#else
  GW_CHECK(world_size_ == 1, "ProcessGroup: a group of ", world_size_,
           " needs NCCL; graphward was built without it (only a group of one works)");
#endif
#endif
}

#if GRAPHWARD_HAS_NCCL
namespace {
constexpr double kAbortWaitS = 10;

// Runs `call` (an NCCL teardown) on a thread of its own and waits `seconds` for it at most; past
// that it is left to finish, or to end with the process. ncclCommAbort frees this rank from its
// collectives at once (their kernels end), but then frees the communicator, which on one machine
// can wait for every other rank to do the same — forever when one has died (NVIDIA/nccl#863);
// ncclCommDestroy finalizes, which waits for the others too.
template <class Call>
bool finishes_within(double seconds, Call call) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  try {
    std::thread([call, done] {
      call();
      done->set_value();
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: wait here
    call();
    return true;
  }
  return finished.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}
}  // namespace
#endif

ProcessGroup::~ProcessGroup() {
  // Note [Replay watchdog]: its thread stops before the group's state goes; graphs that outlive
  // the group refuse to launch.
  if (watchdog_) watchdog_->detach();
#if GRAPHWARD_HAS_NCCL
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  if (comm_) {
    try {
      DeviceGuard guard(device_);
      wait_for_stream("the group's end");  // aborts (and throws) rather than hang
      auto comm = static_cast<ncclComm_t>(comm_);
      const int rank = rank_;
      // Note [Symmetric buckets]: the windows go before the communicator (collectives, in the
      // order every rank registered them); their memory stays with the tensors over it.
      std::vector<ncclWindow_t> windows;
      for (void* w : windows_) windows.push_back(static_cast<ncclWindow_t>(w));
      if (!finishes_within(collective_timeout_s_, [comm, rank, windows] {
            for (ncclWindow_t w : windows) {
              const ncclResult_t d = ncclCommWindowDeregister(comm, w);
              if (d != ncclSuccess) {
                detail::log_error(__FILE__, __LINE__, detail::concat("ProcessGroup: rank ", rank,
                                  ": ncclCommWindowDeregister: ", ncclGetErrorString(d)));
              }
            }
            const ncclResult_t r = ncclCommDestroy(comm);
            if (r != ncclSuccess) {
              detail::log_error(__FILE__, __LINE__, detail::concat("ProcessGroup: rank ", rank,
                                ": ncclCommDestroy: ", ncclGetErrorString(r)));
            }
          })) {
        detail::log_error(__FILE__, __LINE__, detail::concat(
            "ProcessGroup: rank ", rank_, ": ncclCommDestroy had not returned after ",
            collective_timeout_s_, " s (it waits for the other ranks, one of which may have "
            "stopped): its resources stay with this process until it ends"));
      }
    } catch (const std::exception& e) {
      detail::log_error(__FILE__, __LINE__, e.what());
    }
  }
#endif
}

void ProcessGroup::check_usable(const char* what) const {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  GW_CHECK(aborted_.empty(), "ProcessGroup::", what, ": the group was aborted (", aborted_,
           "); expected a new ProcessGroup on every rank");
}

std::string ProcessGroup::aborted() const {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  return aborted_;
}

void ProcessGroup::abort_group(const std::string& why) {
  void* comm = nullptr;
  {
    std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
    if (!aborted_.empty()) return;
    aborted_ = why;  // first: a launch or a call from now on is refused with it
    comm = comm_;
    comm_ = nullptr;
  }
#if GRAPHWARD_HAS_NCCL
  if (!comm) return;
  auto c = static_cast<ncclComm_t>(comm);
  if (!finishes_within(kAbortWaitS, [c] { (void)ncclCommAbort(c); })) {
    std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
    aborted_ += detail::concat("; NCCL's abort had not returned after ", kAbortWaitS,
                               " s (it waits for the other ranks on this machine): the "
                               "communicator's resources stay with this process until it ends");
  }
#else
  (void)comm;
#endif
}

std::shared_ptr<ReplayWatchdog> ProcessGroup::watchdog() {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  if (!watchdog_) {
    ReplayWatchdog::Group group;
    group.abort = [this](const std::string& why) { abort_group(why); };
    group.aborted = [this] { return aborted(); };
    group.async_error = [this]() -> std::string {
#if GRAPHWARD_HAS_NCCL
      std::unique_lock<std::recursive_mutex> lock(nccl_mutex_, std::try_to_lock);
      if (!lock.owns_lock() || !comm_) return "";  // busy: the next look
      ncclResult_t async = ncclSuccess;
      const ncclResult_t got = ncclCommGetAsyncError(static_cast<ncclComm_t>(comm_), &async);
      if (got != ncclSuccess) return ncclGetErrorString(got);
      if (async != ncclSuccess && async != ncclInProgress) return ncclGetErrorString(async);
#endif
      return "";
    };
    watchdog_ = std::make_shared<ReplayWatchdog>(rank_, device_, collective_timeout_s_,
                                                 std::move(group));
  }
  return watchdog_;
}

void ProcessGroup::wait_for_stream(const std::string& what) {
  if (!comm_ || !stream_) return;
#if GRAPHWARD_HAS_NCCL
  DeviceGuard guard(device_);
  wait_until(
      [this] {
        const cudaError_t q = cudaStreamQuery(stream_->get());
        if (q != cudaErrorNotReady) GW_CUDA_CHECK(q);
        return q == cudaSuccess;
      },
      what);
#else
  (void)what;
#endif
}

void ProcessGroup::wait_for_device(const std::string& what) {
  if (!comm_) return;
#if GRAPHWARD_HAS_NCCL
  ++device_waits_;
  // cudaDeviceSynchronize has no time limit: it runs on a thread of its own while this one polls
  // NCCL and the clock (an abort ends the collectives it would wait for forever).
  auto done = std::make_shared<std::promise<cudaError_t>>();
  std::future<cudaError_t> synced = done->get_future();
  const int ordinal = device_.index;
  std::thread([done, ordinal] {
    cudaError_t e = cudaSetDevice(ordinal);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    done->set_value(e);
  }).detach();
  wait_until(
      [&] { return synced.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }, what);
  GW_CUDA_CHECK(synced.get());
#else
  (void)what;
#endif
}

void ProcessGroup::wait_until(const std::function<bool()>& done, const std::string& what) {
#if GRAPHWARD_HAS_NCCL
  auto comm = static_cast<ncclComm_t>(comm_);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (done()) return;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm, &async);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string why;
    if (got != ncclSuccess) {
      why = detail::concat("ncclCommGetAsyncError failed: ", ncclGetErrorString(got));
    } else if (async != ncclSuccess && async != ncclInProgress) {
      why = detail::concat("NCCL reported ", ncclGetErrorString(async));
    } else if (waited > collective_timeout_s_) {
      why = detail::concat("rank ", rank_, " waited ", collective_timeout_s_,
                           " s for the other ranks");
    }
    if (!why.empty()) {
      abort_group(detail::concat(why, " in ", what));
      throw Error(detail::concat(
          "ProcessGroup: ", aborted(), "; expected every rank to reach the same collectives (a "
          "rank that stopped, failed or runs another model leaves the others waiting). The group "
          "is aborted: make a new one on every rank"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
#else
  (void)done, (void)what;
#endif
}

// Note [NCCL graph mixing]: called before every collective this group enqueues on `s`.
void ProcessGroup::before_collective(cudaStream_t s, const char* what) {
#if GRAPHWARD_HAS_NCCL
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GW_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  if (status == cudaStreamCaptureStatusActive) {
    captured_ = true;
    watch_this_capture(watchdog());  // Note [Replay watchdog]: the graph made of it is watched
  } else if (captured_ && !nccl_graph_mixing_) {
    wait_for_device(detail::concat("waiting for the device before an uncaptured ", what,
                                   " (a graph holding this group's collectives may be running)"));
  }
#else
  (void)s, (void)what;
#endif
}

cudaStream_t ProcessGroup::stream() const {
  return stream_ ? stream_->get() : nullptr;
}

std::string ProcessGroup::new_unique_id_hex() {
#if GRAPHWARD_HAS_NCCL
  ncclUniqueId id{};
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return to_hex(id);
#else
  throw Error("ProcessGroup::new_unique_id_hex: graphward was built without NCCL");
#endif
}

void ProcessGroup::reduce_on_stream(const std::vector<Tensor>& tensors, bool average, int root,
                                    bool sum) {
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  check_usable(average ? "average" : "broadcast");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    GW_CHECK(t.defined(), "ProcessGroup: tensor ", i, " of ", tensors.size(),
             " is undefined (default-constructed or moved from); expected a tensor on ",
             device_.str(), " (this rank's device)");
    GW_CHECK(t.device() == device_, "ProcessGroup: tensor ", i, " is ", t.str(),
             "; expected a "
             "tensor on ",
             device_.str(), " (this rank's device)");
  }
  if (!comm_) return;  // a group of one: the average is the tensor itself
#if GRAPHWARD_HAS_NCCL
  DeviceGuard guard(device_);
  const cudaStream_t s = stream_->get();
  before_collective(s, average ? "average" : "broadcast");
  auto comm = static_cast<ncclComm_t>(comm_);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    void* p = t.raw_data();
    const auto n = static_cast<std::size_t>(t.numel());
    r = average ? ncclAllReduce(p, p, n, nccl_type(t.dtype()), sum ? ncclSum : ncclAvg, comm, s)
                : ncclBroadcast(p, p, n, nccl_type(t.dtype()), root, comm, s);
    if (r != ncclSuccess) break;
  }
  const ncclResult_t end = ncclGroupEnd();
  nccl_check(r, average ? "ncclAllReduce" : "ncclBroadcast", comm);
  nccl_check(end, "ncclGroupEnd", comm);
#else
  (void)average, (void)root, (void)sum;
#endif
}

namespace {
// Orders the group's stream after every earlier use of `tensors` and records it as their writer,
// as an op does (rule [read after write]), for the eager collectives.
void write_on(const std::vector<Tensor>& tensors, cudaStream_t stream) {
  if (!stream) return;
  for (const Tensor& t : tensors) {
    if (t.defined()) t.storage()->sync_for_write(stream);
  }
}

// The shapes and dtypes of `tensors`, hashed and described, for agree(): a collective over
// tensors of different sizes on different ranks would hang or mix memory, so the ranks compare
// first (once per layout).
std::pair<std::uint64_t, std::string> tensors_layout(const char* what,
                                                     const std::vector<Tensor>& tensors) {
  std::uint64_t h = fnv1a(what, std::strlen(what));
  std::string d = detail::concat(tensors.size(), " tensor(s) to ", what, ": ");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined()) continue;
    h = detail::hash_layout(t, h);
    if (i < 8) d += (i ? ", " : "") + t.str();
  }
  if (tensors.size() > 8) d += ", ...";
  return {h, d};
}
}  // namespace

void ProcessGroup::all_reduce_average(const std::vector<Tensor>& tensors) {
  const auto [layout, description] = tensors_layout("average", tensors);
  agree(layout, description, capturing());
  write_on(tensors, stream());
  reduce_on_stream(tensors, /*average=*/true, 0);
}

void ProcessGroup::broadcast(const std::vector<Tensor>& tensors, int root) {
  GW_CHECK(root >= 0 && root < world_size_, "ProcessGroup::broadcast: root ", root,
           "; expected a rank below ", world_size_);
  const auto [layout, description] = tensors_layout("broadcast", tensors);
  agree(layout, description, capturing());
  write_on(tensors, stream());
  reduce_on_stream(tensors, /*average=*/false, root);
}

std::vector<std::uint64_t> ProcessGroup::all_gather(std::uint64_t value) {
  check_capturable("ProcessGroup::all_gather");  // it synchronizes
  std::lock_guard<std::recursive_mutex> lock(nccl_mutex_);
  check_usable("all_gather");
  if (!comm_) return {value};
  std::vector<std::uint64_t> out(static_cast<std::size_t>(world_size_));
#if GRAPHWARD_HAS_NCCL
  DeviceGuard guard(device_);
  const cudaStream_t s = stream_->get();
  before_collective(s, "gather");
  auto* words = static_cast<std::uint64_t*>(gather_.data());
  GW_CUDA_CHECK(cudaMemcpyAsync(words + rank_, &value, sizeof value, cudaMemcpyHostToDevice, s));
  nccl_check(ncclAllGather(words + rank_, words, 1, ncclUint64, static_cast<ncclComm_t>(comm_), s),
             "ncclAllGather", static_cast<ncclComm_t>(comm_));
  // Wait (bounded) before reading back: a copy into pageable memory blocks the host until the
  // stream gets there, which would be forever if a rank never joins the gather.
  wait_for_stream("a gather (the agreement of the ranks' layouts)");
  GW_CUDA_CHECK(cudaMemcpyAsync(out.data(), words, out.size() * sizeof value,
                                cudaMemcpyDeviceToHost, s));
  GW_CUDA_CHECK(cudaStreamSynchronize(s));  // the copy alone: the gather is done
#endif
  return out;
}

void ProcessGroup::agree(std::uint64_t layout, const std::string& description, bool in_capture) {
  if (agreed_.count(layout)) return;
  GW_CHECK(!in_capture, "ProcessGroup: rank ", rank_, " is asked to reduce a gradient layout the "
           "ranks have not agreed on, inside a capture (the check synchronizes): ", description,
           ". Expected one backward of this model outside a capture first (a BackwardGraph's "
           "warm-up and a StepGraph's first step do it)");
  const std::vector<std::uint64_t> all = all_gather(layout);
  std::vector<int> differ;
  for (int r = 0; r < world_size_; ++r) {
    if (all[static_cast<std::size_t>(r)] != layout) differ.push_back(r);
  }
  GW_CHECK(differ.empty(), "ProcessGroup: the ranks disagree on what to reduce: rank ", rank_,
           " has ", description, "; rank(s) ", ranks_str(differ),
           " have another layout. Expected the same model (the same parameters, reached by the "
           "backward in the same order, with the same shapes and dtypes) on every rank");
  agreed_.insert(layout);
}

void ProcessGroup::check_identical(const std::vector<Tensor>& tensors, const std::string& what) {
  std::uint64_t h = fnv1a(nullptr, 0);
  for (const Tensor& t : tensors) {
    GW_CHECK(t.defined(), "ProcessGroup::check_identical: an undefined tensor in ", what);
    const Tensor host = t.to(Device::cpu());
    h = fnv1a(host.raw_data(), host.nbytes(), detail::hash_layout(t, h));
  }
  const std::vector<std::uint64_t> all = all_gather(h);
  std::vector<int> differ;
  for (int r = 0; r < world_size_; ++r) {
    if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
  }
  GW_CHECK(differ.empty(), "ProcessGroup::check_identical: ", what, " of rank(s) ",
           ranks_str(differ), " differ from rank 0's; expected every rank to hold the same ",
           tensors.size(), " tensor(s) bit for bit");
}

}  // namespace graphward::dist
