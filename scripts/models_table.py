#!/usr/bin/env python3
"""graphward's real-model training steps (bench/models_bench.cpp: MLP, convnet, transformer) side
by side with PyTorch's (scripts/compare_torch.py --models), as one table per model of µs per
training step (CUDA events around the step, medians) and the ratios the project sets
targets for:

    python3 scripts/models_table.py models.json torch_models.csv

PyTorch's rows are every mode scripts/compare_torch.py runs (eager and whole-step graph, with the
foreach or the fused AdamW, and torch.compile); "pt best" is the fastest of them, with its mode.

eager ×: the fastest PyTorch eager step (eager or eager_fused) / graphward eager;
full/pt-best: graphward's full-step graph / the fastest PyTorch row of the configuration.
Rows PyTorch could not run are listed under each table with the reason.
"""
import csv
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overlap_table import fmt, medians, ratio  # noqa: E402

# (model, its configuration as written in the names, mode)
GW = re.compile(r"(MlpUnfusedEpilogues|Mlp|Convnet|Transformer)/((?:[a-z]+:\d+/)+)mode:(\d)")
TORCH = re.compile(r"torch_(mlp|convnet|transformer)/((?:[a-z]+:\d+/)+)mode:([a-z_+]+)")
EAGER_MODES = ("eager", "eager_fused")
TITLES = {
    "mlp": "MLP (input 256, hidden layers of linear + GELU, 10 classes)",
    "convnet": "convnet (3xSxS images, conv+ReLU, max pool, conv+ReLU, avg pool, linear; 10 classes)",
    "transformer": "transformer block (dim/16 heads, MLP 4·dim, vocabulary 64)",
}


def config_key(text):
    """"hidden:256/layers:4/batch:128/" -> ((hidden, 256), ...), sorted by the numbers."""
    return tuple((k, int(v)) for k, v in (p.split(":") for p in text.strip("/").split("/")))


def load_graphward(path):
    out = {}
    for bm in medians(path):
        m = GW.search(bm.get("run_name", bm["name"]))
        if m:
            model, config, mode = m.groups()
            out[(model.lower(), config_key(config), int(mode))] = bm["real_time"]  # µs
    return out


def load_torch(path):
    """{(model, config, mode): event µs} for the rows that ran, and {(model, config, mode): note}
    for those that could not."""
    out, notes = {}, {}
    if not path or not os.path.exists(path):
        return out, notes
    for r in csv.DictReader(open(path)):
        m = TORCH.search(r["config"])
        if m:
            model, config, mode = m.groups()
            key = (model, config_key(config), mode)
            value = float(r["event_us"])
            if math.isnan(value):
                notes[key] = r.get("note") or "no figure"
            else:
                out[key] = value
    return out, notes


def fastest(torch, model, config, modes=None):
    """(µs, mode) of the fastest PyTorch row of `config` (among `modes`), or (None, "")."""
    rows = [(v, k[2]) for k, v in torch.items()
            if k[0] == model and k[1] == config and (modes is None or k[2] in modes)]
    return min(rows) if rows else (None, "")


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    gw = load_graphward(sys.argv[1])
    torch, notes = load_torch(sys.argv[2] if len(sys.argv) > 2 else None)
    print("Training step, µs per step (cross-entropy, AdamW; CUDA events, medians)")
    for model in ("mlp", "convnet", "transformer"):
        configs = sorted({k[1] for k in gw if k[0] == model} |
                         {k[1] for k in torch if k[0] == model}, key=lambda c: [v for _, v in c])
        if not configs:
            continue
        print(f"\n{TITLES[model]}")
        print(f"{'config':32s} {'gw eager':>10s} {'gw bwd-gr':>10s} {'gw full':>10s} "
              f"{'pt eager':>10s} {'pt graph':>10s} {'pt best':>10s} {'(mode)':15s} "
              f"{'eager x':>8s} {'full/pt-best':>12s}")
        for c in configs:
            e, bg, fs = (gw.get((model, c, m)) for m in (0, 1, 2))
            pe, pg = torch.get((model, c, "eager")), torch.get((model, c, "graph"))
            best, best_mode = fastest(torch, model, c)
            best_eager, _ = fastest(torch, model, c, EAGER_MODES)
            name = " ".join(f"{k} {v}" for k, v in c)
            print(f"{name:32s} {fmt(e, 10)} {fmt(bg, 10)} {fmt(fs, 10)} {fmt(pe, 10)} "
                  f"{fmt(pg, 10)} {fmt(best, 10)} {best_mode:15s} {fmt(ratio(best_eager, e), 8, 2)} "
                  f"{fmt(ratio(fs, best), 12, 2)}")
        for (m, c, mode), note in sorted(notes.items()):
            if m == model:
                name = " ".join(f"{k} {v}" for k, v in c)
                print(f"  PyTorch {mode} could not run at {name}: {note}")
    # The optimizer stepped inside the backward (mode 3: StepInBackward) against after it (mode 2),
    # where measured.
    rows = sorted({(k[0], k[1]) for k in gw if k[2] == 3 and k[0] in TITLES},
                  key=lambda mc: (list(TITLES).index(mc[0]), [v for _, v in mc[1]]))
    if rows:
        print("\nThe full step with the optimizer stepped in the backward (mode 3) and after it "
              "(mode 2), same run")
        print(f"{'model':12s} {'config':32s} {'after':>10s} {'in bwd':>10s} {'in/after':>9s} "
              f"{'pt best':>10s} {'in/pt-best':>11s}")
        for model, c in rows:
            after, inside = gw.get((model, c, 2)), gw.get((model, c, 3))
            best, _ = fastest(torch, model, c)
            name = " ".join(f"{k} {v}" for k, v in c)
            print(f"{model:12s} {name:32s} {fmt(after, 10)} {fmt(inside, 10)} "
                  f"{fmt(ratio(inside, after), 9, 2)} {fmt(best, 10)} {fmt(ratio(inside, best), 11, 2)}")
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
