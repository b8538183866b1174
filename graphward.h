#pragma once
// graphward: the one header a training loop includes — tensors and ops, the tape and backward(),
// streams and guards, step arenas, optimizers, errors, and the captured backward and step
// (BackwardGraph, StepGraph). Data parallelism has its own header: graphward_dist.h.
#include "capture/backward_graph.h"  // IWYU pragma: export
#include "capture/step_graph.h"      // IWYU pragma: export
#include "engine/graphward.h"        // IWYU pragma: export
