#!/usr/bin/env python3
"""graphward's real-model training steps (bench/models_bench.cpp: MLP, convnet, transformer) side
by side with PyTorch's (scripts/compare_torch.py --models), as one table per model of µs per
training step (CUDA events around the step, medians) and the ratios the project sets
targets for:

    python3 scripts/models_table.py models.json torch_models.csv

eager ×: PyTorch eager / graphward eager (target: >= 3 on launch-bound configurations);
full-step vs torch graph: graphward's full-step graph / PyTorch's whole-step graph (target: < 1).
"""
import csv
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overlap_table import fmt, ratio, salvage  # noqa: E402  (salvage: a JSON file cut short)

# (model, its configuration as written in the names, mode)
GW = re.compile(r"(MlpUnfusedEpilogues|Mlp|Convnet|Transformer)/((?:[a-z]+:\d+/)+)mode:(\d)")
TORCH = re.compile(r"torch_(mlp|convnet|transformer)/((?:[a-z]+:\d+/)+)mode:(eager|graph)")
TITLES = {
    "mlp": "MLP (input 256, hidden layers of linear + GELU, 10 classes)",
    "convnet": "convnet (3xSxS images, conv+ReLU, max pool, conv+ReLU, avg pool, linear; 10 classes)",
    "transformer": "transformer block (dim/16 heads, MLP 4·dim, vocabulary 64)",
}


def config_key(text):
    """"hidden:256/layers:4/batch:128/" -> ((hidden, 256), ...), sorted by the numbers."""
    return tuple((k, int(v)) for k, v in (p.split(":") for p in text.strip("/").split("/")))


def load_graphward(path):
    text = open(path).read()
    try:
        benchmarks = json.loads(text)["benchmarks"]
    except (ValueError, KeyError):
        benchmarks = salvage(text)
    out = {}
    for bm in benchmarks:
        if bm.get("aggregate_name", "median") != "median" or bm.get("error_occurred"):
            continue
        m = GW.search(bm.get("run_name", bm["name"]))
        if m:
            model, config, mode = m.groups()
            out[(model.lower(), config_key(config), int(mode))] = bm["real_time"]  # µs
    return out


def load_torch(path):
    out = {}
    if not path or not os.path.exists(path):
        return out
    for r in csv.DictReader(open(path)):
        m = TORCH.search(r["config"])
        if m:
            model, config, mode = m.groups()
            out[(model, config_key(config), mode)] = float(r["event_us"])
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    gw = load_graphward(sys.argv[1])
    torch = load_torch(sys.argv[2] if len(sys.argv) > 2 else None)
    print("Training step, µs per step (cross-entropy, AdamW; CUDA events, medians)")
    for model in ("mlp", "convnet", "transformer"):
        configs = sorted({k[1] for k in gw if k[0] == model} |
                         {k[1] for k in torch if k[0] == model}, key=lambda c: [v for _, v in c])
        if not configs:
            continue
        print(f"\n{TITLES[model]}")
        print(f"{'config':32s} {'gw eager':>10s} {'gw bwd-gr':>10s} {'gw full':>10s} "
              f"{'pt eager':>10s} {'pt graph':>10s} {'eager x':>8s} {'full/pt-gr':>10s}")
        for c in configs:
            e, bg, fs = (gw.get((model, c, m)) for m in (0, 1, 2))
            pe, pg = torch.get((model, c, "eager")), torch.get((model, c, "graph"))
            name = " ".join(f"{k} {v}" for k, v in c)
            print(f"{name:32s} {fmt(e, 10)} {fmt(bg, 10)} {fmt(fs, 10)} {fmt(pe, 10)} "
                  f"{fmt(pg, 10)} {fmt(ratio(pe, e), 8, 2)} {fmt(ratio(fs, pg), 10, 2)}")
    # The MLP with the backward epilogue fusion off (bench/models_bench.cpp), where measured.
    configs = sorted({k[1] for k in gw if k[0] == "mlpunfusedepilogues"},
                     key=lambda c: [v for _, v in c])
    if configs:
        print("\nMLP backward epilogue fusion (fused / unfused step time, same run)")
        print(f"{'config':32s} {'mode':>15s} {'fused':>10s} {'unfused':>10s} {'ratio':>8s}")
        for c in configs:
            for m, mode in enumerate(("eager", "backward graph", "full step")):
                f, u = gw.get(("mlp", c, m)), gw.get(("mlpunfusedepilogues", c, m))
                name = " ".join(f"{k} {v}" for k, v in c)
                print(f"{name:32s} {mode:>15s} {fmt(f, 10)} {fmt(u, 10)} {fmt(ratio(f, u), 8, 2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
