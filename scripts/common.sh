# Shared by scripts/*.sh: dependency checks and the CMake configure/build step.
# Sourced, not run. Sets GW_BUILD_DIR (default: build) and GW_JOBS (default: all cores).

GW_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GW_BUILD_DIR=${GW_BUILD_DIR:-$GW_ROOT/build}
GW_JOBS=${GW_JOBS:-$(nproc 2>/dev/null || echo 2)}

say() { printf '[graphward] %s\n' "$*"; }

# NCCL's graph mixing support off unless the caller set it: the faster replays of data-parallel
# graphs (Note [NCCL graph mixing], dist/process_group.h). The library reads it, never sets it.
export NCCL_GRAPH_MIXING_SUPPORT=${NCCL_GRAPH_MIXING_SUPPORT:-0}

# The one-screen summary of a check script (gpu_check.sh, dp_check.sh): record STEP STATUS DETAIL
# adds a line; a FAIL status makes the run fail (FAILED=1).
SUMMARY=()
FAILED=0
record() {
  SUMMARY+=("$(printf '%-24s %-6s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && FAILED=1
  # GW_RECORD_AS_WE_GO=1: each line printed at once too (a run cut short still shows what it did)
  [ "${GW_RECORD_AS_WE_GO:-0}" = 1 ] && echo "[record] ${SUMMARY[-1]}"
  return 0
}

# How many of a compute-sanitizer log's reports (on stdin) are the libraries' known, harmless ones:
# for every tool, NCCL's communicator set-up asking cudaFuncGetAttributes about kernels it has no
# image for on this GPU (an API error NCCL expects and handles, four per communicator); the GPU
# test of Note [Code for the device] asking the same of a kernel built for another GPU on purpose
# (its probe's cudaFuncGetAttributes and the cudaGetLastError that clears it: two); an update of
# an instantiated graph that the driver refuses (capture::Graph::update_to reports the refusal by
# name and its caller instantiates afresh: the cudaGraphExecUpdate and the cudaGetLastError that
# clears it, two); for initcheck, cuBLASLt's reads of memory it then discards, and cuDNN's
# fused-attention backward reading a word of its workspace that a memset node of the captured
# graph wrote (gpu_check.sh's sanitize says which and why).
#   sanitizer_known_reports TOOL <LOG
sanitizer_known_reports() {
  awk -v tool="$1" '
    /^========= Program hit cudaErrorNoKernelImageForDevice .* cudaFuncGetAttributes\.$/ {
      api = 1; next
    }
    /^========= Program hit cudaErrorNoKernelImageForDevice .* cudaGetLastError\.$/ {
      api = 2; next
    }
    /^========= Program hit cudaErrorGraphExecUpdateFailure .* (cudaGraphExecUpdate|cudaGetLastError)\.$/ {
      api = 3; next
    }
    api == 1 && /Host Frame: .*ncclCommInitRank/ { n++; api = 0; next }
    (api == 1 || api == 2) && /Host Frame: graphward::testing::sm80_only_probe\(\)/ {
      n++; api = 0; next
    }
    api == 3 && /Host Frame: graphward::capture::Graph::update_to\(/ { n++; api = 0; next }
    /^========= *$/ { api = 0 }
    tool == "initcheck" &&
      /^========= Uninitialized __global__ memory read of size [0-9]+ bytes?$/ {
      size = $(NF - 1); next
    }
    tool == "initcheck" && /^=========     at / {
      if ($0 ~ /cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_[0-9a-z_]*_align2/ ||
          ($0 ~ /cublasLt::epilogue::impl::globalKernel</ && size == 1) ||
          ($0 ~ /cudnn_generated_fort_native_sdpa_sm90_flash_bprop_/ && size == 4)) n++
      size = 0
    }
    END { print n + 0 }'
}

have_header() {  # have_header gtest/gtest.h
  local d
  for d in /usr/include /usr/local/include ${CPATH:+${CPATH//:/ }}; do
    [ -f "$d/$1" ] && return 0
  done
  return 1
}

# cuDNN's fused attention needs the cudnn-frontend headers (header-only; Note [Fused attention],
# engine/runtime/dnn.h): unpacked from PyPI's nvidia-cudnn-frontend wheel (its include/) into
# .deps/cudnn_frontend/include, where CMake looks first. Only where a CUDA toolkit is present, and
# never fatal: without them (no network, no pip) attention is composed, as CMake says.
GW_CUDNN_FRONTEND_VERSION=${GW_CUDNN_FRONTEND_VERSION:-1.32.0}
ensure_cudnn_frontend() {
  local dest=$GW_ROOT/.deps/cudnn_frontend
  if [ -f "$dest/include/cudnn_frontend.h" ]; then
    say "cudnn-frontend: headers in .deps/cudnn_frontend"
    return 0
  fi
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  local tmp
  tmp=$(mktemp -d) || return 0
  rm -rf "$dest" "$dest.partial"
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" \
       "nvidia-cudnn-frontend==$GW_CUDNN_FRONTEND_VERSION" >"$tmp/pip.log" 2>&1 &&
     python3 - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            path = os.path.join(dest + ".partial", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(z.read(name))
os.replace(dest + ".partial", dest)
PY
  then
    say "cudnn-frontend $GW_CUDNN_FRONTEND_VERSION: headers unpacked into .deps/cudnn_frontend"
  else
    say "cudnn-frontend: could not fetch nvidia-cudnn-frontend $GW_CUDNN_FRONTEND_VERSION from PyPI (log: $tmp/pip.log); attention will be composed"
    rm -rf "$dest.partial"
    return 0
  fi
  rm -rf "$tmp"
}

# Installs what is missing (GoogleTest, Google Benchmark, cmake, g++, pkg-config) with apt when running as
# root; otherwise says what will be built without; then the cudnn-frontend headers.
ensure_deps() {
  mkdir -p "$GW_ROOT/.deps" && ensure_cudnn_frontend
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  have_header gtest/gtest.h || missing+=(libgtest-dev)
  have_header benchmark/benchmark.h || missing+=(libbenchmark-dev)
  if [ ${#missing[@]} -eq 0 ]; then
    say "dependencies: cmake, g++, pkg-config, GoogleTest and Google Benchmark are present"
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing missing packages with apt-get: ${missing[*]}"
    # Within minutes: a machine without a network fails here rather than waiting on it.
    if (timeout 120 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${missing[@]}") \
        >/tmp/graphward-apt.log 2>&1; then
      say "installed: ${missing[*]}"
      return 0
    fi
    say "apt-get could not install ${missing[*]} (log: /tmp/graphward-apt.log)"
  else
    say "missing: ${missing[*]} (not root or no apt-get: not installing)"
  fi
  command -v cmake >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 || {
    say "cannot build without cmake and g++"; return 1; }
  have_header gtest/gtest.h || say "GoogleTest is missing: CMake will look for it elsewhere; without it the tests are NOT built"
  have_header benchmark/benchmark.h || say "Google Benchmark is missing: the benchmarks are not built"
  return 0
}

# configure_and_build [extra cmake args...]; GW_CMAKE_ARGS (words) are passed to cmake last, so
# that a user's choice wins (e.g. GW_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=80 -DGRAPHWARD_NVTX=OFF").
# GW_BUILD_TARGETS (words): build only these targets (default: all).
configure_and_build() {
  local user_args=() targets=()
  read -r -a user_args <<<"${GW_CMAKE_ARGS:-}"
  read -r -a targets <<<"${GW_BUILD_TARGETS:-}"
  say "configuring in $GW_BUILD_DIR${GW_CMAKE_ARGS:+ (GW_CMAKE_ARGS: $GW_CMAKE_ARGS)}"
  cmake -S "$GW_ROOT" -B "$GW_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@" "${user_args[@]}" ||
    return 1
  say "building with $GW_JOBS jobs${GW_BUILD_TARGETS:+ (targets: $GW_BUILD_TARGETS)}"
  cmake --build "$GW_BUILD_DIR" -j "$GW_JOBS" ${targets[@]:+--target "${targets[@]}"} || return 1
}
