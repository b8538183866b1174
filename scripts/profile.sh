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
# nsys: $NSYS, the PATH, then where the CUDA toolkit and Nsight installers put it.
NSYS=${NSYS:-$(command -v nsys 2>/dev/null)}
if [ -z "$NSYS" ]; then
  for c in /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
           /opt/nvidia/nsight-systems-cli/*/bin/nsys /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys; do
    [ -x "$c" ] && NSYS=$c && break
  done
fi
if [ -z "$NSYS" ]; then
  say "nsys (Nsight Systems) is not installed (not on PATH, nor under /usr/local/cuda/bin or"
  say "/opt/nvidia); nothing recorded. Install Nsight Systems and run again, or set NSYS=/path/to/nsys."
  exit 2
fi
say "nsys: $NSYS"
if [ ! -x "${CMD[0]}" ]; then
  say "${CMD[0]} is not built; run scripts/run.sh (or cmake --build $GW_BUILD_DIR) first."
  exit 2
fi
mkdir -p "$(dirname "$NAME")"
say "recording: ${CMD[*]}"
# --cuda-graph-trace=node: the kernels inside each replayed graph, not one opaque launch.
"$NSYS" profile --force-overwrite true --trace cuda,nvtx,osrt --cuda-graph-trace node \
  --output "$NAME" "${CMD[@]}" || { say "nsys failed"; exit 1; }
if [ ! -f "$NAME.nsys-rep" ]; then
  # An nsys without its report tooling leaves the raw stream (.qdstrm) behind.
  if ls "$NAME".qdstrm "$(dirname "$NAME")"/*.qdstrm >/dev/null 2>&1; then
    say "nsys recorded a raw stream but made no report: $(ls "$(dirname "$NAME")"/*.qdstrm | head -1)"
    say "convert it where Nsight Systems is fully installed: QdstrmImporter -i <file>.qdstrm"
    exit 3
  fi
  say "nsys wrote no report ($NAME.nsys-rep missing)"
  exit 1
fi
say "wrote $NAME.nsys-rep"
say "open it in the Nsight Systems GUI (nsys-ui $NAME.nsys-rep): the NVTX rows show the"
say "'graphward' domain's ranges on the CPU thread; the CUDA HW rows show each stream's kernels."
say "Without a GUI: nsys stats $NAME.nsys-rep (where the report tooling is installed)."
say "No profiler at hand: the built-in timeline (engine/backward/timeline.h) writes a Chrome trace for"
say "Perfetto: examples/train_branches --trace trace.json."
