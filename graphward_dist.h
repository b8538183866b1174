#pragma once
// graphward with data parallelism: graphward.h and ProcessGroup (NCCL), whose gradient buckets
// are reduced inside the backward.
#include "dist/process_group.h"  // IWYU pragma: export
#include "graphward.h"           // IWYU pragma: export
