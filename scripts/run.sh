#!/usr/bin/env bash
# Builds graphward and runs the main job: the example training loop (examples/train_branches.cpp),
# on the GPU when one is usable and on the CPU backend otherwise; it prints which, then the loss.
#   scripts/run.sh [train_branches arguments, e.g. --steps 400 --branches 8 --cpu]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ -f "$GW_BUILD_DIR/CMakeCache.txt" ]; then
  # An existing build keeps its options (its tests and benchmarks stay on if they were): only the
  # example is built.
  if ! grep -q '^GRAPHWARD_BUILD_EXAMPLES:BOOL=ON$' "$GW_BUILD_DIR/CMakeCache.txt"; then
    say "FAILED: $GW_BUILD_DIR is configured with GRAPHWARD_BUILD_EXAMPLES off; reconfigure it with" \
      "-DGRAPHWARD_BUILD_EXAMPLES=ON, or choose another GW_BUILD_DIR"
    exit 1
  fi
  say "building examples/train_branches in $GW_BUILD_DIR, as it is configured"
  cmake --build "$GW_BUILD_DIR" -j "$GW_JOBS" --target train_branches
else
  ensure_deps
  configure_and_build -DGRAPHWARD_BUILD_TESTS=OFF -DGRAPHWARD_BUILD_BENCHMARKS=OFF \
    -DGRAPHWARD_BUILD_EXAMPLES=ON
fi
say "running examples/train_branches $*"
"$GW_BUILD_DIR/examples/train_branches" "$@"
