#!/usr/bin/env bash
# Where a training step's GPU time goes, kernel by kernel, graphward against PyTorch: Nsight
# Compute (--clock-control none) times every kernel of a few eager steps of the same model (the
# kernels a graph replays are the same), and scripts/kernel_table.py sums them per kernel name and
# per step, side by side. Run on the GPU machine after a build (scripts/gpu_check.sh builds).
#   scripts/kernel_profile.sh convnet|convnet-small|transformer|transformer-small [steps]
# (the large and the small rows of bench/models_bench.cpp). Kernels launched fewer times than
# there are steps (set-up: initialization, cuDNN's algorithm timing) are left out of the table.
# Writes $OUT/kernels_<model>_{graphward,torch}.csv (or build/) and prints the table.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
model=${1:?usage: kernel_profile.sh convnet|convnet-small|transformer|transformer-small [steps]}
steps=${2:-3}
dir=${OUT:-$GW_BUILD_DIR}
NCU=${NCU:-ncu}
if ! command -v "$NCU" >/dev/null 2>&1; then
  echo "kernel_profile.sh: Nsight Compute ($NCU) is not found; nothing profiled (put ncu on the" \
    "PATH, or NCU=/path/to/ncu)" >&2
  exit 2
fi
ncu_run() {  # ncu_run CSV COMMAND...: fails, saying why, when the profile did not run
  if ! "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$1" "${@:2}" >/dev/null 2>"$1.stderr" || [ ! -s "$1" ]; then
    echo "kernel_profile.sh: profiling ${*:2} failed (no kernel times in $1):" >&2
    tail -5 "$1.stderr" >&2
    exit 1
  fi
}
case "$model" in
  convnet)
    gw=("$GW_BUILD_DIR/examples/train_convnet" --batch 256 --image 32 --channels 64)
    torch_make="c.make_convnet(torch, 256, 32, 64)" ;;
  convnet-small)
    gw=("$GW_BUILD_DIR/examples/train_convnet" --batch 64 --image 16 --channels 16)
    torch_make="c.make_convnet(torch, 64, 16, 16)" ;;
  transformer-small)
    gw=("$GW_BUILD_DIR/examples/train_transformer" --batch 16 --seq 32 --dim 64 --heads 4 --ff 256
        --vocab 64)
    torch_make="c.make_transformer(torch, 16, 32, 64)" ;;
  transformer)
    gw=("$GW_BUILD_DIR/examples/train_transformer" --batch 32 --seq 128 --dim 256 --heads 16
        --ff 1024 --vocab 64)
    torch_make="c.make_transformer(torch, 32, 128, 256)" ;;
  *) echo "kernel_profile.sh: unknown model $model; expected convnet, convnet-small, transformer or transformer-small"; exit 2 ;;
esac
ncu_run "$dir/kernels_${model}_graphward.csv" "${gw[@]}" --mode eager --steps "$steps"
ncu_run "$dir/kernels_${model}_torch.csv" python3 - <<PY
import sys
sys.path.insert(0, "$GW_ROOT/scripts")
import torch
import compare_torch as c
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
model, params, xs, ts = $torch_make
opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
for i in range($steps):
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(xs[i % 4]), ts[i % 4]).backward()
    opt.step()
torch.cuda.synchronize()
PY
python3 "$GW_ROOT/scripts/kernel_table.py" "$steps" "$dir/kernels_${model}_graphward.csv" \
  "$dir/kernels_${model}_torch.csv"
