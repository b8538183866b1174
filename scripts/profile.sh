#!/usr/bin/env bash
# Records the example training loop (or any command) with Nsight Systems, with graphward's NVTX
# ranges (domain "graphward": forward ops, backward steps, BackwardGraph's signature / capture /
# update / replay) and CUDA API and graph-node tracing.
#   scripts/profile.sh [output-name] [-- command args...]
# Default command: the built example, 50 steps. Writes <output-name>.nsys-rep (default
# build/profile/graphward) and says what to open. Needs a build (scripts/run.sh) and nsys.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
NAME=${1:-$GW_BUILD_DIR/profile/graphward}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
CMD=("$@")
[ ${#CMD[@]} -eq 0 ] && CMD=("$GW_BUILD_DIR/examples/train_branches" --steps 50)
if ! command -v nsys >/dev/null 2>&1; then
  say "nsys (Nsight Systems) is not installed or not on PATH; nothing recorded."
  say "Install Nsight Systems (it ships with the CUDA toolkit's full installer) and run again."
  exit 2
fi
if [ ! -x "${CMD[0]}" ]; then
  say "${CMD[0]} is not built; run scripts/run.sh (or cmake --build $GW_BUILD_DIR) first."
  exit 2
fi
mkdir -p "$(dirname "$NAME")"
say "recording: ${CMD[*]}"
# --cuda-graph-trace=node: the kernels inside each replayed graph, not one opaque launch.
nsys profile --force-overwrite true --trace cuda,nvtx,osrt --cuda-graph-trace node \
  --output "$NAME" "${CMD[@]}" || { say "nsys failed"; exit 1; }
say "wrote $NAME.nsys-rep"
say "open it in the Nsight Systems GUI (nsys-ui $NAME.nsys-rep): the NVTX rows show the"
say "'graphward' domain's ranges on the CPU thread; the CUDA HW rows show each stream's kernels."
say "Without a GUI: nsys stats $NAME.nsys-rep (where the report tooling is installed)."
say "No profiler at hand: the built-in timeline (engine/timeline.h) writes a Chrome trace for"
say "Perfetto: examples/train_branches --trace trace.json."
