#!/usr/bin/env bash
# The data-parallel check, on a machine with two GPUs or more: builds, runs the whole
# test suite (GPU and two-rank tests included; none may be skipped) and the data-parallel and
# step-graph GPU tests under compute-sanitizer memcheck, times train_dp on one GPU and on two
# ranks (the global batch doubled) for the MLP, a larger MLP and the 4-branch studies (and a few
# bucket and NCCL settings), writes traced replays' timelines and says how much of the reductions
# ran under the backward, and times PyTorch's DistributedDataParallel on the same models (eager
# and CUDA-graph captured); a summary table last.
# Full logs go to build/dp_check/, packed after each stage into $OUT/dp_check_logs.tar.gz when $OUT
# (an output folder to collect) is set.
#   scripts/dp_check.sh [--no-torch]
# Environment: GW_DP_STEPS (steps a timed run; default 60), GW_DP_TORCH_TIMEOUT (seconds a PyTorch
# run may take; default 90), GW_RECORD_AS_WE_GO=1 (each summary line printed as it is made).
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
LOG_DIR=$GW_BUILD_DIR/dp_check
rm -rf "$LOG_DIR"
mkdir -p "$LOG_DIR"
pack() {  # whoever collects $OUT may take only a few files: the logs so far, packed into one
  [ -z "${OUT:-}" ] || tar czf "$OUT/dp_check_logs.tar.gz" -C "$LOG_DIR" .
}
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

# 2. the whole suite (the GPU tests and the two-rank ones among them; none may be skipped), and
#    the data-parallel and step-graph GPU tests under compute-sanitizer memcheck
start=$SECONDS
(cd "$BIN" && ctest --output-on-failure -j 8 --timeout 300) >"$LOG_DIR/ctest.log" 2>&1
rc=$?
line=$(grep -E 'tests passed|tests failed' "$LOG_DIR/ctest.log" | tail -1)
gpu_tests=$(cd "$BIN" && ctest -L 'gpu|multigpu' -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p')
skipped=$(sed -n 's/^.* - \(.*\) (Skipped)$/\1/p' "$LOG_DIR/ctest.log" |
  grep -Fxf <(printf '%s\n' "$gpu_tests") | wc -l)
n_gpu=$(printf '%s\n' "$gpu_tests" | grep -c .)
if [ $rc -eq 0 ] && [ "$skipped" -eq 0 ]; then
  record ctest ok "$line; $n_gpu gpu and multigpu tests ran, none skipped; $((SECONDS - start)) s"
else
  record ctest FAIL "$line; $skipped of $n_gpu gpu/multigpu tests skipped"
  grep -E '\*\*\*|Failed' "$LOG_DIR/ctest.log" | head -10
fi
start=$SECONDS
timeout 120 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 99 \
  "$BIN/tests/graphward_gpu_tests" --gtest_filter='CudaDataParallel.*:CudaStepGraph.*' \
  >"$LOG_DIR/memcheck_dp.log" 2>&1
rc=$?
summary=$(grep -E 'ERROR SUMMARY' "$LOG_DIR/memcheck_dp.log" | tail -1 | sed 's/^========= //')
errors=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) errors\{0,1\}$/\1/p' \
  "$LOG_DIR/memcheck_dp.log")
known=$(sanitizer_known_reports memcheck <"$LOG_DIR/memcheck_dp.log")
tests=$(grep -E '^\[  (PASSED|FAILED)  \]' "$LOG_DIR/memcheck_dp.log" | head -1)
if { [ $rc -eq 0 ] || { [ $rc -eq 99 ] && [ "${errors:-x}" = "$known" ]; }; } &&
   grep -q '^\[  PASSED  \]' "$LOG_DIR/memcheck_dp.log" &&
   ! grep -q '^\[  FAILED  \]' "$LOG_DIR/memcheck_dp.log"; then
  record "memcheck dp+step" ok \
    "$summary ($known of them NCCL's known set-up reports); $tests; $((SECONDS - start)) s"
else
  record "memcheck dp+step" FAIL "rc=$rc $summary ($known known); $tests; see memcheck_dp.log"
fi
pack
# 3. step times: one rank (no reducer: the single-GPU step) against two, each rank the same batch
#    (the global batch doubled). BENCH_ENV: NCCL settings for the two-rank run.
median_of() {  # median_of LOG MODE -> ms/step
  sed -n "s/^  $2 .* \([0-9.]*\) ms\/step (median).*/\1/p" "$1" | head -1
}
# compare LOG_A LOG_B: "ok" or "FAIL", a tab, then each mode's median in A -> B and the ratio.
compare() {
  local mode detail="" ok=ok a b
  for mode in eager "backward graph" "step graph"; do
    a=$(median_of "$1" "$mode")
    b=$(median_of "$2" "$mode")
    if [ -z "$a" ] || [ -z "$b" ]; then
      ok=FAIL
      detail+="$mode: no figure; "
      continue
    fi
    detail+="$mode $a -> $b ms ($(python3 -c "print(f'{$b / $a:.2f}')")); "
  done
  printf '%s\t%s\n' "$ok" "$detail"
}
BENCH_ENV=""
bench() {  # bench NAME FLAGS...
  local name=$1 ok detail
  shift
  GW_DP_TIMEOUT=80 timeout 90 "$GW_ROOT/scripts/run_dp.sh" 1 --bench --steps "$STEPS" "$@" \
    >"$LOG_DIR/bench_${name}_1.log" 2>&1
  GW_DP_TIMEOUT=80 timeout 90 env $BENCH_ENV "$GW_ROOT/scripts/run_dp.sh" 2 --bench --steps "$STEPS" "$@" \
    >"$LOG_DIR/bench_${name}_2.log" 2>&1
  IFS=$'\t' read -r ok detail < <(compare "$LOG_DIR/bench_${name}_1.log" "$LOG_DIR/bench_${name}_2.log")
  record "dp $name" "$ok" "1 GPU -> 2 ranks${BENCH_ENV:+ ($BENCH_ENV)}: $detail"
}
# reducer_alone NAME FLAGS...: one GPU with a group of one reducing (train_dp --with-reducer:
# the copies and NCCL's kernels with no other GPU), against bench NAME's plain single-GPU run.
reducer_alone() {
  local name=$1 ok detail
  shift
  GW_DP_TIMEOUT=80 timeout 90 "$GW_ROOT/scripts/run_dp.sh" 1 --bench --with-reducer \
    --steps "$STEPS" "$@" >"$LOG_DIR/bench_${name}_1r.log" 2>&1
  IFS=$'\t' read -r ok detail < <(compare "$LOG_DIR/bench_${name}_1.log" "$LOG_DIR/bench_${name}_1r.log")
  record "reducer alone $name" "$ok" "1 GPU -> 1 GPU reducing: $detail"
}
MLP="--width 1024 --layers 4 --batch 256"
LARGE="--width 2048 --layers 8 --batch 512"
LARGE1K="--width 2048 --layers 8 --batch 1024"
BRANCHES="--branches 4 --width 256 --layers 8 --batch 64"
WIDE="--branches 4 --width 1024 --layers 4 --batch 256"
DEEP="--width 256 --layers 32 --batch 64"
bench mlp $MLP
bench mlp-large $LARGE
# NCCL's kernels on at most 4 CTAs (the SMs the 2048-wide GEMMs' one wave of 128 CTAs leaves
# free), with 16 MiB buckets (a layer's weight gradient each): docs/RESULTS.md, data parallelism within 1.1×
bench mlp-large-c4-16mib $LARGE --nccl-max-ctas 4 --bucket-mib 16
bench mlp-large-c4 $LARGE --nccl-max-ctas 4
bench mlp-large-b1024 $LARGE1K
bench branches $BRANCHES
bench branches-1mib $BRANCHES --bucket-mib 1
bench branches-2mib $BRANCHES --bucket-mib 2
bench branches-4mib $BRANCHES --bucket-mib 4
bench branches-1024 $WIDE
bench deep $DEEP
reducer_alone mlp-large $LARGE
reducer_alone branches $BRANCHES
# (The alternatives that were slower or made no difference — buckets averaged rather than summed,
# in plain rather than symmetric memory, every gradient staged, the gradients outside their buckets,
# NCCL's graph mixing, its CTA policies, NCCL_PROTO, NCCL_NTHREADS, CUDA_DEVICE_MAX_CONNECTIONS,
# normal-priority reductions, cuBLASLt's SM-count target: docs/DECISIONS.md and docs/RESULTS.md,
# the data-parallelism studies.)

pack
# 4. traced replays on two ranks: how much of the reductions ran under the backward's steps, and
#    how far the last one ran past them
trace() {  # trace NAME FLAGS...
  local name=$1
  shift
  GW_DP_TIMEOUT=50 timeout 60 "$GW_ROOT/scripts/run_dp.sh" 2 --mode backward --steps 10 "$@" \
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

pack
# 5. PyTorch's DistributedDataParallel on the same models (eager and CUDA-graph captured), and
#    what one all-reduce costs inside a CUDA graph here (the floor under a bucket's reduction)
if [ $TORCH = 1 ]; then
  timeout "${GW_DP_TORCH_TIMEOUT:-90}" python3 "$GW_ROOT/scripts/compare_torch_dp.py" \
    --allreduce-latency --world 2 >"$LOG_DIR/torch_allreduce_latency.log" 2>&1 ||
    pkill -9 -f spawn_main
  lat=$(sed -n 's/^torch_nccl_allreduce\/world:2\/mib:\([0-9.]*\)\/graph:1 \([0-9.]*\) us\/op.*/\1 MiB \2 us/p' \
    "$LOG_DIR/torch_allreduce_latency.log" | paste -sd ',' -)
  record "nccl all-reduce in a graph" "$([ -n "$lat" ] && echo ok || echo FAIL)" "${lat:-no figure}"
  for cfg in "mlp-large 1 2048 8 512" "branches 4 256 8 64"; do
    read -r name k w l b <<<"$cfg"
    detail=""
    for r in 1 2; do
      timeout "${GW_DP_TORCH_TIMEOUT:-90}" python3 "$GW_ROOT/scripts/compare_torch_dp.py" \
        --world $r --steps "$STEPS" \
        --branches "$k" --width "$w" --layers "$l" --batch "$b" \
        --csv "$LOG_DIR/torch_${name}_$r.csv" >"$LOG_DIR/torch_${name}_$r.log" 2>&1 ||
        pkill -9 -f spawn_main  # the ranks of a run cut short by the timeout
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

pack
echo
echo "================ graphward data-parallel check ================"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
