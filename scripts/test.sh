#!/usr/bin/env bash
# Builds graphward with its tests and runs them all. GPU tests (ctest label `gpu`) run when a CUDA
# device is usable and are reported as skipped, with the reason, when none is. Then builds the
# hostile-input tests with AddressSanitizer and UndefinedBehaviorSanitizer (CPU only) and runs them,
# builds the thread tests with ThreadSanitizer and runs them, and checks graphward as a dependency
# of another project (scripts/check_package.sh).
#   scripts/test.sh            # everything ctest knows
#   GW_BUILD_DIR=/tmp/b scripts/test.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_deps
configure_and_build -DGRAPHWARD_BUILD_TESTS=ON
if [ ! -f "$GW_BUILD_DIR/tests/CTestTestfile.cmake" ]; then
  say "FAILED: the tests were not built (GoogleTest missing); nothing was tested"
  exit 1
fi
say "running the tests"
(cd "$GW_BUILD_DIR" && ctest --output-on-failure -j "$GW_JOBS" --timeout 600)

# The hostile-input tests (ctest label `hostile`, tests/hostile) and the rest of the CPU tests
# again, in a CPU-only build with AddressSanitizer and UndefinedBehaviorSanitizer: an overflow, an
# out-of-bounds access, a leak or undefined behaviour fails them. GW_SANITIZE=0 skips this part;
# GW_SANITIZE_BUILD_DIR (default: the build directory with -sanitize appended) is where it builds.
if [ "${GW_SANITIZE:-1}" != 0 ]; then
  SAN_DIR=${GW_SANITIZE_BUILD_DIR:-$GW_BUILD_DIR-sanitize}
  say "building the CPU tests with AddressSanitizer and UndefinedBehaviorSanitizer in $SAN_DIR"
  cmake -S "$GW_ROOT" -B "$SAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHWARD_ENABLE_CUDA=OFF \
    -DGRAPHWARD_SANITIZE=address,undefined -DGRAPHWARD_BUILD_BENCHMARKS=OFF \
    -DGRAPHWARD_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$SAN_DIR" -j "$GW_JOBS" --target graphward_hostile_tests graphward_cpu_tests
  # allocator_may_return_null: a huge allocation is refused (OutOfMemoryError), as without them.
  export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
  say "running the hostile-input tests under the sanitizers"
  (cd "$SAN_DIR" && ctest --output-on-failure --no-tests=error -L hostile -j "$GW_JOBS" --timeout 900)
  say "running the other CPU tests under the sanitizers"
  (cd "$SAN_DIR/tests" && ./graphward_cpu_tests --gtest_brief=1)
fi

# The tests of threads sharing a tape, a BackwardGraph, a StepGraph or an optimizer (and two
# backwards over one leaf), in a CPU-only build with ThreadSanitizer: a data race fails them.
# GW_TSAN=0 skips this part; GW_TSAN_BUILD_DIR (default: the build directory with -tsan appended)
# is where it builds; GW_THREAD_ROUNDS the rounds of each test (default 10000).
if [ "${GW_TSAN:-1}" != 0 ]; then
  TSAN_DIR=${GW_TSAN_BUILD_DIR:-$GW_BUILD_DIR-tsan}
  say "building the thread tests with ThreadSanitizer in $TSAN_DIR"
  cmake -S "$GW_ROOT" -B "$TSAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHWARD_ENABLE_CUDA=OFF \
    -DGRAPHWARD_SANITIZE=thread -DGRAPHWARD_BUILD_BENCHMARKS=OFF \
    -DGRAPHWARD_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$TSAN_DIR" -j "$GW_JOBS" --target graphward_hostile_tests
  say "running the thread tests under ThreadSanitizer"
  (cd "$TSAN_DIR/tests" &&
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./graphward_hostile_tests \
      --gtest_filter='Threads*:SharedLeaf*' --gtest_brief=1)
fi

# graphward as another project's dependency (scripts/check_package.sh): installed and found with
# find_package, and built through FetchContent; each consumer trains. GW_PACKAGE=0 skips it.
if [ "${GW_PACKAGE:-1}" != 0 ]; then
  bash "$GW_ROOT/scripts/check_package.sh"
fi
