#pragma once
// The engine's part of the public header (graphward.h, at the repository's root, adds the
// captured backward and step): tensors, ops, the tape, backward(), streams, memory, optimizers,
// DLPack.
#include "base/dtype.h"           // IWYU pragma: export
#include "base/error.h"           // IWYU pragma: export
#include "engine/autograd.h"      // IWYU pragma: export
#include "engine/backward.h"      // IWYU pragma: export
#include "engine/capture_mode.h"  // IWYU pragma: export
#include "engine/device.h"        // IWYU pragma: export
#include "engine/dlpack.h"        // IWYU pragma: export
#include "engine/gemm_choice.h"   // IWYU pragma: export
#include "engine/generator.h"     // IWYU pragma: export
#include "engine/graph_pool.h"    // IWYU pragma: export
#include "engine/memory.h"        // IWYU pragma: export
#include "engine/ops.h"           // IWYU pragma: export
#include "engine/optim.h"         // IWYU pragma: export
#include "engine/rnn.h"           // IWYU pragma: export
#include "engine/step_arena.h"    // IWYU pragma: export
#include "engine/stream.h"        // IWYU pragma: export
#include "engine/tensor.h"        // IWYU pragma: export
#include "engine/timeline.h"      // IWYU pragma: export
