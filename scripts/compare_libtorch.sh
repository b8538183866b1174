#!/usr/bin/env bash
# Builds and runs bench/libtorch (graphward's benchmark models and studies written against
# PyTorch's C++ library) when a Torch CMake package is found: the pip torch's, through
# python3's torch.utils.cmake_prefix_path, or one named by TORCH_PREFIX_PATH. Exits 0 with the
# reason on one line when there is none (the comparison is skipped, nothing fails).
#   scripts/compare_libtorch.sh DIR [graphward_libtorch_compare flags: --repetitions=N]
# Each family of rows (the MLPs, the convnets, the transformers, the studies) runs in a process of
# its own and writes DIR/libtorch_<family>.json, so that one that dies leaves the others' rows; a
# family whose process dies by a signal is run again under cuda-gdb for its backtrace
# (DIR/libtorch_<family>.gdb.txt).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:?usage: scripts/compare_libtorch.sh DIR [--repetitions=N]}
mkdir -p "$out"
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
rc=0
for family in mlp convnet transformer study; do
  case $family in
    study) filter='^LibtorchStudy/' ;;
    *) filter="^Libtorch/$family/" ;;
  esac
  args=(--filter="$filter" --repetitions=3 --out="$out/libtorch_$family.json" "$@")
  "$dir/graphward_libtorch_compare" "${args[@]}"
  status=$?
  if [ $status -gt 128 ]; then
    say "FAILED: libtorch rows of $family: killed by signal $((status - 128)); backtrace in $out/libtorch_$family.gdb.txt"
    command -v cuda-gdb >/dev/null &&
      timeout 300 cuda-gdb -batch -ex run -ex bt --args "$dir/graphward_libtorch_compare" "${args[@]}" \
        >"$out/libtorch_$family.gdb.txt" 2>&1
    rc=1
  elif [ $status -ne 0 ]; then
    say "FAILED: libtorch rows of $family: exit status $status"; rc=1
  fi
done
exit $rc
