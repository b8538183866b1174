#!/usr/bin/env bash
# A change measured the way docs/RESULTS.md asks: the code before (A) built beside the working
# tree (B), their benchmarks run in alternating passes on the same machine in one call — A, B,
# A, B, ... — and one table of the times and B/A (scripts/ab_table.py). For a GPU machine; the
# working tree's build is $GW_BUILD_DIR (made if missing), A's is $GW_BUILD_DIR/ab-before.
#   scripts/ab.sh BEFORE [BENCH [FILTER [PASSES]]]
# BEFORE: a git revision (read with git archive), a source directory, or a .tar.gz of the source
# (a machine whose checkout lacks the history: git archive -o before.tar.gz REV elsewhere).
# BENCH: a benchmark program of bench/ (default graphward_bench_models); FILTER: its
# --benchmark_filter (default every benchmark); PASSES: passes of each build (default 2).
# Environment: GW_AB_REPETITIONS (Google Benchmark's repetitions a pass, default 3), GW_AB_OUT (the
# folder for the JSON of each pass and the table, default $GW_BUILD_DIR/ab).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ $# -lt 1 ]; then
  echo "usage: scripts/ab.sh BEFORE [BENCH [FILTER [PASSES]]]" >&2
  exit 2
fi
before=$1 bench=${2:-graphward_bench_models} filter=${3:-} passes=${4:-2}
out=${GW_AB_OUT:-$GW_BUILD_DIR/ab}
src=$GW_BUILD_DIR/ab-before-src
mkdir -p "$out"
rm -rf "$src" && mkdir -p "$src"
if [ -d "$before" ]; then
  cp -a "$before/." "$src/"
elif [ -f "$before" ]; then
  tar xzf "$before" -C "$src" || { echo "ab.sh: cannot unpack $before" >&2; exit 1; }
else
  git -C "$GW_ROOT" archive "$before" | tar x -C "$src" ||
    { echo "ab.sh: $before is not a revision, a directory or a .tar.gz here" >&2; exit 1; }
fi
build_bench() {  # build_bench SOURCE BUILD LOG
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release ${GW_CMAKE_ARGS:-} >"$3" 2>&1 &&
    cmake --build "$2" -j "$GW_JOBS" --target "$bench" >>"$3" 2>&1
}
say "building $bench before ($before) and after (the working tree)"
mkdir -p "$GW_BUILD_DIR"
build_bench "$src" "$GW_BUILD_DIR/ab-before" "$out/build_before.log" ||
  { tail -20 "$out/build_before.log"; exit 1; }
build_bench "$GW_ROOT" "$GW_BUILD_DIR" "$out/build_after.log" ||
  { tail -20 "$out/build_after.log"; exit 1; }
files=()
for ((i = 1; i <= passes; ++i)); do
  for side in A B; do
    if [ $side = A ]; then dir=$GW_BUILD_DIR/ab-before; else dir=$GW_BUILD_DIR; fi
    json=$out/$side$i.json
    say "pass $side$i"
    "$dir/bench/$bench" ${filter:+--benchmark_filter="$filter"} \
      --benchmark_repetitions="${GW_AB_REPETITIONS:-3}" --benchmark_report_aggregates_only=true \
      --benchmark_out="$json" --benchmark_out_format=json >"$out/$side$i.txt" 2>&1 ||
      echo "ab.sh: pass $side$i failed (see $out/$side$i.txt); its rows show as -" >&2
    files+=("$json")
  done
done
python3 "$GW_ROOT/scripts/ab_table.py" "${files[@]}" | tee "$out/table.txt"
