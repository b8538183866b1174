#!/usr/bin/env bash
# GPT-2 small's training step in graphward, llm.c and PyTorch in one run, on the GPU machine:
# bench/gpt2_bench.cpp (eager, backward graph, full step), llm.c built from its source
# (scripts/llmc.sh) and PyTorch's variants (scripts/gpt2_torch.py --time: eager, the whole step in
# a CUDA graph, torch.compile, torch.compile inside the graph), each at every batch × sequence,
# then scripts/gpt2_table.py's table and verdicts.
#   scripts/gpt2_compare.sh [OUT_DIR]
# OUT_DIR (default $GW_BUILD_DIR/gpt2_compare): gw_gpt2.json, llmc/ (llmc.csv and its logs),
# torch_gpt2.csv and its log, gpt2_table.md. Environment: GW_GPT2_SHAPES (default
# "4x64 8x256 16x1024"), GW_GPT2_TORCH_VARIANTS (";"-separated gpt2_torch.py flags, default
# "--compile --graph;--graph;--compile;-", "-" for none: run in that order, each at every shape,
# so that the strongest variant comes first), GW_GPT2_TORCH_TIMEOUT (seconds a PyTorch run,
# default 240: a compile takes minutes), GW_GPT2_DEADLINE (seconds from the start after which no
# PyTorch run starts, and none runs past it; default none: every run), GW_LLMC_STEPS (llm.c's
# steps a shape, default 50).
# The exit status is gpt2_table.py's: 0 when every target was measured and met.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

out=${1:-$GW_BUILD_DIR/gpt2_compare}
mkdir -p "$out"
shapes=${GW_GPT2_SHAPES:-4x64 8x256 16x1024}
bin=$GW_BUILD_DIR
if [ ! -x "$bin/bench/graphward_bench_gpt2" ] || [ ! -x "$bin/examples/make_token_shard" ]; then
  ensure_deps && GW_BUILD_TARGETS="graphward_bench_gpt2 make_token_shard" configure_and_build ||
    { echo "gpt2_compare.sh: the build failed"; exit 2; }
fi
shard=$out/gpt2_shard.bin
"$bin/examples/make_token_shard" "$shard" --tokens 2000000 >/dev/null || exit 2

# llm.c, built from its public source outside graphward.
GW_LLMC_SHAPES=$shapes bash "$GW_ROOT/scripts/llmc.sh" "$GW_ROOT/.deps/llm.c" "$out/llmc" \
  >"$out/llmc.log" 2>&1 || say "llm.c did not run (see $out/llmc.log)"

# graphward: every mode at the shapes asked for.
filter=$(for s in $shapes; do printf 'batch:%s/seq:%s/|' "${s%x*}" "${s#*x}"; done)
"$bin/bench/graphward_bench_gpt2" --benchmark_filter="${filter%|}" --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/gw_gpt2.json" \
  --benchmark_out_format=json >"$out/gw_gpt2.txt" 2>&1 || say "the bench failed (see gw_gpt2.txt)"

# PyTorch: each variant at each shape, each run within its own limit.
: >"$out/torch_gpt2.csv"
: >"$out/torch_gpt2.log"
IFS=';' read -r -a variants <<<"${GW_GPT2_TORCH_VARIANTS:---compile --graph;--graph;--compile;-}"
for v in "${variants[@]}"; do
  for s in $shapes; do
    limit=${GW_GPT2_TORCH_TIMEOUT:-240}
    if [ -n "${GW_GPT2_DEADLINE:-}" ]; then
      left=$((GW_GPT2_DEADLINE - SECONDS))
      if [ "$left" -lt 20 ]; then
        echo "PyTorch ${s} ${v}: not run (GW_GPT2_DEADLINE ${GW_GPT2_DEADLINE} s reached)" \
          >>"$out/torch_gpt2.log"
        continue
      fi
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    flags=()
    [ "$v" != "-" ] && read -r -a flags <<<"$v"
    PYTHONUNBUFFERED=1 timeout "$limit" python3 "$GW_ROOT/scripts/gpt2_torch.py" \
      --data "$shard" --time --batch "${s%x*}" --seq "${s#*x}" --steps 20 --warmup-steps 5 \
      "${flags[@]}" --time-csv "$out/torch_gpt2.csv" >>"$out/torch_gpt2.log" 2>&1 ||
      echo "PyTorch ${s} ${v}: exit status $? (see the lines above)" >>"$out/torch_gpt2.log"
  done
done

python3 "$GW_ROOT/scripts/gpt2_table.py" --graphward "$out/gw_gpt2.json" \
  --llmc "$out/llmc/llmc.csv" --torch "$out/torch_gpt2.csv" | tee "$out/gpt2_table.md"
