#!/usr/bin/env bash
# Mutant checks of BackwardGraph's rule [read after write] waits (GPU): each mutant removes one wait from
# capture/backward_graph.cpp, rebuilds the GPU tests, and runs the test that must catch it; then
# the file is restored (from a copy: never `git checkout` on the device machine, whose copy of the
# git index can be stale) and the tests run again. A mutant that passes its test is a test gap.
#   scripts/mutants.sh    (after a build: scripts/gpu_check.sh or scripts/run.sh)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
F=$GW_ROOT/capture/backward_graph.cpp
BACKUP=$(mktemp)
cp "$F" "$BACKUP"
trap 'cp "$BACKUP" "$F"' EXIT
FAILED=0
mutant() {  # mutant NAME FROM TO GTEST_FILTER
  cp "$BACKUP" "$F"
  python3 - "$F" "$2" "$3" <<'PY' || { say "mutant $1: the line to change is not in the file"; FAILED=1; return; }
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PY
  cmake --build "$GW_BUILD_DIR" -j "$GW_JOBS" --target graphward_gpu_tests >/dev/null 2>&1 ||
    { say "mutant $1: does not build"; FAILED=1; return; }
  if "$GW_BUILD_DIR/tests/graphward_gpu_tests" --gtest_filter="$4" >/dev/null 2>&1; then
    say "mutant $1: NOT caught by $4"; FAILED=1
  else
    say "mutant $1: caught by $4"
  fi
}
mutant loss-stream-wait "wait_for(loss.storage()->producer_stream());" "" \
  "*ALossMadeOnAnotherStreamIsWaitedForBeforeTheReplay*"
mutant grad-hazard-scan "if (g.defined()) g.storage()->for_each_write_hazard(wait_for);" "" \
  "*AGradientStillReadOnAnotherStreamIsNotOverwrittenByTheNextReplay*"
mutant scan-skip-epoch "sig.grads_unchanged && hazards == hazards_seen_" "sig.grads_unchanged" \
  "*AGradientStillReadOnAnotherStreamIsNotOverwrittenByTheNextReplay*"
cp "$BACKUP" "$F"
cmake --build "$GW_BUILD_DIR" -j "$GW_JOBS" --target graphward_gpu_tests >/dev/null 2>&1 &&
  "$GW_BUILD_DIR/tests/graphward_gpu_tests" \
    --gtest_filter="*ALossMadeOnAnotherStream*:*AGradientStillReadOnAnother*" >/dev/null 2>&1 &&
  say "restored: both tests pass" || { say "restored: FAILED"; FAILED=1; }
exit $FAILED
