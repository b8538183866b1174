#include "graphward/engine/runtime/nvtx.h"

#if defined(GRAPHWARD_NVTX) && GRAPHWARD_NVTX && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define GRAPHWARD_NVTX_FOUND 1
#else
#define GRAPHWARD_NVTX_FOUND 0
#endif

namespace graphward::detail {

#if GRAPHWARD_NVTX_FOUND
namespace {
nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("graphward");
  return d;
}
}  // namespace

void nvtx_push(const char* name) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(domain(), &a);
}
void nvtx_pop() {
  nvtxDomainRangePop(domain());
}
bool nvtx_enabled() {
  return true;
}
#else
void nvtx_push(const char*) {}
void nvtx_pop() {}
bool nvtx_enabled() {
  return false;
}
#endif

}  // namespace graphward::detail
