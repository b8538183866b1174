#!/usr/bin/env bash
# graphward as a dependency of another project: builds and installs the library (CPU backend unless
# GW_PACKAGE_CUDA=ON), then builds tests/package — the README's training loop — against the
# installed package with find_package(graphward), and again with graphward's sources through
# FetchContent, and runs both (each must train). Ends with "package: ok" or says what failed.
#   scripts/check_package.sh      (GW_PACKAGE_DIR: where it builds; default: the build dir + -package)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WORK=${GW_PACKAGE_DIR:-$GW_BUILD_DIR-package}
CUDA=${GW_PACKAGE_CUDA:-OFF}
rm -rf "$WORK"
say "package: building and installing graphward (GRAPHWARD_ENABLE_CUDA=$CUDA) into $WORK/prefix"
cmake -S "$GW_ROOT" -B "$WORK/lib" -DCMAKE_BUILD_TYPE=Release -DGRAPHWARD_ENABLE_CUDA="$CUDA" \
  -DGRAPHWARD_BUILD_TESTS=OFF -DGRAPHWARD_BUILD_BENCHMARKS=OFF -DGRAPHWARD_BUILD_EXAMPLES=OFF \
  -DCMAKE_INSTALL_PREFIX="$WORK/prefix" >"$WORK.lib.log" 2>&1 || { cat "$WORK.lib.log"; exit 1; }
cmake --build "$WORK/lib" -j "$GW_JOBS" >>"$WORK.lib.log" 2>&1 || { tail -30 "$WORK.lib.log"; exit 1; }
cmake --install "$WORK/lib" >>"$WORK.lib.log" 2>&1 || { tail -30 "$WORK.lib.log"; exit 1; }

consume() {  # consume HOW [CMAKE ARGS...]
  local how=$1
  shift
  say "package: a consumer through $how"
  cmake -S "$GW_ROOT/tests/package" -B "$WORK/$how" -DGRAPHWARD_CONSUME="$how" "$@" >"$WORK.$how.log" 2>&1 || { cat "$WORK.$how.log"; exit 1; }
  cmake --build "$WORK/$how" -j "$GW_JOBS" >>"$WORK.$how.log" 2>&1 ||
    { tail -30 "$WORK.$how.log"; exit 1; }
  "$WORK/$how/consumer" || { say "package: FAILED: the $how consumer did not train"; exit 1; }
}
consume find_package -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/prefix"
consume fetch -DGRAPHWARD_SOURCE="$GW_ROOT" -DGRAPHWARD_ENABLE_CUDA="$CUDA"  # no build type
# Built as another project's part, graphward builds the library only, and leaves the consumer's
# build type alone.
if grep -q "Built target \(graphward_cpu_tests\|graphward_gpu_tests\|graphward_bench_.*\|train_.*\)$" \
  "$WORK.fetch.log"; then
  say "package: FAILED: through FetchContent graphward built its tests, benchmarks or examples"
  exit 1
fi
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=$' "$WORK/fetch/CMakeCache.txt"; then
  say "package: FAILED: graphward set the consumer's build type ($(grep '^CMAKE_BUILD_TYPE' \
    "$WORK/fetch/CMakeCache.txt"))"
  exit 1
fi
headers=$(find "$WORK/prefix/include/graphward" -name '*.h' | wc -l)
[ -f "$WORK/prefix/include/graphward/graphward.h" ] &&
  [ -f "$WORK/prefix/include/graphward/backward/backward.h" ] && [ "$headers" -gt 30 ] ||
  { say "package: FAILED: the installed headers ($headers) lack graphward.h or backward/backward.h"; exit 1; }
say "package: ok (find_package on the installed tree, and FetchContent)"
