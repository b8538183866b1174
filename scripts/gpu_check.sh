#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, builds with all cores, runs the whole test suite
# (the `gpu` label included, and fails if any GPU test was skipped), the package check with its CUDA
# consumers run on the GPU, runs the GPU tests under
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck: each fails on any report but the
# libraries' known ones, sanitizer_known_reports in common.sh) and its threads' tests in a
# ThreadSanitizer build, runs random programs, the soak,
# the example on the GPU and the benchmarks, and prints a one-screen summary last.
# Full logs go to $LOG_DIR when set, else to $OUT/logs (packed into $OUT/gpu_check_logs.tar.gz
# at the end) when $OUT (an output folder to collect) is set, else to build/gpu_check/.
#   scripts/gpu_check.sh [--no-sanitizer] [--no-soak] [--no-bench | --overlap-only | --models-only]
#   scripts/gpu_check.sh --compute-sanitizer-only
# --compute-sanitizer-only: the build and compute-sanitizer's runs (steps 1, 5 and 5b) alone — on a
# card whose memory cannot hold the four tools' processes at once, the tools split over two calls
# (GW_SANITIZER_TOOLS) without running the suite, the example and the ThreadSanitizer build twice.
# --overlap-only: of the benchmarks, only the overlap studies (bench/overlap_bench.cpp) and
# PyTorch's same studies (compare_torch.py --overlap), merged by scripts/overlap_table.py (and
# drawn by scripts/plot_overlap.py where matplotlib is installed).
# --models-only: of the benchmarks, only the real-model training steps (bench/models_bench.cpp)
# and PyTorch's (compare_torch.py --models), merged by scripts/models_table.py.
# Environment: GW_SANITIZER_TIMEOUT (seconds per tool, default 300), GW_SANITIZER_SHARDS (GTest
# shards of each tool, run in parallel; default 3 for memcheck and synccheck, 4 for racecheck, 12
# for initcheck (on a card under 100 GiB memcheck 2, synccheck 1, racecheck 2, initcheck 5);
# GW_SANITIZER_SHARDS_<tool>, e.g. GW_SANITIZER_SHARDS_initcheck, for one tool's),
# GW_SANITIZER_DONE (a folder: each tool's tests passed on this build are kept there and left
# out of the next run, which goes on where a run cut by its time stopped), GW_SANITIZER_SERIAL=1 (the
# four sanitizer tools one after another instead of at once), GW_SANITIZER_TOOLS (a subset, e.g.
# "memcheck initcheck"; default all four; "" none), GW_SANITIZER_FILTER (a GTest filter for the
# tools' runs alone; GTEST_FILTER in the environment would also narrow the tests ctest discovers
# at build time, and with them the suite), GW_FUZZ_PROGRAMS (random programs of step 2b,
# default 1000; tests/fuzz), GW_FUZZ_SANITIZER_PROGRAMS (of them under racecheck and synccheck,
# step 5b; default 100, 0 none), GW_TSAN_REPEAT (runs of the threads' tests in a ThreadSanitizer
# build, step 5c; default 5), GW_TORCH_MODEL_MODES (compare_torch.py --models --modes; default
# every mode), GW_TORCH_MODELS_TIMEOUT (seconds for PyTorch's model rows, default 540),
# GW_RACECHECK_KERNELS (the kernels racecheck instruments, by name substring; default
# "graphward nvjet": graphward's and cuBLASLt's Hopper kernels; see sanitize()),
# GW_RACECHECK_SKIP (a GTest filter of tests racecheck leaves out; default the TF32 convolution
# switch's test, "" none; see sanitize()).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SANITIZE=1 BENCH=1 OVERLAP=1 MODELS=1 SOAK=1 SUITE=1 TSAN=1
for a in "$@"; do
  case "$a" in
    --no-sanitizer) SANITIZE=0 ;;
    --no-soak) SOAK=0 ;;
    --no-bench) BENCH=0 OVERLAP=0 MODELS=0 ;;
    --overlap-only) BENCH=0 OVERLAP=1 MODELS=0 ;;
    --models-only) BENCH=0 OVERLAP=0 MODELS=1 ;;
    --compute-sanitizer-only) SUITE=0 TSAN=0 SOAK=0 BENCH=0 OVERLAP=0 MODELS=0 ;;
    *) echo "unknown argument $a"; exit 2 ;;
  esac
done
LOG_DIR=${LOG_DIR:-${OUT:+$OUT/logs}}
LOG_DIR=${LOG_DIR:-$GW_BUILD_DIR/gpu_check}
mkdir -p "$LOG_DIR"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -2
  cmake --version | head -1
  date -u
} >"$LOG_DIR/machine.txt" 2>&1
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
record machine "$([ -n "$GPU_NAME" ] && echo ok || echo FAIL)" "${GPU_NAME:-no GPU visible}"

# 1. build
start=$SECONDS
if ensure_deps >"$LOG_DIR/build.log" 2>&1 &&
   configure_and_build -DCMAKE_CUDA_ARCHITECTURES=90 >>"$LOG_DIR/build.log" 2>&1; then
  warnings=$(grep -c -i 'warning' "$LOG_DIR/build.log")
  record build ok "$((SECONDS - start)) s, $warnings warning lines"
else
  record build FAIL "see build.log"; tail -30 "$LOG_DIR/build.log"
  printf '%s\n' "${SUMMARY[@]}"; exit 1
fi
BIN=$GW_BUILD_DIR

if [ $SUITE = 1 ]; then
# 2. the whole suite
start=$SECONDS
(cd "$BIN" && ctest --output-on-failure -j 8 --timeout 180) >"$LOG_DIR/ctest.log" 2>&1
rc=$?
line=$(grep -E 'tests passed|tests failed' "$LOG_DIR/ctest.log" | tail -1)
# The label `gpu` exactly (ctest -L takes a regex: "gpu" matches `multigpu` too); the two-rank
# tests (`multigpu`) count only where there are two GPUs — scripts/dp_check.sh runs them there.
labels='^gpu$'
[ "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)" -ge 2 ] &&
  labels='^(gpu|multigpu)$'
gpu_tests=$(cd "$BIN" && ctest -L "$labels" -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p')
n_gpu=$(printf '%s\n' "$gpu_tests" | grep -c .)
# A GPU test that skipped on a GPU machine is a failure; CPU tests that pin no-GPU behaviour skip.
skipped_gpu=$(sed -n 's/^.* - \(.*\) (Skipped)$/\1/p' "$LOG_DIR/ctest.log" | grep -Fxf <(printf '%s\n' "$gpu_tests") | wc -l)
if [ $rc -eq 0 ] && [ "$skipped_gpu" -eq 0 ] && [ "$n_gpu" -gt 0 ]; then
  record ctest ok "$line; $n_gpu gpu tests ran, none skipped; $((SECONDS - start)) s"
else
  record ctest FAIL "$line; $skipped_gpu of $n_gpu gpu tests skipped"
  grep -E 'Failed|\*\*\*|Skipped' "$LOG_DIR/ctest.log" | head -20
fi

# 2b. random programs (tests/fuzz): GW_FUZZ_PROGRAMS (default 1000) programs on one stream, on
# their streams and replayed, against the float64 CPU program (the suite itself runs 25).
start=$SECONDS
GW_FUZZ_PROGRAMS=${GW_FUZZ_PROGRAMS:-1000} timeout 300 "$BIN/tests/graphward_gpu_tests" \
  --gtest_filter='FuzzCuda.*' >"$LOG_DIR/fuzz.log" 2>&1
if [ $? -eq 0 ] && grep -q '^\[  PASSED  \] 1 test' "$LOG_DIR/fuzz.log"; then
  record fuzz ok "${GW_FUZZ_PROGRAMS:-1000} random programs; $((SECONDS - start)) s"
else
  record fuzz FAIL "see fuzz.log"
  grep -A3 -E 'Failure|Failed' "$LOG_DIR/fuzz.log" | head -12
fi

# 2c. graphward as another project's dependency (scripts/check_package.sh), the CUDA build
# included: its consumers run here on the GPU (the .cu consumer's kernel among them).
start=$SECONDS
if GW_PACKAGE_CUDA=ON GW_PACKAGE_DIR="$GW_BUILD_DIR-package" bash "$GW_ROOT/scripts/check_package.sh" \
  >"$LOG_DIR/package.log" 2>&1; then
  record package ok "$(tail -1 "$LOG_DIR/package.log" | sed 's/^\[graphward\] package: //'); $((SECONDS - start)) s"
else
  record package FAIL "$(tail -1 "$LOG_DIR/package.log")"
fi
fi

# 3a. the soak (bench/soak.cpp): GW_SOAK_STEPS (default 100000) replayed steps of the 4-branch
# study with memory sampled, then 24000 steps whose signature changes every 5 steps (more sizes
# than the graph cache holds); each fails on memory growth after its warm-up.
if [ $SOAK = 1 ] && [ -x "$BIN/bench/graphward_soak" ]; then
  for run in fixed changing; do
    start=$SECONDS
    args=(--steps "${GW_SOAK_STEPS:-100000}" --sample-every 1000)
    [ $run = changing ] && args=(--steps 24000 --sample-every 600 --change-every 5)
    if timeout 300 "$BIN/bench/graphward_soak" "${args[@]}" --csv "$LOG_DIR/soak_$run.csv" \
         >"$LOG_DIR/soak_$run.log" 2>&1; then
      record "soak $run" ok "$(grep -E '^samples' "$LOG_DIR/soak_$run.log" | sed 's/^samples: [0-9]*; //' | cut -c1-150); $((SECONDS - start)) s"
    else
      record "soak $run" FAIL "see soak_$run.log"; tail -4 "$LOG_DIR/soak_$run.log"
    fi
  done
fi

if [ $SUITE = 1 ]; then
# 3. the example on the GPU, with the built-in timeline of a traced replay and of an eager backward
if "$BIN/examples/train_branches" --steps 200 --trace "$LOG_DIR/timeline_replay.json" \
     >"$LOG_DIR/example.log" 2>&1 &&
   "$BIN/examples/train_branches" --steps 20 --eager --trace "$LOG_DIR/timeline_eager.json" \
     >"$LOG_DIR/example_eager.log" 2>&1; then
  record example ok "$(tail -1 "$LOG_DIR/example.log"); $(grep '^timeline' "$LOG_DIR/example.log" | cut -c1-60)"
else
  record example FAIL "$(tail -1 "$LOG_DIR/example.log") / $(tail -1 "$LOG_DIR/example_eager.log")"
fi
fi

# 4. benchmarks: graphward's, then PyTorch's same study in the same run, in two alternating
# rounds (graphward, PyTorch, graphward, PyTorch): host-bound figures drift on these machines, and
# a ratio is only trusted when both rounds agree.
if [ $BENCH = 1 ] && [ -x "$BIN/bench/graphward_bench_ops" ]; then
  start=$SECONDS
  ok=1
  "$BIN/bench/graphward_bench_ops" --benchmark_repetitions=3 \
     --benchmark_report_aggregates_only=true --benchmark_out="$LOG_DIR/bench_ops.json" \
     --benchmark_out_format=json >"$LOG_DIR/bench_ops.txt" 2>&1 || ok=0
  have_torch=0
  python3 -c 'import torch' 2>/dev/null && have_torch=1
  for round in 1 2; do
    "$BIN/bench/graphward_bench_autograd" --benchmark_repetitions=3 \
       --benchmark_report_aggregates_only=true --benchmark_out="$LOG_DIR/bench_autograd_r$round.json" \
       --benchmark_out_format=json >"$LOG_DIR/bench_autograd_r$round.txt" 2>&1 || ok=0
    if [ $have_torch = 1 ]; then
      PYTHONUNBUFFERED=1 python3 "$GW_ROOT/scripts/compare_torch.py" --iters 200 \
        --csv "$LOG_DIR/torch_eager_backward_r$round.csv" >"$LOG_DIR/torch_eager_backward_r$round.txt" 2>&1 || ok=0
    fi
  done
  # The captured backward and PyTorch's own CUDA graph of it.
  if [ -x "$BIN/bench/graphward_bench_capture" ]; then
    timeout 300 "$BIN/bench/graphward_bench_capture" --benchmark_repetitions=3 \
       --benchmark_report_aggregates_only=true --benchmark_out="$LOG_DIR/bench_capture.json" \
       --benchmark_out_format=json >"$LOG_DIR/bench_capture.txt" 2>&1 || ok=0
    if [ $have_torch = 1 ]; then
      PYTHONUNBUFFERED=1 python3 "$GW_ROOT/scripts/compare_torch.py" --graph --iters 200 \
        --csv "$LOG_DIR/torch_graph_backward.csv" >"$LOG_DIR/torch_graph_backward.txt" 2>&1 || ok=0
    fi
  fi
  if [ $ok = 1 ]; then
    record bench ok "bench_*.json, torch_eager_backward_r*.csv; $((SECONDS - start)) s"
  else
    record bench FAIL "see bench_*.txt / torch_eager_backward_r*.txt"
  fi
fi

# 4b. the overlap studies, graphward's then PyTorch's, in the same run, side by side
if [ $OVERLAP = 1 ] && [ -x "$BIN/bench/graphward_bench_overlap" ]; then
  start=$SECONDS
  ok=1
  # Two runs (docs/DESIGN.md's studies, then the sweep), each within its own limit: a run cut short
  # still gives the rows it finished (overlap_table.py reads a truncated JSON file's entries).
  for part in studies sweep; do
    filter='^Overlap/' limit=120
    [ $part = sweep ] && filter='^OverlapSweep/' limit=420
    timeout $limit "$BIN/bench/graphward_bench_overlap" --benchmark_filter="$filter" \
       --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
       --benchmark_out="$LOG_DIR/bench_overlap_$part.json" --benchmark_out_format=json \
       >"$LOG_DIR/bench_overlap_$part.txt" 2>&1 || ok=0
  done
  torch_csv=
  if python3 -c 'import torch' 2>/dev/null; then
    PYTHONUNBUFFERED=1 timeout 400 python3 "$GW_ROOT/scripts/compare_torch.py" --overlap --iters 100 \
      --csv "$LOG_DIR/torch_overlap.csv" >"$LOG_DIR/torch_overlap.txt" 2>&1 || ok=0
    torch_csv="$LOG_DIR/torch_overlap.csv"
  fi
  python3 "$GW_ROOT/scripts/overlap_table.py" \
    "$LOG_DIR/bench_overlap_studies.json,$LOG_DIR/bench_overlap_sweep.json" $torch_csv \
    --csv "$LOG_DIR/overlap_merged.csv" >"$LOG_DIR/overlap_table.txt" 2>&1 || ok=0
  python3 "$GW_ROOT/scripts/plot_overlap.py" "$LOG_DIR/overlap_merged.csv" \
    "$LOG_DIR/overlap_sweep.png" >>"$LOG_DIR/overlap_table.txt" 2>&1 || true  # matplotlib optional
  if [ $ok = 1 ]; then
    record overlap ok "overlap_table.txt; $((SECONDS - start)) s"
  else
    record overlap FAIL "see bench_overlap_*.txt / torch_overlap.txt / overlap_table.txt"
  fi
fi

# 4c. the real-model training steps, graphward's then PyTorch's, side by side
if [ $MODELS = 1 ] && [ -x "$BIN/bench/graphward_bench_models" ]; then
  start=$SECONDS
  ok=1
  timeout 300 "$BIN/bench/graphward_bench_models" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$LOG_DIR/bench_models.json" \
    --benchmark_out_format=json >"$LOG_DIR/bench_models.txt" 2>&1 || ok=0
  : >"$LOG_DIR/examples.txt"
  for example in train_mlp train_convnet train_transformer; do
    "$BIN/examples/$example" --steps 300 >>"$LOG_DIR/examples.txt" 2>&1 || ok=0
  done
  "$BIN/examples/train_rnn" --steps 200 >>"$LOG_DIR/examples.txt" 2>&1 || ok=0
  torch_csv=
  if python3 -c 'import torch' 2>/dev/null; then
    # Every PyTorch mode (torch.compile's rows compile first: minutes); GW_TORCH_MODEL_MODES picks
    # a subset. The CSV keeps the rows finished if the time runs out.
    PYTHONUNBUFFERED=1 timeout "${GW_TORCH_MODELS_TIMEOUT:-540}" python3 \
      "$GW_ROOT/scripts/compare_torch.py" --models --iters 200 \
      ${GW_TORCH_MODEL_MODES:+--modes "$GW_TORCH_MODEL_MODES"} \
      --csv "$LOG_DIR/torch_models.csv" >"$LOG_DIR/torch_models.txt" 2>&1 || ok=0
    torch_csv="$LOG_DIR/torch_models.csv"
  fi
  { cat "$LOG_DIR/examples.txt"
    python3 "$GW_ROOT/scripts/models_table.py" "$LOG_DIR/bench_models.json" $torch_csv; } \
    >"$LOG_DIR/models_table.txt" 2>&1 || ok=0
  if [ $ok = 1 ]; then
    record models ok "models_table.txt; $((SECONDS - start)) s"
  else
    record models FAIL "see bench_models.txt / torch_models.txt / examples.txt / models_table.txt"
  fi
fi

# 5. compute-sanitizer over the GPU tests: the four tools at once (GW_SANITIZER_SERIAL=1: one by
# one), each within GW_SANITIZER_TIMEOUT seconds.
# filter_without FILTER PATTERNS: the GTest filter FILTER (empty: every test) that also leaves out
# PATTERNS (':'-separated; empty: nothing more).
filter_without() {
  if [ -z "$2" ]; then
    echo "$1"
    return
  fi
  case "$1" in
    *-*) echo "$1:$2" ;;
    *) echo "${1:-*}-$2" ;;
  esac
}
# shard_is_clean TOOL LOG: whether one process's log has no failed test, no broken tool and no
# report but the libraries' known ones (a process cut by its time included: what it finished).
shard_is_clean() {
  grep -q -E '^\[  FAILED  \]|Internal Sanitizer Error' "$2" && return 1
  local reports known
  reports=$(grep -E '^========= [^ ]' "$2" |
    grep -c -v -E '^========= (COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned)')
  known=$(sanitizer_known_reports "$1" <"$2")
  [ "$reports" -eq "$known" ]
}
sanitize() {  # sanitize TOOL: runs it, leaves its exit status in $LOG_DIR/sanitizer_TOOL.rc
  local tool=$1 extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  # racecheck checks shared-memory hazards in graphward's own kernels (every one is in namespace
  # graphward) and in cuBLASLt's bfloat16 Hopper kernels (nvjet_*, launched in clusters): left
  # out, the first of those in a process ended it in "Internal Sanitizer Error: The Sanitizer
  # failed to handle a hardware exception" even with no kernel instrumented at all; instrumented,
  # they run (slowly: the transformer example's steps took 2.5 s). The other libraries' kernels
  # are left out: they were most of its time (the 2048³ busy-work GEMMs), and cuDNN's
  # fused-attention kernels, warp-specialized, hand shared-memory tiles over through mbarriers
  # and named barriers racecheck does not follow (23 reports, thousands of hazards).
  # One test is left out of racecheck's run: cuDNN's TF32 convolution candidates of
  # CudaTf32.TheConvSwitch… end the process in the same "failed to handle a hardware exception",
  # with cuDNN's find and with its heuristic, whatever is instrumented (nothing of graphward's runs
  # there that other tests do not run); the other three tools run it.
  local filter=${GW_SANITIZER_FILTER:-}
  if [ "$tool" = racecheck ]; then
    local k
    for k in ${GW_RACECHECK_KERNELS:-graphward nvjet}; do extra+=(--kernel-name "kns=$k"); done
    local skip=${GW_RACECHECK_SKIP-CudaTf32.TheConvSwitch*}
    filter=$(filter_without "$filter" "$skip")
  fi
  # GW_SANITIZER_DONE=DIR: the tests that passed under this tool in a clean process, by build,
  # are kept in DIR/TOOL.done, and a later run on the same build (the test binary's hash) leaves
  # them out — a tool cut by its time goes on where it stopped, in the next run, instead of
  # starting again. A process (shard) counts only whole: no failed test, no broken tool and no
  # report but the known ones, else none of its tests is kept.
  local done_file= build_id= left_out=0
  if [ -n "${GW_SANITIZER_DONE:-}" ]; then
    mkdir -p "$GW_SANITIZER_DONE"
    done_file=$GW_SANITIZER_DONE/$tool.done
    build_id=$(sha256sum "$BIN/tests/graphward_gpu_tests" 2>/dev/null | cut -c1-16)
    local done_tests=
    [ -f "$done_file" ] && done_tests=$(awk -v b="$build_id" '$1 == b { print $2 }' "$done_file" | sort -u)
    if [ -n "$done_tests" ]; then
      left_out=$(printf '%s\n' "$done_tests" | wc -l)
      done_tests=$(printf '%s\n' "$done_tests" | paste -sd: -)
      filter=$(filter_without "$filter" "$done_tests")
    fi
  fi
  # synccheck cannot follow cuDNN's fused-attention kernels (library code, warp-specialized: warps
  # of a block meet at named barriers in groups): it overflowed its table of tracked barriers
  # (raised to 256 here), then reported their group barriers as divergent threads and aborted the
  # kernel, failing every later test of the process. They are left out of its instrumentation.
  [ "$tool" = synccheck ] &&
    extra=(--num-cuda-barriers 256 --kernel-name-exclude kns=cudnn_generated_fort_native_sdpa)
  # initcheck instruments every kernel: one left out writes memory the tool then believes
  # uninitialized, and every later read of it is reported (excluding cuBLAS's GEMM kernels drew 650,000 such reports from graphward's kernels and cuBLASLt's own
  # split-K and epilogue kernels reading what those GEMMs wrote). Three library behaviours remain
  # (sanitizer_known_reports, scripts/common.sh): cuBLASLt's small-n bfloat16 kernels load the output matrix
  # although beta is 0 and discard it; cuBLASLt's epilogue kernel, writing ReLU's bit mask,
  # reads the last byte of a row back (one byte at a time) to keep the row's padding bits, which
  # nothing reads (rows are padded to 128 bits, Note [Backward epilogue fusion]); and cuDNN's
  # Hopper fused-attention backward (deterministic: dQ accumulated in order), whose thread 0 of
  # every block reads one 4-byte word of its workspace, in a replayed graph only. The tool does not
  # see a captured graph's memset nodes write (the reason kernels/norm.cu zeroes with a kernel):
  # the CudaAttention tests poison every new block, the workspace's included, with such a node
  # before cuDNN's kernels in the replay, and the reports come all the same, while an eager
  # backward (its memsets seen) draws none. Those reports are printed and counted; the run passes
  # when they are all the reports there are.
  # graphward marks what each of its GEMMs writes through NVTX (Note [GEMM outputs and initcheck],
  # kernels/gemm.cu): the tool does not see the stores of cuBLAS's bfloat16 nvjet kernels; --nvtx
  # yes has it read the marks.
  [ "$tool" = initcheck ] && extra=(--print-limit 50000 --nvtx yes)
  # initcheck instruments every cuDNN candidate that cudnnFind* times (minutes per shape): its
  # run ranks algorithms by the heuristic instead (Note [cuDNN plans]); the other tools time them.
  local find=1
  [ "$tool" = initcheck ] && find=0
  # The tools run the suite with Note [Choosing a GEMM algorithm]'s timing off (each new GEMM
  # shape's timing launches every candidate a dozen times: minutes a shape under a tool); the
  # CudaGemmChoice tests turn it on for themselves, so the timing's own launches are checked.
  # Each tool runs the suite in GTest shards, in parallel (GW_SANITIZER_SHARDS, else memcheck's and
  # synccheck's 3, racecheck's 4, initcheck's 12 — the slowest by far): a single process of one
  # tool would be the run's longest; the tool's log is the shards' logs in order, its status the
  # first failing shard's.
  # Each process of a tool holds device memory of its own: on an 80 GB card five synccheck
  # processes took all of it ("Unable to allocate enough memory", every shard), and so did
  # fourteen of the four tools at once, while ten (memcheck 2, racecheck 2, synccheck 1,
  # initcheck 5) fitted — the defaults on a card under 100 GiB.
  local shards=3
  case "$tool" in
    racecheck) shards=4 ;;
    initcheck) shards=12 ;;
  esac
  if [ "${CARD_MIB:-0}" -gt 0 ] && [ "$CARD_MIB" -lt 102400 ]; then
    case "$tool" in
      memcheck | racecheck) shards=2 ;;
      synccheck) shards=1 ;;
      initcheck) shards=5 ;;
    esac
  fi
  local per_tool=GW_SANITIZER_SHARDS_$tool
  shards=${!per_tool:-${GW_SANITIZER_SHARDS:-$shards}}
  local start=$SECONDS i
  for ((i = 0; i < shards; i++)); do
    (
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i GRAPHWARD_CUDNN_FIND=$find \
        GRAPHWARD_GEMM_TUNING=0 \
        timeout "${GW_SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool "$tool" "${extra[@]}" \
        --error-exitcode 99 "$BIN/tests/graphward_gpu_tests" ${filter:+"--gtest_filter=$filter"} \
        >"$LOG_DIR/sanitizer_$tool.$i.log" 2>&1
      echo $? >"$LOG_DIR/sanitizer_$tool.$i.rc"
    ) &
  done
  wait
  local rc=0 r passed=0 n others=0
  : >"$LOG_DIR/sanitizer_$tool.log"
  for ((i = 0; i < shards; i++)); do
    read -r r <"$LOG_DIR/sanitizer_$tool.$i.rc"
    [ "$rc" -eq 0 ] && rc=$r
    [ "$r" -ne 0 ] && [ "$r" -ne 99 ] && others=1  # a timeout, a crash
    # A test that failed, or a tool that broke (its "Internal Sanitizer Error"), fails the tool's
    # run whatever the exit status says: --error-exitcode's 99 stands for a failed test too.
    grep -q -E '^\[  FAILED  \]|Internal Sanitizer Error' "$LOG_DIR/sanitizer_$tool.$i.log" &&
      others=1
    if [ -n "$done_file" ] && shard_is_clean "$tool" "$LOG_DIR/sanitizer_$tool.$i.log"; then
      sed -n 's/^\[       OK \] \([^ ]*\) .*/\1/p' "$LOG_DIR/sanitizer_$tool.$i.log" |
        sed "s/^/$build_id /" >>"$done_file"
    fi
    cat "$LOG_DIR/sanitizer_$tool.$i.log" >>"$LOG_DIR/sanitizer_$tool.log"
    n=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$LOG_DIR/sanitizer_$tool.$i.log" | head -1)
    passed=$((passed + ${n:-0}))
    rm -f "$LOG_DIR/sanitizer_$tool.$i.log" "$LOG_DIR/sanitizer_$tool.$i.rc"
  done
  [ "$others" -eq 1 ] && [ "$rc" -eq 0 ] && rc=1
  local log="$LOG_DIR/sanitizer_$tool.log"
  # The tool's own lack of device memory is not the code's fault: say so, and what to change.
  grep -q 'Unable to allocate enough memory' "$log" &&
    echo "$tool: the tool ran out of device memory ($shards processes of it, ${CARD_MIB:-?} MiB card, beside the other tools unless GW_SANITIZER_SERIAL=1): not a result; run fewer shards (GW_SANITIZER_SHARDS_$tool) or the tools one by one" >>"$log"
  if [ "$rc" -eq 99 ] && [ "$others" -eq 0 ] && ! grep -q 'errors were not printed' "$log"; then
    local errors allowed
    # memcheck, synccheck and initcheck count their reports in ERROR SUMMARY, racecheck its
    # hazards in RACECHECK SUMMARY.
    errors=$(sed -n -e 's/^========= ERROR SUMMARY: \([0-9]*\) errors\{0,1\}$/\1/p' \
      -e 's/^========= RACECHECK SUMMARY: \([0-9]*\) hazards\{0,1\} displayed.*/\1/p' "$log" |
      awk '{ s += $1 } END { print s + 0 }')
    allowed=$(sanitizer_known_reports "$tool" <"$log")
    if [ "$errors" -eq "$allowed" ]; then
      rc=0
      echo "$tool: all $errors reports are the libraries' known ones (sanitizer_known_reports)" >>"$log"
    else
      echo "$tool: $errors reports, of which $allowed are the libraries' known ones" >>"$log"
    fi
  fi
  if [ -n "$done_file" ]; then
    echo "$tool: $(awk -v b="$build_id" '$1 == b { print $2 }' "$done_file" | sort -u | wc -l) tests done under it on this build, $left_out of them before this run (GW_SANITIZER_DONE)" >>"$log"
  fi
  echo "[  PASSED  ] $passed tests in $shards shard(s)" >>"$log"
  echo "$rc $((SECONDS - start))" >"$LOG_DIR/sanitizer_$tool.rc"
}
# 5b. the random programs under racecheck and synccheck: GW_FUZZ_SANITIZER_PROGRAMS (default 100;
# 0 leaves this out), with the same exclusions as the suite's run.
sanitize_fuzz() {  # sanitize_fuzz TOOL: as sanitize, for the FuzzCuda test alone (log fuzz_TOOL)
  local tool=$1 extra=()
  # One test is left out of racecheck's run: cuDNN's TF32 convolution candidates of
  # CudaTf32.TheConvSwitch… end the process in the same "failed to handle a hardware exception",
  # with cuDNN's find and with its heuristic, whatever is instrumented (nothing of graphward's runs
  # there that other tests do not run); the other three tools run it.
  local filter=${GW_SANITIZER_FILTER:-}
  if [ "$tool" = racecheck ]; then
    local k
    for k in ${GW_RACECHECK_KERNELS:-graphward nvjet}; do extra+=(--kernel-name "kns=$k"); done
    local skip=${GW_RACECHECK_SKIP-CudaTf32.TheConvSwitch*}
    filter=$(filter_without "$filter" "$skip")
  fi
  local start=$SECONDS
  GW_FUZZ_PROGRAMS=$FUZZ_SANITIZED GRAPHWARD_GEMM_TUNING=0 timeout "${GW_SANITIZER_TIMEOUT:-300}" compute-sanitizer \
    --tool "$tool" "${extra[@]}" --error-exitcode 99 "$BIN/tests/graphward_gpu_tests" \
    --gtest_filter='FuzzCuda.*' >"$LOG_DIR/sanitizer_fuzz_$tool.log" 2>&1
  echo "$? $((SECONDS - start))" >"$LOG_DIR/sanitizer_fuzz_$tool.rc"
}
FUZZ_SANITIZED=${GW_FUZZ_SANITIZER_PROGRAMS:-100}
CARD_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
CARD_MIB=${CARD_MIB//[^0-9]/}
if [ $SANITIZE = 1 ]; then
  read -r -a tools <<<"${GW_SANITIZER_TOOLS-memcheck racecheck synccheck initcheck}"
  fuzz_tools=()
  [ "$FUZZ_SANITIZED" -gt 0 ] && fuzz_tools=(racecheck synccheck)
  if [ "${GW_SANITIZER_SERIAL:-0}" = 1 ]; then
    for tool in "${tools[@]}"; do sanitize "$tool"; done
    for tool in "${fuzz_tools[@]}"; do sanitize_fuzz "$tool"; done
  else
    for tool in "${tools[@]}"; do sanitize "$tool" & done
    for tool in "${fuzz_tools[@]}"; do sanitize_fuzz "$tool" & done
    wait
  fi
  for tool in "${fuzz_tools[@]}"; do
    read -r rc secs <"$LOG_DIR/sanitizer_fuzz_$tool.rc"
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG_DIR/sanitizer_fuzz_$tool.log" | tail -1)
    tests=$(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$LOG_DIR/sanitizer_fuzz_$tool.log" | head -1)
    if [ "$rc" -eq 0 ] && grep -q '^\[  PASSED  \] 1 test' "$LOG_DIR/sanitizer_fuzz_$tool.log"; then
      record "fuzz $tool" ok "$FUZZ_SANITIZED programs; ${summary:-no summary}; $secs s"
    else
      record "fuzz $tool" FAIL "rc=$rc ${summary}; $tests; $secs s"
      grep -E '=========' "$LOG_DIR/sanitizer_fuzz_$tool.log" | head -12
    fi
  done
  for tool in "${tools[@]}"; do
    read -r rc secs <"$LOG_DIR/sanitizer_$tool.rc"
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG_DIR/sanitizer_$tool.log" |
      sed 's/^========= //' | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
    tests=$(grep -E '^\[  FAILED  \]' "$LOG_DIR/sanitizer_$tool.log" | head -1)
    tests=${tests:-$(tail -1 "$LOG_DIR/sanitizer_$tool.log")}
    known=$(grep "^$tool: " "$LOG_DIR/sanitizer_$tool.log" | paste -sd ";" -)
    [ -n "$known" ] && tests="$tests; $known"
    if [ "$rc" -eq 0 ]; then
      record "sanitizer $tool" ok "${summary:-no summary}; $tests; $secs s"
    else
      record "sanitizer $tool" FAIL "rc=$rc ${summary}; $tests; $secs s"
      grep -E '=========' "$LOG_DIR/sanitizer_$tool.log" | head -12
    fi
  done
fi

# 5c. the threads' GPU tests in a ThreadSanitizer build (GW_TSAN_REPEAT runs each, default 5): TSan's
# schedule once lost a two-thread loop's capture to the other thread's end (Note [Device-wide waits
# and other threads' captures]). Its reports are off here: the CUDA driver's own threads are not
# instrumented (the CPU suite's ThreadSanitizer job in .ci/run reports them); a failed test fails.
if [ $SANITIZE = 1 ] && [ $TSAN = 1 ]; then
  start=$SECONDS
  if GW_BUILD_DIR=$GW_BUILD_DIR-tsan GW_BUILD_TARGETS=graphward_gpu_tests \
     configure_and_build -DCMAKE_CUDA_ARCHITECTURES=90 -DGRAPHWARD_SANITIZE=thread \
     -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHWARD_BUILD_BENCHMARKS=OFF >"$LOG_DIR/tsan_build.log" 2>&1 &&
     (cd "$GW_BUILD_DIR-tsan/tests" && TSAN_OPTIONS=report_bugs=0 ./graphward_gpu_tests \
       --gtest_filter='CudaThreads.*' --gtest_repeat="${GW_TSAN_REPEAT:-5}" >"$LOG_DIR/tsan_threads.log" 2>&1); then
    record "threads under TSan" ok "CudaThreads.* x${GW_TSAN_REPEAT:-5}; $((SECONDS - start)) s"
  else
    record "threads under TSan" FAIL "$(grep -m1 -E 'FAILED|error' "$LOG_DIR/tsan_threads.log" "$LOG_DIR/tsan_build.log" 2>/dev/null); $((SECONDS - start)) s"
  fi
fi

side_by_side() {  # per round: graphward's EagerBackward medians, the hand-written floor, PyTorch
  python3 - "$LOG_DIR" <<'PY' 2>/dev/null
import csv, json, os, sys
d = sys.argv[1]
def medians(path, prefix):
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median" and b["name"].startswith(prefix):
            key = b["name"].split("/", 1)[1].split("/min_time")[0].replace("/manual_time", "")
            out[key] = b
    return out
print(f"{'eager backward (medians, us)':50s} {'rnd':>3s} {'gw wall':>8s} {'floor':>7s} {'gw/floor':>8s} {'torch':>8s} {'torch/gw':>8s}")
for rnd in (1, 2):
    path = os.path.join(d, f"bench_autograd_r{rnd}.json")
    if not os.path.exists(path):
        continue
    gw = medians(path, "EagerBackward/")
    floor = {k.replace("/multistream:0", ""): v for k, v in medians(path, "HandWrittenBackward").items()}
    torch = {}
    try:
        for r in csv.DictReader(open(os.path.join(d, f"torch_eager_backward_r{rnd}.csv"))):
            torch[r["config"].split("/", 1)[1]] = float(r["wall_us"])
    except FileNotFoundError:
        pass
    for key, b in gw.items():
        wall = b["real_time"]
        f = floor.get(key.replace("/multistream:0", "")) if key.endswith("multistream:0") else None
        fs = f"{f['real_time']:7.1f} {wall / f['real_time']:8.2f}" if f else f"{'-':>7s} {'-':>8s}"
        t = torch.get(key)
        ts = f"{t:8.1f} {t / wall:8.2f}" if t else f"{'-':>8s} {'-':>8s}"
        print(f"{key:50s} {rnd:3d} {wall:8.1f} {fs} {ts}")
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median" and b["name"].startswith("PlanOnly"):
            print(f"plan_for() on the 4x8 study ({b['nodes']:.0f} nodes), round {rnd}: {b['real_time']:.1f} us")
PY
}

capture_side_by_side() {  # the captured backward against the hand-written graph and PyTorch's graph
  python3 - "$LOG_DIR" <<'PY' 2>/dev/null
import csv, json, os, sys
d = sys.argv[1]
meds = {}
for b in json.load(open(os.path.join(d, "bench_capture.json")))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        meds[b["name"].split("/min_time")[0].replace("/manual_time", "")] = b
torch = {}
try:
    for r in csv.DictReader(open(os.path.join(d, "torch_graph_backward.csv"))):
        torch[r["config"].split("/", 1)[1]] = float(r["wall_us"])
except FileNotFoundError:
    pass
print(f"{'captured backward (medians, us)':40s} {'gw':>6s} {'hand':>6s} {'gw/hand':>7s} "
      f"{'gw gpu':>6s} {'hand':>6s} {'ratio':>5s} {'torch':>6s} {'gw/torch':>8s} {'pre':>5s} {'sig':>4s} "
      f"{'rel':>5s} {'capt':>4s} {'upd':>4s}")
def pre(b):  # host us before the launch returned: signature, cache lookup, waits and launch
    return b.get("sig_us", 0) + b.get("wait_us", 0) + b.get("decide_us", 0) + b.get("launch_us", 0)
for name, b in meds.items():
    kind, _, key = name.partition("/")
    if kind not in ("GraphBackward", "GraphBackwardSplit"):
        continue
    parts = dict(p.split(":") for p in key.split("/"))
    streams = 2 if kind.endswith("Split") else int(parts["multistream"])
    hk = (f"HandWrittenGraph/branches:{parts['branches']}/depth:{parts['depth']}/"
          f"width:{parts['width']}/batch:{parts['batch']}/streams:{streams}")
    h = meds.get(hk)
    t = torch.get(key)
    gw = b["real_time"]
    hs = f"{h['real_time']:6.1f} {gw / h['real_time']:7.2f}" if h else f"{'-':>6s} {'-':>7s}"
    g, hg = b.get("gpu_us"), h.get("gpu_us") if h else None
    gs = f"{g:6.1f} {hg:6.1f} {g / hg:5.2f}" if g and hg else f"{'-':>6s} {'-':>6s} {'-':>5s}"
    ts = f"{t:6.1f} {gw / t:8.2f}" if t else f"{'-':>6s} {'-':>8s}"
    label = ("split " if kind.endswith("Split") else "") + key.replace("branches:", "").replace(
        "depth:", "x").replace("width:", "w").replace("batch:", "b").replace("multistream:", "ms")
    print(f"{label:40s} {gw:6.1f} {hs} {gs} {ts} {pre(b):5.1f} {b.get('sig_us', 0):4.1f} "
          f"{b.get('release_us', 0):5.1f} {b.get('captures', 0):4.0f} {b.get('updates', 0):4.0f}")
for name, b in meds.items():
    if name.startswith("GraphBackwardHost"):
        print(f"replay host cost, {b.get('tape_nodes', 0):.0f} tape nodes, "
              f"multistream:{name[-1]}: signature + waits + lookup + launch {pre(b):.1f} us "
              f"(signature {b.get('sig_us', 0):.1f}, launch {b.get('launch_us', 0):.1f}), "
              f"then release {b.get('release_us', 0):.1f} us; from_log {b.get('from_log', 0):.0f}")
for name, b in meds.items():
    if name.startswith("Signature"):
        print(f"tape_signature() by a walk, {b['nodes']:.0f} nodes: {b['real_time'] / 1e3:.1f} us")
PY
}

echo
echo "================ graphward GPU check ================"
head -2 "$LOG_DIR/machine.txt"
[ -f "$LOG_DIR/bench_ops.txt" ] && grep -E '_median' "$LOG_DIR/bench_ops.txt" | sed 's/ *[0-9]* host_us.*//; s/ *[0-9]* TFLOP.*//'
[ -f "$LOG_DIR/bench_autograd_r1.json" ] && side_by_side
[ -f "$LOG_DIR/bench_capture.json" ] && capture_side_by_side
[ -f "$LOG_DIR/overlap_table.txt" ] && cat "$LOG_DIR/overlap_table.txt"
[ -f "$LOG_DIR/models_table.txt" ] && cat "$LOG_DIR/models_table.txt"
printf '%s\n' "${SUMMARY[@]}"
if [ -n "${OUT:-}" ]; then  # whoever collects $OUT may take only a few files: pack the logs into one
  tar czf "$OUT/gpu_check_logs.tar.gz" -C "$LOG_DIR" . && rm -rf "$LOG_DIR"
  echo "logs: gpu_check_logs.tar.gz"
else
  echo "logs: $LOG_DIR"
fi
exit $FAILED
