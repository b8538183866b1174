#!/usr/bin/env bash
# Every kernel, copy and memset a program runs on the GPU — each node of its replayed CUDA graphs
# — timed by CUPTI (scripts/kernel_trace.cpp, an LD_PRELOAD library built into $GW_BUILD_DIR on
# first use), written to PREFIX.r<rank>.csv per process (the instantiated graphs' edges to
# PREFIX.r<rank>.edges) and summarised by scripts/kernel_trace.py (every graph's replay time and
# critical path; with GW_KERNEL_TRACE_NODES=1, each node's median start and duration in a replay,
# into PREFIX.r<rank>.txt). For where a replayed step's time goes on a machine where
# Nsight Systems records but cannot make reports. Run on the GPU machine after a build.
#   scripts/kernel_trace.sh PREFIX PROGRAM [ARGS...]      one process
#   scripts/kernel_trace.sh PREFIX --dp N [FLAGS...]      N ranks of train_dp (scripts/run_dp.sh)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ $# -lt 2 ]; then
  echo "usage: scripts/kernel_trace.sh PREFIX PROGRAM [ARGS...] | PREFIX --dp N [FLAGS...]" >&2
  exit 2
fi
prefix=$1
shift
if [ "$1" = "--dp" ]; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$gpus" -lt "${2:-1}" ]; then
    echo "kernel_trace.sh: skipped: ${2:-1} ranks need ${2:-1} GPUs; this machine has $gpus"
    exit 77
  fi
fi
lib=$GW_BUILD_DIR/kernel_trace.so
if [ ! -e "$lib" ] || [ "$GW_ROOT/scripts/kernel_trace.cpp" -nt "$lib" ]; then
  cupti=$(find /usr/local/cuda/ /usr/local/cuda*/ -name libcupti.so -print -quit 2>/dev/null)
  if [ -z "$cupti" ]; then
    echo "kernel_trace.sh: libcupti.so not found under /usr/local/cuda*" >&2
    exit 2
  fi
  cupti_dir=$(dirname "$cupti")
  inc=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda*/ -name cupti.h -print -quit)")
  mkdir -p "$GW_BUILD_DIR"
  g++ -std=c++17 -O2 -shared -fPIC "$GW_ROOT/scripts/kernel_trace.cpp" -I"$inc" -L"$cupti_dir" \
    -lcupti -lpthread -ldl -Wl,-rpath,"$cupti_dir" -o "$lib" || exit 2
fi
rm -f "$prefix".r*.csv "$prefix".r*.edges
if [ "$1" = "--dp" ]; then
  n=${2:?kernel_trace.sh: --dp needs the number of ranks}
  shift 2
  program=${GW_DP_PROGRAM:-$GW_BUILD_DIR/examples/train_dp}
  wrapper=$(mktemp /tmp/kernel_trace.XXXXXX)
  trap 'rm -f "$wrapper"' EXIT
  # Only the ranks load the library (not run_dp.sh's shell and its helpers).
  printf '#!/bin/sh\nexport LD_PRELOAD=%q GW_KERNEL_TRACE=%q\nexec %q "$@"\n' "$lib" "$prefix" \
    "$program" >"$wrapper"
  chmod +x "$wrapper"
  GW_DP_PROGRAM=$wrapper "$GW_ROOT/scripts/run_dp.sh" "$n" "$@"
else
  LD_PRELOAD=$lib GW_KERNEL_TRACE=$prefix "$@"
fi
status=$?
[ $status -eq 77 ] && exit 77  # skipped (run_dp.sh: not enough GPUs)
for csv in "$prefix".r*.csv; do
  [ -e "$csv" ] || { echo "kernel_trace.sh: no trace written" >&2; exit 1; }
  echo "== $csv"
  python3 "$GW_ROOT/scripts/kernel_trace.py" "$csv"
  if [ "${GW_KERNEL_TRACE_NODES:-0}" = 1 ]; then
    python3 "$GW_ROOT/scripts/kernel_trace.py" "$csv" --nodes >"${csv%.csv}.txt"
  fi
done
exit $status
