#!/usr/bin/env bash
# The data-parallel check (issue 8), on a machine with two GPUs or more: builds, runs the
# multi-GPU tests and the data-parallel GPU tests, times train_dp on one GPU and on two ranks (the
# global batch doubled) for the MLP, a larger MLP and the 4-branch studies (and a few bucket and
# NCCL settings), PyTorch's DistributedDataParallel on the same models (eager and CUDA-graph
# captured), writes traced replays' timelines and says how much of the reductions ran under the
# backward; a summary table last.
# Full logs go to $OUT/dp_check_logs.tar.gz (the device tool's output folder) when set, else to
# build/dp_check/.
#   scripts/dp_check.sh [--no-torch]
# Environment: GW_DP_STEPS (steps a timed run; default 60).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast stays off on shared hosts

TORCH=1
for a in "$@"; do
  case "$a" in
    --no-torch) TORCH=0 ;;
    *) echo "unknown argument $a"; exit 2 ;;
  esac
done
LOG_DIR=${OUT:+$OUT/dp}
LOG_DIR=${LOG_DIR:-$GW_BUILD_DIR/dp_check}
mkdir -p "$LOG_DIR"
BIN=$GW_BUILD_DIR
STEPS=${GW_DP_STEPS:-60}
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
record machine "$([ "$GPUS" -ge 2 ] && echo ok || echo FAIL)" "$GPUS GPU(s)"

# 1. build (no benchmarks: train_dp and the tests are what runs here)
start=$SECONDS
if ensure_deps >"$LOG_DIR/build.log" 2>&1 &&
   configure_and_build -DCMAKE_CUDA_ARCHITECTURES=90 -DGRAPHWARD_BUILD_BENCHMARKS=OFF \
     >>"$LOG_DIR/build.log" 2>&1; then
  record build ok "$((SECONDS - start)) s"
else
  record build FAIL "see build.log"; tail -30 "$LOG_DIR/build.log"
  printf '%s\n' "${SUMMARY[@]}"
  exit 1
fi

# 2. the multi-GPU tests (two ranks) and the data-parallel GPU tests (a group of one)
start=$SECONDS
(cd "$BIN" && ctest -L multigpu --output-on-failure --timeout 300) >"$LOG_DIR/ctest_multigpu.log" 2>&1
rc=$?
line=$(grep -E 'tests passed|tests failed' "$LOG_DIR/ctest_multigpu.log" | tail -1)
skipped=$(grep -c '(Skipped)' "$LOG_DIR/ctest_multigpu.log")
if [ $rc -eq 0 ] && [ "$skipped" -eq 0 ]; then
  record "ctest multigpu" ok "$line; $((SECONDS - start)) s"
else
  record "ctest multigpu" FAIL "$line; $skipped skipped"
fi
"$BIN/tests/graphward_gpu_tests" --gtest_filter='CudaDataParallel.*' >"$LOG_DIR/gtest_dp.log" 2>&1
if [ $? -eq 0 ] && grep -q '^\[  PASSED  \] 3 tests' "$LOG_DIR/gtest_dp.log"; then
  record "gtest CudaDataParallel" ok "3 tests"
else
  record "gtest CudaDataParallel" FAIL "see gtest_dp.log"
fi

# 3. step times: one rank (no reducer: the single-GPU step) against two, each rank the same batch
#    (the global batch doubled). BENCH_ENV: NCCL settings for the two-rank run.
median_of() {  # median_of LOG MODE -> ms/step
  sed -n "s/^  $2 .* \([0-9.]*\) ms\/step (median).*/\1/p" "$1" | head -1
}
BENCH_ENV=""
bench() {  # bench NAME FLAGS...
  local name=$1
  shift
  timeout 300 "$GW_ROOT/scripts/run_dp.sh" 1 --bench --steps "$STEPS" "$@" \
    >"$LOG_DIR/bench_${name}_1.log" 2>&1
  timeout 300 env $BENCH_ENV "$GW_ROOT/scripts/run_dp.sh" 2 --bench --steps "$STEPS" "$@" \
    >"$LOG_DIR/bench_${name}_2.log" 2>&1
  local mode detail="" ok=ok one two ratio
  for mode in eager "backward graph" "step graph"; do
    one=$(median_of "$LOG_DIR/bench_${name}_1.log" "$mode")
    two=$(median_of "$LOG_DIR/bench_${name}_2.log" "$mode")
    if [ -z "$one" ] || [ -z "$two" ]; then
      ok=FAIL
      detail+="$mode: no figure; "
      continue
    fi
    ratio=$(python3 -c "print(f'{$two / $one:.2f}')")
    detail+="$mode $one -> $two ms ($ratio); "
  done
  record "dp $name" "$ok" "1 GPU -> 2 ranks${BENCH_ENV:+ ($BENCH_ENV)}: $detail"
}
MLP="--width 1024 --layers 4 --batch 256"
LARGE="--width 2048 --layers 8 --batch 512"
BRANCHES="--branches 4 --width 256 --layers 8 --batch 64"
WIDE="--branches 4 --width 1024 --layers 4 --batch 256"
bench mlp $MLP
bench mlp-large $LARGE
bench mlp-large-b1024 --width 2048 --layers 8 --batch 1024
bench branches $BRANCHES
bench branches-4mib $BRANCHES --bucket-mib 4
bench branches-1024 $WIDE
BENCH_ENV="NCCL_MAX_CTAS=8" bench mlp-large-ctas8 $LARGE
BENCH_ENV="NCCL_MAX_CTAS=8" bench branches-ctas8 $BRANCHES

# 4. PyTorch's DistributedDataParallel on the same models (eager and CUDA-graph captured)
if [ $TORCH = 1 ]; then
  for cfg in "mlp-large 1 2048 8 512" "branches 4 256 8 64" "branches-1024 4 1024 4 256"; do
    read -r name k w l b <<<"$cfg"
    detail=""
    for r in 1 2; do
      timeout 300 python3 "$GW_ROOT/scripts/compare_torch_dp.py" --world $r --steps "$STEPS" \
        --branches "$k" --width "$w" --layers "$l" --batch "$b" \
        --csv "$LOG_DIR/torch_${name}_$r.csv" >"$LOG_DIR/torch_${name}_$r.log" 2>&1
      detail+="$r rank(s): $(grep -o 'mode:[a-z]*.* ms/step' "$LOG_DIR/torch_${name}_$r.log" |
        sed 's/\/world.*batch:[0-9]* / /' | paste -sd ',' -); "
    done
    if grep -q 'mode:graph.*ms/step' "$LOG_DIR/torch_${name}_2.log"; then
      record "torch ddp $name" ok "$detail"
    else
      record "torch ddp $name" FAIL "$detail see torch_${name}_2.log"
    fi
  done
fi

# 5. traced replays on two ranks: how much of the reductions ran under the backward's steps, and
#    how far the last one ran past them
trace() {  # trace NAME FLAGS...
  local name=$1
  shift
  timeout 120 "$GW_ROOT/scripts/run_dp.sh" 2 --mode backward --steps 10 "$@" \
    --trace "$LOG_DIR/trace_$name.json" >"$LOG_DIR/trace_$name.log" 2>&1
  local overlap
  overlap=$(python3 - "$LOG_DIR/trace_$name.json" <<'PY' 2>/dev/null
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
red = [e for e in events if e["name"].startswith("reduce bucket")]
steps = [e for e in events if not e["name"].startswith("reduce bucket")]
start = min(e["ts"] for e in steps)
end = max(e["ts"] + e["dur"] for e in steps)
total = sum(e["dur"] for e in red)
under = sum(max(0.0, min(e["ts"] + e["dur"], end) - e["ts"]) for e in red)
past = max([e["ts"] + e["dur"] - end for e in red] + [0.0])
print(f"backward {end - start:.0f} us; {len(red)} bucket(s), {total:.0f} us of reductions, "
      f"{100 * under / total if total else 0:.0f}% of it under the backward's steps; the last "
      f"ended {past:.0f} us after them")
PY
)
  if [ -n "$overlap" ]; then
    record "timeline $name" ok "$overlap"
  else
    record "timeline $name" FAIL "see trace_$name.log"
  fi
}
trace mlp $MLP
trace mlp-large $LARGE
trace branches $BRANCHES

if [ -n "${OUT:-}" ]; then  # the device tool returns at most 8 files: pack the logs into one
  tar czf "$OUT/dp_check_logs.tar.gz" -C "$LOG_DIR" . && rm -rf "$LOG_DIR"
fi
echo
echo "================ graphward data-parallel check ================"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
