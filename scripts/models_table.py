#!/usr/bin/env python3
"""graphward's real-model training steps (bench/models_bench.cpp) side by side with PyTorch's
(scripts/compare_torch.py --models), as one table of µs per training step (CUDA events around the
step, medians) and the ratios the real-models issue sets targets for:

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

GW = re.compile(r"Mlp/hidden:(\d+)/layers:(\d+)/batch:(\d+)/mode:(\d)")
TORCH = re.compile(r"torch_mlp/hidden:(\d+)/layers:(\d+)/batch:(\d+)/mode:(eager|graph)")


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
            h, l, b, mode = (int(x) for x in m.groups())
            out[(h, l, b, mode)] = bm["real_time"]  # manual time, µs (Unit kMicrosecond)
    return out


def load_torch(path):
    out = {}
    if not path or not os.path.exists(path):
        return out
    for r in csv.DictReader(open(path)):
        m = TORCH.search(r["config"])
        if m:
            h, l, b, mode = m.groups()
            out[(int(h), int(l), int(b), mode)] = float(r["event_us"])
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    gw = load_graphward(sys.argv[1])
    torch = load_torch(sys.argv[2] if len(sys.argv) > 2 else None)
    print("MLP training step (µs per step; input 256, 10 classes, AdamW)")
    print(f"{'model':28s} {'gw eager':>10s} {'gw bwd-gr':>10s} {'gw full':>10s} "
          f"{'pt eager':>10s} {'pt graph':>10s} {'eager x':>8s} {'full/pt-gr':>10s}")
    configs = sorted({k[:3] for k in gw} | {k[:3] for k in torch})
    for h, l, b in configs:
        e, bg, fs = (gw.get((h, l, b, m)) for m in (0, 1, 2))
        pe, pg = torch.get((h, l, b, "eager")), torch.get((h, l, b, "graph"))
        name = f"hidden {h} x{l}, batch {b}"
        print(f"{name:28s} {fmt(e, 10)} {fmt(bg, 10)} {fmt(fs, 10)} {fmt(pe, 10)} {fmt(pg, 10)} "
              f"{fmt(ratio(pe, e), 8, 2)} {fmt(ratio(fs, pg), 10, 2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
