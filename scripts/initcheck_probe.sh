#!/usr/bin/env bash
# Whether compute-sanitizer's initcheck sees the stores of cuBLASLt's bfloat16 GEMM kernels:
# builds scripts/initcheck_probe.cu into $GW_BUILD_DIR, runs it under initcheck, and prints a table,
# one row a trial (a GEMM writing a never-written output, then a kernel reading all of it): the
# shape, layout, epilogue, algorithm and mode (captured first, eager, captured after the eager run),
# the kernels it ran (from a CUPTI trace of the same program, where scripts/kernel_trace.sh can
# build its library) and the initcheck reports of the read — 0 where the tool saw the GEMM's
# stores. Run on the GPU machine:
#   scripts/initcheck_probe.sh [--mark] [OUT_DIR]   (logs into OUT_DIR, default
#                                                   $GW_BUILD_DIR/initcheck_probe)
# --mark: each GEMM's C marked written through NVTX as graphward's GEMMs mark theirs (Note [GEMM
# outputs and initcheck], kernels/gemm.cu); every trial should then report 0.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mark=()
[ "${1:-}" = --mark ] && mark=(--mark) && shift
out=${1:-$GW_BUILD_DIR/initcheck_probe}
mkdir -p "$out" "$GW_BUILD_DIR"
bin=$GW_BUILD_DIR/initcheck_probe
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ ! -x "$bin" ] || [ "$GW_ROOT/scripts/initcheck_probe.cu" -nt "$bin" ] ||
   [ "$GW_ROOT/kernels/nvtx_mark.h" -nt "$bin" ]; then
  "$nvcc_bin" -std=c++17 -O2 -arch=sm_90 -I "$GW_ROOT" "$GW_ROOT/scripts/initcheck_probe.cu" \
    -lcublasLt -ldl -o "$bin" || exit 2
fi
# The kernels of each trial, in order (no sanitizer): CUPTI's records between two reads.
if scripts_dir=$(dirname "${BASH_SOURCE[0]}") &&
   "$scripts_dir/kernel_trace.sh" "$out/trace" "$bin" "${mark[@]}" >"$out/trace.log" 2>&1; then
  :
fi
GW_PROBE_TIMEOUT=${GW_PROBE_TIMEOUT:-300}
timeout "$GW_PROBE_TIMEOUT" compute-sanitizer --tool initcheck --nvtx yes --print-limit 1000000 \
  "$bin" "${mark[@]}" \
  >"$out/initcheck.log" 2>&1
echo "initcheck exit status $? ($(compute-sanitizer --version | tail -1))"
python3 - "$out" <<'PY'
import csv, os, re, sys
out = sys.argv[1]
trials, counts, current = [], {}, None
for line in open(os.path.join(out, "initcheck.log"), errors="replace"):
    m = re.match(r"PROBE (\d+) (\S+) m (\d+) n (\d+) k (\d+) (\S+) bf16 (\S+) algo (\d+) tile (\d+) stages (\d+) splitK (\d+)", line)
    if m:
        current = int(m.group(1))
        trials.append(m.groups())
        counts[current] = 0
    elif current is not None and "Uninitialized __global__ memory read" in line:
        counts[current] += 1
kernels = {}
path = os.path.join(out, "trace.r0.csv")
if os.path.exists(path):
    rows = sorted((r for r in csv.reader(open(path)) if r and r[0] == "K"), key=lambda r: int(r[1]))
    t, names = 0, []
    for r in rows:
        if "read_all" in r[-1]:
            kernels[t] = names
            t, names = t + 1, []
        else:
            names.append(r[-1].split("<")[0][:48])
print(f"{'trial':>5} {'mode':18} {'m':>5} {'n':>5} {'k':>5} {'lay':3} {'epi':4} {'algo':>4} {'tile':>4} {'st':>3} {'sk':>3} {'reports':>8}  kernels")
for g in trials:
    i = int(g[0])
    print(f"{i:5d} {g[1]:18} {g[2]:>5} {g[3]:>5} {g[4]:>5} {g[5]:3} {g[6]:4} {g[7]:>4} {g[8]:>4} {g[9]:>3} {g[10]:>3} {counts[i]:8d}  {' + '.join(kernels.get(i, ['?']))}")
seen = sum(1 for i in counts if counts[i] == 0)
print(f"{len(trials)} trials: the tool saw the GEMM's stores in {seen}, missed some in {len(trials) - seen}")
PY
