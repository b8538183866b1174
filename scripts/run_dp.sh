#!/usr/bin/env bash
# Data-parallel training on this machine: N processes of a graphward program (default
# examples/train_dp), rank r on GPU r, meeting through a fresh NCCL id file (dist/process_group.h).
#   scripts/run_dp.sh N [program flags...]
# Environment: GW_DP_PROGRAM (the program; default $GW_BUILD_DIR/examples/train_dp), GW_BUILD_DIR
# (default build), GW_DP_TIMEOUT (seconds; past it every rank is killed, every rank's output
# printed and the exit status is 124; default: no limit). Rank 0's output is printed; another
# rank's only when it fails. The exit status is the first failing rank's (0 when all succeed); 77
# (skipped) when N exceeds the GPUs here and N > 1.
set -uo pipefail
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/run_dp.sh N [program flags...]  (N: the number of ranks, 1 or more)" >&2
  exit 2
fi
n=$1
shift
program=${GW_DP_PROGRAM:-${GW_BUILD_DIR:-build}/examples/train_dp}
if [ ! -x "$program" ]; then
  echo "run_dp.sh: $program is not built (scripts/run.sh builds the examples; or cmake --build" \
    "<build dir> --target train_dp; GW_BUILD_DIR or GW_DP_PROGRAM say where it is)" >&2
  exit 2
fi
if [ "$n" -gt 1 ]; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$gpus" -lt "$n" ]; then
    echo "run_dp.sh: skipped: $n ranks need $n GPUs; this machine has $gpus"
    exit 77
  fi
fi
# NVLink multicast (NCCL's NVLS) stays off unless asked for: on shared hosts a program using it
# can put the GPUs out of service.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# NCCL's graph mixing support off unless asked for: the faster replays (Note [NCCL graph mixing],
# dist/process_group.h); graphward reads the variable and never sets it.
export NCCL_GRAPH_MIXING_SUPPORT=${NCCL_GRAPH_MIXING_SUPPORT:-0}
dir=$(mktemp -d /tmp/graphward_dp.XXXXXX)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((r = 0; r < n; r++)); do
  GRAPHWARD_RANK=$r GRAPHWARD_WORLD_SIZE=$n GRAPHWARD_LOCAL_RANK=$r \
    GRAPHWARD_NCCL_ID_FILE="$dir/nccl_id" "$program" "$@" >"$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
# The time limit: a watchdog kills the ranks (and says so) when they run past it.
timed_out=$dir/timed_out
if [ -n "${GW_DP_TIMEOUT:-}" ]; then
  (
    sleep "$GW_DP_TIMEOUT" </dev/null >/dev/null 2>&1  # holds none of our output pipes
    touch "$timed_out"
    echo "run_dp.sh: the ranks ran past GW_DP_TIMEOUT=$GW_DP_TIMEOUT s; killing them" >&2
    kill -9 "${pids[@]}" 2>/dev/null
  ) &
  watchdog=$!
fi
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if [ -e "$timed_out" ]; then
    if [ $r -eq 0 ]; then cat "$dir/rank0.log"; else sed "s/^/[rank $r] /" "$dir/rank$r.log"; fi
    status=124
    continue
  fi
  if [ $r -eq 0 ]; then
    cat "$dir/rank0.log"
  elif [ $rc -ne 0 ]; then
    sed "s/^/[rank $r] /" "$dir/rank$r.log"
  fi
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
done
if [ -n "${watchdog:-}" ]; then
  kill "$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
fi
exit $status
