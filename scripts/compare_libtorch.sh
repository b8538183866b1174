#!/usr/bin/env bash
# Builds and runs bench/libtorch (graphward's benchmark models and studies written against
# PyTorch's C++ library) when a Torch CMake package is found: the pip torch's, through
# python3's torch.utils.cmake_prefix_path, or one named by TORCH_PREFIX_PATH. Exits 0 with the
# reason on one line when there is none (the comparison is skipped, nothing fails).
#   scripts/compare_libtorch.sh OUT.json [Google Benchmark flags, e.g. --benchmark_filter=...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:?usage: scripts/compare_libtorch.sh OUT.json [benchmark flags]}
shift
prefix=${TORCH_PREFIX_PATH:-$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)}
if [ -z "$prefix" ]; then
  say "libtorch comparison skipped: python3 has no torch and TORCH_PREFIX_PATH is unset"
  exit 0
fi
dir=$GW_BUILD_DIR/libtorch
mkdir -p "$GW_BUILD_DIR"
cmake -S "$GW_ROOT/bench/libtorch" -B "$dir" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$dir.configure.log" 2>&1 || {
  say "libtorch comparison skipped: configuring bench/libtorch failed (log: $dir.configure.log)"
  tail -5 "$dir.configure.log"; exit 0; }
if grep -q 'graphward_libtorch_compare: skipped' "$dir.configure.log"; then
  say "libtorch comparison $(grep -o 'skipped:.*' "$dir.configure.log" | head -1)"
  exit 0
fi
say "building bench/libtorch against $prefix"
cmake --build "$dir" -j "$GW_JOBS" >"$dir.build.log" 2>&1 || {
  say "FAILED: building bench/libtorch (log: $dir.build.log)"; tail -20 "$dir.build.log"; exit 1; }
"$dir/graphward_libtorch_compare" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out" --benchmark_out_format=json "$@"
