// A kernel trace through CUPTI's activity API, loaded into a program with LD_PRELOAD (built and
// run by scripts/kernel_trace.sh): every kernel, copy and memset the process runs on a GPU — the
// nodes of replayed CUDA graphs one by one, with their graph and node ids — written to
// $GW_KERNEL_TRACE.r<GRAPHWARD_RANK, else 0>.csv as
//   kind,start_ns,end_ns,device,stream,graph,node,grid_or_bytes,block,name
// (kind K: kernel, C: copy, S: memset; graph 0: not in a graph; names demangled, without their
// arguments). Beside it, $GW_KERNEL_TRACE.r<rank>.edges holds the shape of every graph the process
// instantiates, for the critical path of a replay:
//   E,from,to        an edge of the instantiated graph, between CUPTI's ids of its nodes
//   M,clone,original a node the instantiation (or a graph clone) copied, and the node it copied
// (the records' node ids may be the executable's copies). For where the time of a replayed step
// goes where Nsight Systems cannot make reports; scripts/kernel_trace.py summarises the CSV and
// its edges. A diagnostic, not part of the library: tracing
// slows a step (on an H200: 1% for train_dp's 8 x 2048 MLP, 15-18% for its 4-branch study).
// Records reach the file every 300 ms and when the process exits normally.
#include <cuda.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

FILE* g_out = nullptr;
FILE* g_edges = nullptr;
std::mutex g_mutex;
std::atomic<bool> g_stop{false};
std::thread g_flusher;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s failed: %s (no trace)\n", what, msg ? msg : "?");
}

std::string short_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (std::size_t a; (a = s.find("(anonymous namespace)")) != std::string::npos;) {
    s.replace(a, 21, "anon");
  }
  if (const auto p = s.find('('); p != std::string::npos) s.resize(p);
  for (char& c : s) {
    if (c == ',') c = ';';  // the CSV's separator
  }
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = std::size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(64, *size));
  *max_records = 0;
}

// One CSV row: the fields every record kind has, then its size (a kernel's grid, a copy's or a
// memset's bytes), a kernel's block (0 for the others) and its name.
template <class Record>
void row(char kind, const Record& r, long long size, int block, const std::string& name) {
  std::fprintf(g_out, "%c,%llu,%llu,%u,%u,%u,%llu,%lld,%d,%s\n", kind,
               static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
               r.deviceId, r.streamId, r.graphId, static_cast<unsigned long long>(r.graphNodeId),
               size, block, name.c_str());
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* r = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto& k = *reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      row('K', k, static_cast<long long>(k.gridX) * k.gridY * k.gridZ,
          k.blockX * k.blockY * k.blockZ, short_name(k.name));
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      row('C', m, static_cast<long long>(m.bytes), 0,
          "memcpy kind " + std::to_string(static_cast<int>(m.copyKind)));
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      row('S', m, static_cast<long long>(m.bytes), 0, "memset");
    }
  }
  std::free(buffer);
}

// ---- the graphs' edges -----------------------------------------------------------------------

std::uint64_t node_id(CUgraphNode node) {
  std::uint64_t id = 0;
  return node && cuptiGetGraphNodeId(node, &id) == CUPTI_SUCCESS ? id : 0;
}

// The driver's cuGraphGetEdges with edge data (a query without it fails once an edge carries
// some), found in the driver the program already loaded: this library links only CUPTI.
using GetEdges = CUresult (*)(CUgraph, CUgraphNode*, CUgraphNode*, CUgraphEdgeData*, std::size_t*);
GetEdges get_edges() {
  static const GetEdges f = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_LAZY);
    return lib ? reinterpret_cast<GetEdges>(dlsym(lib, "cuGraphGetEdges_v2")) : nullptr;
  }();
  return f;
}

std::string line(char kind, std::uint64_t a, std::uint64_t b) {
  return std::string(1, kind) + "," + std::to_string(a) + "," + std::to_string(b) + "\n";
}

std::string edges_of(CUgraph graph) {
  const GetEdges query = get_edges();
  std::size_t n = 0;
  if (!query || !graph || query(graph, nullptr, nullptr, nullptr, &n) != CUDA_SUCCESS || n == 0) {
    return "";
  }
  std::vector<CUgraphNode> from(n), to(n);
  std::vector<CUgraphEdgeData> data(n);
  if (query(graph, from.data(), to.data(), data.data(), &n) != CUDA_SUCCESS) return "";
  std::string text;
  for (std::size_t e = 0; e < n; ++e) text += line('E', node_id(from[e]), node_id(to[e]));
  return text;
}

void CUPTIAPI on_resource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                          const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || !data) return;
  const auto* graph = static_cast<const CUpti_GraphData*>(
      static_cast<const CUpti_ResourceData*>(data)->resourceDescriptor);
  if (!graph) return;
  // Queried before the lock: the records' callback takes it too.
  std::string text;
  if (id == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) {
    text = line('M', node_id(graph->node), node_id(graph->originalNode));
  } else if (id == CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED) {
    text = edges_of(graph->graph);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_edges && !text.empty()) std::fputs(text.c_str(), g_edges);
}

CUpti_SubscriberHandle g_subscriber = nullptr;

__attribute__((constructor)) void start() {
  const char* prefix = std::getenv("GW_KERNEL_TRACE");
  if (!prefix || !*prefix) return;
  const char* rank = std::getenv("GRAPHWARD_RANK");
  const std::string path = std::string(prefix) + ".r" + (rank && *rank ? rank : "0") + ".csv";
  g_out = std::fopen(path.c_str(), "w");
  if (!g_out) {
    std::fprintf(stderr, "kernel_trace: cannot write %s (no trace)\n", path.c_str());
    return;
  }
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
        "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
  const std::string edges = std::string(prefix) + ".r" + (rank && *rank ? rank : "0") + ".edges";
  g_edges = std::fopen(edges.c_str(), "w");
  if (!g_edges) {
    std::fprintf(stderr, "kernel_trace: cannot write %s (no critical paths)\n", edges.c_str());
  } else if (cuptiSubscribe(&g_subscriber, on_resource, nullptr) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: cuptiSubscribe failed (no critical paths)\n");
  } else {
    check(cuptiEnableCallback(1, g_subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                              CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED),
          "enabling the graph node callback");
    check(cuptiEnableCallback(1, g_subscriber, CUPTI_CB_DOMAIN_RESOURCE,
                              CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED),
          "enabling the graph instantiation callback");
  }
  g_flusher = std::thread([] {
    while (!g_stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    }
  });
}

__attribute__((destructor)) void finish() {
  if (!g_out) return;
  g_stop = true;
  if (g_flusher.joinable()) g_flusher.join();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (g_subscriber) cuptiUnsubscribe(g_subscriber);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fclose(g_out);
  g_out = nullptr;
  if (g_edges) std::fclose(g_edges);
  g_edges = nullptr;
}

}  // namespace
