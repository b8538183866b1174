#!/usr/bin/env bash
# Data-parallel training on this machine: N processes of a graphward program (default
# examples/train_dp), rank r on GPU r, meeting through a fresh NCCL id file (dist/process_group.h).
#   scripts/run_dp.sh N [program flags...]
# Environment: GW_DP_PROGRAM (the program; default $GW_BUILD_DIR/examples/train_dp), GW_BUILD_DIR
# (default build). Rank 0's output is printed; another rank's only when it fails. The exit status
# is the first failing rank's (0 when all succeed); 77 (skipped) when N exceeds the GPUs here and
# N > 1.
set -uo pipefail
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/run_dp.sh N [program flags...]  (N: the number of ranks, 1 or more)" >&2
  exit 2
fi
n=$1
shift
program=${GW_DP_PROGRAM:-${GW_BUILD_DIR:-build}/examples/train_dp}
if [ ! -x "$program" ]; then
  echo "run_dp.sh: $program is not built (scripts/build.sh or cmake --build first)" >&2
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
dir=$(mktemp -d /tmp/graphward_dp.XXXXXX)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((r = 0; r < n; r++)); do
  GRAPHWARD_RANK=$r GRAPHWARD_WORLD_SIZE=$n GRAPHWARD_LOCAL_RANK=$r \
    GRAPHWARD_NCCL_ID_FILE="$dir/nccl_id" "$program" "$@" >"$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if [ $r -eq 0 ]; then
    cat "$dir/rank0.log"
  elif [ $rc -ne 0 ]; then
    sed "s/^/[rank $r] /" "$dir/rank$r.log"
  fi
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
done
exit $status
