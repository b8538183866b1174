#!/usr/bin/env bash
# Builds graphward and runs the main job: the example training loop (examples/train_branches.cpp),
# on the GPU when one is usable and on the CPU backend otherwise; it prints which, then the loss.
#   scripts/run.sh [train_branches arguments, e.g. --steps 400 --branches 8 --cpu]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_deps
configure_and_build -DGRAPHWARD_BUILD_TESTS=OFF -DGRAPHWARD_BUILD_BENCHMARKS=OFF \
  -DGRAPHWARD_BUILD_EXAMPLES=ON
say "running examples/train_branches $*"
"$GW_BUILD_DIR/examples/train_branches" "$@"
