#!/usr/bin/env bash
# Builds graphward with its tests and runs them all. GPU tests (ctest label `gpu`) run when a CUDA
# device is usable and are reported as skipped, with the reason, when none is.
#   scripts/test.sh            # everything ctest knows
#   GW_BUILD_DIR=/tmp/b scripts/test.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_deps
configure_and_build -DGRAPHWARD_BUILD_TESTS=ON
if [ ! -f "$GW_BUILD_DIR/tests/CTestTestfile.cmake" ]; then
  say "FAILED: the tests were not built (GoogleTest missing); nothing was tested"
  exit 1
fi
say "running the tests"
cd "$GW_BUILD_DIR"
ctest --output-on-failure -j "$GW_JOBS" --timeout 600
