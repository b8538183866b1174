#!/usr/bin/env bash
# Where a program's host time goes, on a machine with no perf or gdb to ask: runs PROGRAM with a
# wall-clock sampler of its main thread (scripts/host_sampler.cpp, an LD_PRELOAD library built into
# $GW_BUILD_DIR on first use) and prints, as shares of the samples, the time by library, by
# function and inclusive, and who calls what you name (scripts/host_profile.py).
#   scripts/host_profile.sh [--us N] [--within TEXT] [--callers TEXT]... [--top N] [--out BASE]
#                           -- PROGRAM [ARGS...]
# --us: the sampling interval (default 200 µs; each sample unwinds the stack, tens of µs through a
# driver's frames, so shorter intervals slow the program and skew the shares). --within: only
# samples inside a function whose name holds TEXT (a benchmark's steady loop, say). --out: where
# the raw samples go (BASE.samples, BASE.maps; default $GW_BUILD_DIR/host_profile/run).
# GW_HOST_PROFILE_TIMEOUT: seconds before the program is stopped (default 600).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage() {
  echo "usage: scripts/host_profile.sh [--us N] [--within TEXT] [--callers TEXT]... [--top N]" \
       "[--out BASE] -- PROGRAM [ARGS...]" >&2
  exit 2
}
us=200 out=$GW_BUILD_DIR/host_profile/run
analysis=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --us) us=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --within | --callers | --top) [ $# -ge 2 ] || usage; analysis+=("$1" "$2"); shift 2 ;;
    *) echo "host_profile.sh: unknown argument $1" >&2; usage ;;
  esac
done
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || usage
if ! [[ "$us" =~ ^[0-9]+$ ]] || [ "$us" -lt 10 ]; then
  echo "host_profile.sh: --us $us: expected a whole number of microseconds, 10 or more" >&2
  exit 2
fi
if ! command -v "$1" >/dev/null 2>&1; then
  echo "host_profile.sh: $1: no such program" >&2
  exit 2
fi
for tool in readelf addr2line python3 g++; do
  command -v $tool >/dev/null 2>&1 || { echo "host_profile.sh: $tool is not installed" >&2; exit 2; }
done
lib=$GW_BUILD_DIR/host_sampler.so
if [ ! -e "$lib" ] || [ "$GW_ROOT/scripts/host_sampler.cpp" -nt "$lib" ]; then
  mkdir -p "$GW_BUILD_DIR"
  g++ -std=c++17 -O2 -shared -fPIC "$GW_ROOT/scripts/host_sampler.cpp" -lrt -o "$lib" || exit 2
fi
mkdir -p "$(dirname "$out")"
rm -f "$out.samples" "$out.maps"
timeout "${GW_HOST_PROFILE_TIMEOUT:-600}" env LD_PRELOAD="$lib" GW_HOST_PROFILE_US="$us" \
  GW_HOST_PROFILE_OUT="$out" "$@"
status=$?
[ $status -eq 124 ] && echo "host_profile.sh: stopped after ${GW_HOST_PROFILE_TIMEOUT:-600} s" >&2
[ $status -ne 0 ] && echo "host_profile.sh: the program exited with status $status" >&2
python3 "$GW_ROOT/scripts/host_profile.py" "$out" ${analysis[@]+"${analysis[@]}"}
