#pragma once
// graphward: the one header a training loop includes — tensors and ops, the tape and backward(),
// streams and guards, step arenas, optimizers, errors, DLPack, and the captured backward and step
// (BackwardGraph, StepGraph). Data parallelism has its own header: graphward_dist.h.
#include "backward/backward.h"       // IWYU pragma: export
#include "backward/optim.h"          // IWYU pragma: export
#include "backward/timeline.h"       // IWYU pragma: export
#include "base/dtype.h"              // IWYU pragma: export
#include "base/error.h"              // IWYU pragma: export
#include "capture/backward_graph.h"  // IWYU pragma: export
#include "capture/step_graph.h"      // IWYU pragma: export
#include "ops/autocast.h"            // IWYU pragma: export
#include "ops/ops.h"                 // IWYU pragma: export
#include "ops/rnn.h"                 // IWYU pragma: export
#include "runtime/capture_mode.h"    // IWYU pragma: export
#include "runtime/device.h"          // IWYU pragma: export
#include "runtime/dlpack.h"          // IWYU pragma: export
#include "runtime/gemm_choice.h"     // IWYU pragma: export
#include "runtime/generator.h"       // IWYU pragma: export
#include "runtime/graph_pool.h"      // IWYU pragma: export
#include "runtime/math_mode.h"       // IWYU pragma: export
#include "runtime/memory.h"          // IWYU pragma: export
#include "runtime/step_arena.h"      // IWYU pragma: export
#include "runtime/stream.h"          // IWYU pragma: export
#include "runtime/tensor.h"          // IWYU pragma: export
#include "tape/autograd.h"           // IWYU pragma: export
#include "tape/step_scope.h"         // IWYU pragma: export
