#pragma once
// graphward with data parallelism: graphward.h and ProcessGroup (NCCL), whose gradient buckets
// are reduced inside the backward.
#include "graphward/base/config.h"         // IWYU pragma: export (first: C++20 asked for)
#include "graphward/dist/process_group.h"  // IWYU pragma: export
#include "graphward/graphward.h"           // IWYU pragma: export
