#pragma once
// graphward: the one header a training loop includes — tensors and ops, the tape and backward(),
// streams and guards, step arenas, optimizers, errors, DLPack, and the captured backward and step
// (BackwardGraph, StepGraph). Data parallelism has its own header: graphward_dist.h.
#include "graphward/base/config.h"                  // IWYU pragma: export (first: C++20 asked for)
#include "graphward/base/dtype.h"                   // IWYU pragma: export
#include "graphward/base/error.h"                   // IWYU pragma: export
#include "graphward/capture/backward_graph.h"       // IWYU pragma: export
#include "graphward/capture/step_graph.h"           // IWYU pragma: export
#include "graphward/engine/backward/backward.h"     // IWYU pragma: export
#include "graphward/engine/backward/optim.h"        // IWYU pragma: export
#include "graphward/engine/backward/timeline.h"     // IWYU pragma: export
#include "graphward/engine/ops/autocast.h"          // IWYU pragma: export
#include "graphward/engine/ops/ops.h"               // IWYU pragma: export
#include "graphward/engine/ops/rnn.h"               // IWYU pragma: export
#include "graphward/engine/runtime/capture_mode.h"  // IWYU pragma: export
#include "graphward/engine/runtime/device.h"        // IWYU pragma: export
#include "graphward/engine/runtime/dlpack.h"        // IWYU pragma: export
#include "graphward/engine/runtime/gemm_choice.h"   // IWYU pragma: export
#include "graphward/engine/runtime/generator.h"     // IWYU pragma: export
#include "graphward/engine/runtime/graph_pool.h"    // IWYU pragma: export
#include "graphward/engine/runtime/math_mode.h"     // IWYU pragma: export
#include "graphward/engine/runtime/memory.h"        // IWYU pragma: export
#include "graphward/engine/runtime/step_arena.h"    // IWYU pragma: export
#include "graphward/engine/runtime/stream.h"        // IWYU pragma: export
#include "graphward/engine/runtime/tensor.h"        // IWYU pragma: export
#include "graphward/engine/tape/autograd.h"         // IWYU pragma: export
#include "graphward/engine/tape/step_scope.h"       // IWYU pragma: export
