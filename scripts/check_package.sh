#!/usr/bin/env bash
# graphward as a dependency of another project, every way a consumer meets it (tests/package):
#  1. a CPU build of the library, static, installed: through find_package(graphward COMPONENTS
#     dist) the README's training loop (`consumer`), the same beside headers of the consumer's own
#     named as graphward's are in its tree, first on its include path (`clash_consumer`), and the
#     dist component (`dist_consumer`); the loop through FetchContent; the loop and the dist
#     program with plain g++ and pkg-config (graphward.pc, graphward_dist.pc); and the loop
#     compiled as C++17, which must be refused with graphward's one error;
#  2. the same library shared (BUILD_SHARED_LIBS=ON), installed: find_package and pkg-config;
#  3. where a CUDA toolkit is (GW_PACKAGE_CUDA=auto, the default; ON requires it, OFF skips it):
#     the CUDA build — $GW_BUILD_DIR's when it is one and built, else built here — installed:
#     find_package with a .cu file of the consumer's own (`kernel_consumer`: compiled as C++20
#     with no standard of its own, by the CMake found here), and pkg-config.
# Every consumer built is run (each must train, or say its values are right); the CUDA ones where
# a GPU is usable (else built and said not run). Ends with "package: ok (...)" or says what failed.
#   scripts/check_package.sh      (GW_PACKAGE_DIR: where it builds; default: the build dir + -package)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WORK=${GW_PACKAGE_DIR:-$GW_BUILD_DIR-package}
CUDA=${GW_PACKAGE_CUDA:-auto}
rm -rf "$WORK"
mkdir -p "$WORK"
fail() { say "package: FAILED: $*"; exit 1; }
KERNEL_RC=77  # kernel_consumer's exit status, once run

# install_library NAME CMAKE_ARGS...: configures, builds and installs graphward into $WORK/NAME.
install_library() {
  local name=$1
  shift
  say "package: building and installing graphward ($*) into $WORK/$name"
  local log="$WORK/$name.lib.log"
  cmake -S "$GW_ROOT" -B "$WORK/lib-$name" -DCMAKE_BUILD_TYPE=Release -DGRAPHWARD_BUILD_TESTS=OFF \
    -DGRAPHWARD_BUILD_BENCHMARKS=OFF -DGRAPHWARD_BUILD_EXAMPLES=OFF \
    -DCMAKE_INSTALL_PREFIX="$WORK/$name" "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
  cmake --build "$WORK/lib-$name" -j "$GW_JOBS" >>"$log" 2>&1 || { tail -30 "$log"; exit 1; }
  cmake --install "$WORK/lib-$name" >>"$log" 2>&1 || { tail -30 "$log"; exit 1; }
}

# consume DIR PROGRAMS CMAKE_ARGS...: builds tests/package in $WORK/DIR and runs each of PROGRAMS
# (words; a CUDA program's exit status 77 means no GPU was usable: built, not run).
consume() {
  local dir=$1 programs=$2
  shift 2
  say "package: consumers in $dir ($programs)"
  local log="$WORK/$dir.log"
  cmake -S "$GW_ROOT/tests/package" -B "$WORK/$dir" "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
  cmake --build "$WORK/$dir" -j "$GW_JOBS" >>"$log" 2>&1 || { tail -40 "$log"; exit 1; }
  local p rc
  for p in $programs; do
    rc=0
    "$WORK/$dir/$p" || rc=$?
    [ "$p" = kernel_consumer ] && KERNEL_RC=$rc
    [ "$rc" -eq 0 ] || { [ "$rc" -eq 77 ] && [ "$p" = kernel_consumer ]; } ||
      fail "$dir: $p exited $rc"
  done
}

# pkg_config PREFIX NAME: the training loop and the dist program built with plain g++ from
# pkg-config's flags (and run).
pkg_config() {
  local prefix=$1 name=$2 pc p
  command -v pkg-config >/dev/null 2>&1 || fail "no pkg-config here (scripts/common.sh's ensure_deps installs it)"
  pc=$(find "$prefix" -name graphward.pc -path '*/pkgconfig/*' | head -1)
  [ -n "$pc" ] || fail "$name: no graphward.pc installed under $prefix"
  local dir
  dir=$(dirname "$pc")
  say "package: plain g++ with pkg-config ($name: $(PKG_CONFIG_PATH=$dir pkg-config --libs graphward_dist))"
  for p in main dist; do
    # shellcheck disable=SC2046
    g++ -std=c++20 -O1 "$GW_ROOT/tests/package/$p.cpp" -o "$WORK/$name-pc-$p" \
      $(PKG_CONFIG_PATH=$dir pkg-config --cflags --libs graphward_dist) >"$WORK/$name-pc-$p.log" 2>&1 ||
      { cat "$WORK/$name-pc-$p.log"; fail "$name: g++ with pkg-config's flags did not build $p.cpp"; }
    LD_LIBRARY_PATH="$prefix/lib:$prefix/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$WORK/$name-pc-$p" || fail "$name: the program built with pkg-config's flags ($p) failed"
  done
}

# 1. CPU, static.
install_library cpu -DGRAPHWARD_ENABLE_CUDA=OFF
consume cpu-find "consumer clash_consumer dist_consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/cpu"
consume cpu-fetch "consumer clash_consumer dist_consumer" -DGRAPHWARD_CONSUME=fetch -DGRAPHWARD_SOURCE="$GW_ROOT" \
  -DGRAPHWARD_ENABLE_CUDA=OFF  # no build type
# Built as another project's part, graphward builds the library only, and leaves the consumer's
# build type alone.
if grep -q "Built target \(graphward_cpu_tests\|graphward_gpu_tests\|graphward_bench_.*\|train_.*\)$" \
  "$WORK/cpu-fetch.log"; then
  fail "through FetchContent graphward built its tests, benchmarks or examples"
fi
grep -q '^CMAKE_BUILD_TYPE:STRING=$' "$WORK/cpu-fetch/CMakeCache.txt" ||
  fail "graphward set the consumer's build type ($(grep '^CMAKE_BUILD_TYPE' "$WORK/cpu-fetch/CMakeCache.txt"))"
pkg_config "$WORK/cpu" cpu
# What is installed: the public headers under include/graphward/ as in the tree, not the
# internal ones.
inc=$WORK/cpu/include/graphward
headers=$(find "$inc" -name '*.h' | wc -l)
[ -f "$inc/graphward.h" ] && [ -f "$inc/engine/backward/backward.h" ] && [ -f "$inc/base/config.h" ] &&
  [ "$headers" -gt 30 ] ||
  fail "the installed headers ($headers) lack graphward.h, engine/backward/backward.h or base/config.h"
internal=$(find "$inc" \( -name '*_detail.h' -o -name '*.cuh' \) | sed "s|$inc/||" | tr '\n' ' ')
[ -z "$internal" ] || fail "internal headers installed: $internal"
# C++17: refused with graphward's error, before any other.
if g++ -std=c++17 -fsyntax-only -I"$WORK/cpu/include" "$GW_ROOT/tests/package/main.cpp" \
  >"$WORK/cxx17.log" 2>&1; then
  fail "a C++17 consumer compiled"
fi
first=$(grep -m1 -E ': (fatal )?error:' "$WORK/cxx17.log" || true)
errors=$(grep -c -E ': (fatal )?error:' "$WORK/cxx17.log" || true)
case "$first" in
  *"graphward needs C++20"*) ;;
  *) cat "$WORK/cxx17.log"; fail "a C++17 consumer's first error is not graphward's: $first" ;;
esac
[ "$errors" -le 2 ] || { cat "$WORK/cxx17.log"; fail "a C++17 consumer got $errors errors, not graphward's one"; }
say "package: a C++17 consumer is refused: ${first#*error: }"

# 2. CPU, shared.
install_library shared -DGRAPHWARD_ENABLE_CUDA=OFF -DBUILD_SHARED_LIBS=ON
[ -n "$(find "$WORK/shared" -name 'libgraphward.so*' | head -1)" ] ||
  fail "BUILD_SHARED_LIBS=ON installed no libgraphward.so"
consume shared-find "consumer dist_consumer" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$WORK/shared"
pkg_config "$WORK/shared" shared
done_what="CPU static: find_package, the clash consumer, dist, FetchContent, pkg-config, C++17 refused; CPU shared: find_package, pkg-config"

# 3. CUDA.
have_cuda=0
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && have_cuda=1
if [ "$CUDA" = ON ] && [ $have_cuda = 0 ]; then fail "GW_PACKAGE_CUDA=ON and no CUDA toolkit here"; fi
if [ "$CUDA" != OFF ] && [ $have_cuda = 1 ]; then
  config=$GW_BUILD_DIR/graphward_generated/graphward/base/config.h
  if [ -f "$config" ] && grep -q '^#define GRAPHWARD_HAS_CUDA 1' "$config" &&
     cmake --build "$GW_BUILD_DIR" --target graphward graphward_dist -j "$GW_JOBS" >"$WORK/cuda.lib.log" 2>&1; then
    say "package: installing $GW_BUILD_DIR's CUDA build into $WORK/cuda"
    cmake --install "$GW_BUILD_DIR" --prefix "$WORK/cuda" >>"$WORK/cuda.lib.log" 2>&1 ||
      { tail -30 "$WORK/cuda.lib.log"; exit 1; }
  else
    install_library cuda -DGRAPHWARD_ENABLE_CUDA=ON
  fi
  consume cuda-find "consumer dist_consumer kernel_consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$WORK/cuda" -DGRAPHWARD_CONSUMER_CUDA=ON
  pkg_config "$WORK/cuda" cuda
  ran="built, no GPU to run them"
  [ "$KERNEL_RC" -eq 0 ] && ran="run on the GPU"
  done_what="$done_what; CUDA ($ran, CMake $(cmake --version | head -1 | awk '{print $3}')): find_package with a .cu consumer, pkg-config"
fi
say "package: ok ($done_what)"
