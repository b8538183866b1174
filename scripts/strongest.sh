#!/usr/bin/env bash
# graphward against PyTorch at its strongest, in one run on one GPU: graphward's whole training
# steps (bench/models_bench.cpp) and captured backwards (bench/overlap_bench.cpp), the same models
# and studies in libtorch (bench/libtorch, C++ against C++), and PyTorch's strongest preset
# (scripts/compare_torch.py --strongest: every variant a strong user picks, the fastest named) and
# its captured studies (--overlap, every .grad None before the capture); then the tables
# (scripts/strongest_table.py), which README.md's performance table and docs/RESULTS.md quote.
#   scripts/strongest.sh [DIR] [STEPS]
# DIR: where the results go (default: $OUT when set, else build/strongest). STEPS: a
# comma-separated subset of gw,libtorch,torch-models,torch-overlap,table (default: all, in that
# order). Environment: GW_TORCH_TIMEOUT (seconds for PyTorch's model rows, default 1500),
# GW_TORCH_MODES (compare_torch.py --modes), GW_COMPARE_CACHE (inductor's and TunableOp's caches,
# default ~/.cache/graphward-compare: a compile or a tuning is paid once per machine). PyTorch's
# model rows resume: run again into the same DIR on the same machine, the rows its
# torch_models.csv holds are kept and only the others run (max-autotune's compiles take 1 to 10
# minutes a model, about 25 for the six on an H100 — each fp32 GEMM shape's autotuning up to 40 s:
# a run cut short goes on where it stopped, its compiles served by the caches).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
dir=${1:-${OUT:-$GW_BUILD_DIR/strongest}}
steps=${2:-gw,libtorch,torch-models,torch-overlap,table}
mkdir -p "$dir"
has() { [[ ",$steps," == *",$1,"* ]]; }
rc=0
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1
  date -u
  git -C "$GW_ROOT" rev-parse --short HEAD 2>/dev/null
} >"$dir/machine.txt" 2>&1

if has gw; then
  ensure_deps >"$dir/build.log" 2>&1
  if GW_BUILD_TARGETS="graphward_bench_models graphward_bench_overlap" \
     configure_and_build -DCMAKE_CUDA_ARCHITECTURES=90 >>"$dir/build.log" 2>&1; then
    say "graphward: the models' whole steps"
    "$GW_BUILD_DIR/bench/graphward_bench_models" --benchmark_filter='^(Mlp|Convnet|Transformer)/' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_out="$dir/models.json" --benchmark_out_format=json >"$dir/models.txt" 2>&1 || rc=1
    say "graphward: the studies' backwards and the sweep"
    "$GW_BUILD_DIR/bench/graphward_bench_overlap" --benchmark_filter='^(Overlap|OverlapSweep)/' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_out="$dir/overlap.json" --benchmark_out_format=json >"$dir/overlap.txt" 2>&1 || rc=1
  else
    say "FAILED: building graphward (log: $dir/build.log)"; tail -20 "$dir/build.log"; rc=1
  fi
fi
if has libtorch; then
  say "libtorch: the same models and studies"
  bash "$GW_ROOT/scripts/compare_libtorch.sh" "$dir" >"$dir/libtorch.txt" 2>&1 || rc=1
  grep -m1 'skipped' "$dir/libtorch.txt"
fi
cache=${GW_COMPARE_CACHE:-$HOME/.cache/graphward-compare}
if has torch-models; then
  say "PyTorch: the strongest preset (caches in $cache)"
  PYTHONUNBUFFERED=1 timeout "${GW_TORCH_TIMEOUT:-1500}" python3 "$GW_ROOT/scripts/compare_torch.py" \
    --strongest --iters 100 --cache-dir "$cache" ${GW_TORCH_MODES:+--modes "$GW_TORCH_MODES"} \
    --resume --csv "$dir/torch_models.csv" >"$dir/torch_models.txt" 2>"$dir/torch_models.err" || rc=1
fi
if has torch-overlap; then
  say "PyTorch: the studies' backwards, captured with every .grad None (and accumulating)"
  PYTHONUNBUFFERED=1 python3 "$GW_ROOT/scripts/compare_torch.py" --overlap --iters 200 \
    --csv "$dir/torch_overlap.csv" >"$dir/torch_overlap.txt" 2>"$dir/torch_overlap.err" || rc=1
fi
if has table; then
  python3 "$GW_ROOT/scripts/strongest_table.py" "$dir" | tee "$dir/table.md"
fi
exit $rc
