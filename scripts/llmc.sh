#!/usr/bin/env bash
# llm.c (karpathy/llm.c) built from its public source as the comparison for examples/train_gpt2,
# outside graphward: its train_gpt2cu (cuDNN attention, sm_90) compiled into $GW_BUILD_DIR/llmc
# with two changes for CUDA 13 — NVML left out (llmc/mfu.h: its clock readout only) and
# cudaMemAdvise given a cudaMemLocation (llmc/cuda_utils.cuh: its out-of-memory fallback) — then
# run from scratch (-e d12: GPT-2 small, random init, bf16) on a synthetic token shard
# (make_token_shard) at each batch × sequence, with the recipe train_gpt2 uses (AdamW weight
# decay 0.1, warm-up, cosine decay, clipping at 1.0, TF32). Prints llm.c's step lines and, per
# shape, the median ms/step and tokens/s of the steps after the first 5, its first step's loss and
# the device memory in use once it has allocated everything (cudaMemGetInfo: the CUDA context
# included; llm.c allocates its activations, gradients and optimizer state up front).
#   scripts/llmc.sh [LLMC_SOURCE] [OUT_DIR]
# LLMC_SOURCE (default .deps/llm.c): a checkout of llm.c (its train_gpt2.cu and llmc/; a machine
# without network gets it carried: `git clone https://github.com/karpathy/llm.c .deps/llm.c`
# where there is one). OUT_DIR (default $GW_BUILD_DIR/llmc_runs): logs and llmc.csv.
# Environment: GW_LLMC_SHAPES (default "4x64 8x256 16x1024"), GW_LLMC_STEPS (default 50),
# GW_LLMC_TOOLS_BIN (where make_token_shard is; default $GW_BUILD_DIR/examples).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

src=${1:-$GW_ROOT/.deps/llm.c}
out=${2:-$GW_BUILD_DIR/llmc_runs}
build=$GW_BUILD_DIR/llmc
[ -f "$src/train_gpt2.cu" ] && [ -d "$src/llmc" ] || {
  echo "llmc.sh: no llm.c source at '$src' (expected train_gpt2.cu and llmc/)"; exit 2; }
fe=$GW_ROOT/.deps/cudnn_frontend/include
[ -f "$fe/cudnn_frontend.h" ] || ensure_cudnn_frontend
[ -f "$fe/cudnn_frontend.h" ] || { echo "llmc.sh: no cudnn-frontend headers in $fe"; exit 2; }
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
mkdir -p "$build" "$out"

if [ ! -x "$build/train_gpt2cu" ] || [ "$src/train_gpt2.cu" -nt "$build/train_gpt2cu" ]; then
  rm -rf "$build/src" && mkdir -p "$build/src" && cp -r "$src/train_gpt2.cu" "$src/llmc" "$build/src/"
  sed -i 's/#if __has_include(<nvml.h>)/#if 0  \/\/ NVML left out: CUDA 13 build without the driver library/' \
    "$build/src/llmc/mfu.h"
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$build/src/llmc/cuda_utils.cuh"
  flags=(--threads=0 -t=0 --use_fast_math -std=c++17 -O3
         "--generate-code=arch=compute_90,code=[compute_90,sm_90]" -DENABLE_CUDNN -I"$fe"
         -I"$build/src")
  (cd "$build/src" &&
    "$nvcc_bin" "${flags[@]}" -c llmc/cudnn_att.cpp -o "$build/cudnn_att.o" &&
    "$nvcc_bin" "${flags[@]}" train_gpt2.cu "$build/cudnn_att.o" -lcublas -lcublasLt -lcudnn \
      -lnvrtc -o "$build/train_gpt2cu") >"$out/build.log" 2>&1 ||
    { echo "llmc.sh: the build failed (see $out/build.log)"; tail -20 "$out/build.log"; exit 1; }
fi

tools=${GW_LLMC_TOOLS_BIN:-$GW_BUILD_DIR/examples}
steps=${GW_LLMC_STEPS:-50}
echo "shape,batch,seq,ms_per_step,tokens_per_s,steps,first_loss,device_mib" >"$out/llmc.csv"
for shape in ${GW_LLMC_SHAPES:-4x64 8x256 16x1024}; do
  b=${shape%x*} t=${shape#*x}
  tokens=$((b * t * (steps + 2) + 1))
  "$tools/make_token_shard" "$out/train_$shape.bin" --tokens "$tokens" --vocab 50257 --seed 7 \
    >/dev/null && "$tools/make_token_shard" "$out/val_$shape.bin" --tokens "$((b * t * 4 + 1))" \
    --vocab 50257 --seed 8 >/dev/null || { echo "llmc.sh: no make_token_shard in $tools"; exit 2; }
  (cd "$out" && "$build/train_gpt2cu" -e d12 -i "train_$shape.bin" -j "val_$shape.bin" \
     -b "$b" -t "$t" -x "$steps" -l 6e-4 -u 5 -q 0.0 -c 0.1 -v 1000000 -m 1 -s 0 -h 0 -f 1) \
    >"$out/llmc_$shape.log" 2>&1
  rc=$?
  python3 - "$out/llmc_$shape.log" "$shape" "$b" "$t" "$rc" >>"$out/llmc.csv" <<'PY'
import re, statistics, sys
log, shape, b, t, rc = sys.argv[1:6]
ms, tok, first, device = [], [], "", ""
for line in open(log, errors="replace"):
    m = re.search(r"step\s+(\d+)/\d+ .*\|\s*([0-9.]+) ms .*\|\s*([0-9.]+) tok/s", line)
    if m and int(m.group(1)) > 5:
        ms.append(float(m.group(2)))
        tok.append(float(m.group(3)))
    m = re.search(r"step\s+1/\d+ \| loss ([0-9.]+)", line)
    if m:
        first = m.group(1)
    m = re.search(r"device memory usage: (\d+) MiB", line)  # in use after its allocations
    if m:
        device = m.group(1)
if not ms:
    print(f"{shape},{b},{t},,,0,{first},{device}  # rc {rc}: no step lines", file=sys.stderr)
    print(f"{shape},{b},{t},,,0,{first},{device}")
else:
    print(f"{shape},{b},{t},{statistics.median(ms):.3f},{statistics.median(tok):.0f},{len(ms)},"
          f"{first},{device}")
PY
  echo "llm.c $shape: $(tail -1 "$out/llmc.csv")"
done
