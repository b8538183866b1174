#pragma once
// NVTX ranges (Note [NVTX ranges]): what graphward does, by name, on Nsight Systems' timeline.
//
// Note [NVTX ranges]
// Ranges in the "graphward" NVTX domain mark every forward op ("linear", "relu", ...), every step
// of an eager backward (the node's label, e.g. "linear backward"), and BackwardGraph's phases
// ("BackwardGraph::signature", "...::capture", "...::update", "...::replay"). NVTX3 is header-only
// (in the CUDA toolkit): with no profiler attached each range costs a few nanoseconds (a pointer
// check). Built in when the toolkit's nvtx3 headers are found and GRAPHWARD_NVTX is ON (the
// default); scripts/profile.sh records a run with Nsight Systems.
namespace graphward::detail {

void nvtx_push(const char* name);  // no-ops without NVTX
void nvtx_pop();

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtx_push(name); }
  ~NvtxRange() { nvtx_pop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Whether graphward was built with NVTX ranges.
bool nvtx_enabled();

}  // namespace graphward::detail
