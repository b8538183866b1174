#!/usr/bin/env python3
"""graphward's overlap studies (bench/overlap_bench.cpp, Google Benchmark JSON) side by side with
PyTorch's (scripts/compare_torch.py --overlap CSV) from the same GPU run: per study and per
sweep size, the backward's time with the forward on one stream and on a stream per branch, eager
and replayed as a CUDA graph, and the overlap ratio (one stream / K streams: above 1, the streams
pay off). Medians, µs, CUDA events around the backward on both sides.

    python3 scripts/overlap_table.py overlap.json[,more.json] [torch_overlap.csv] [--csv merged.csv]

The merged CSV (one row per library, mode, size) is what scripts/plot_overlap.py draws.
"""
import argparse
import csv
import json
import math
import re
import sys

KEY = re.compile(r"branches:(\d+)/depth:(\d+)/width:(\d+)/batch:(\d+)/graph:(\d)/multistream:(\d)"
                 r"(?:/split:(\d))?")
SWEEP = re.compile(r"OverlapSweep/width:(\d+)/graph:(\d)/multistream:(\d)")


def salvage(text):
    """The complete entries of the "benchmarks" array of a JSON file cut short."""
    start = text.find('"benchmarks"')
    if start < 0:
        return []
    i = text.find("[", start) + 1
    out, dec = [], json.JSONDecoder()
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return out
        out.append(obj)


def medians(path):
    """The median entries of a Google Benchmark JSON file (and the entries of a run without
    aggregates), errors left out; a file cut short gives those it finished."""
    text = open(path).read()
    try:
        benchmarks = json.loads(text)["benchmarks"]
    except (ValueError, KeyError):
        benchmarks = salvage(text)
    return [bm for bm in benchmarks
            if bm.get("aggregate_name", "median") == "median" and not bm.get("error_occurred")]


def load_graphward(paths):
    """{(k, d, n, b, graph, multi, split): benchmark} from the medians of GB JSON files
    (comma-separated paths)."""
    out = {}
    benchmarks = []
    for path in paths.split(","):
        try:
            text = open(path).read()
        except OSError as e:
            print(f"overlap_table: skipping {path}: {e}", file=sys.stderr)
            continue
        try:
            benchmarks += json.loads(text)["benchmarks"]
        except (ValueError, KeyError) as e:  # a run cut short: use the benchmarks it finished
            found = salvage(text)
            print(f"overlap_table: {path} is incomplete ({e}); using the {len(found)} benchmark "
                  f"entries written before it stopped", file=sys.stderr)
            benchmarks += found
    for bm in benchmarks:
        if bm.get("aggregate_name", "median") != "median" or bm.get("error_occurred"):
            continue
        name = bm.get("run_name", bm["name"])
        m = SWEEP.search(name)
        if m:
            n, g, ms = (int(x) for x in m.groups())
            out[(2, 1, n, n, g, ms, 0)] = bm
            continue
        m = KEY.search(name)
        if m and name.startswith("Overlap/"):
            k, d, n, b, g, ms, sp = (int(x) if x is not None else 0 for x in m.groups())
            out[(k, d, n, b, g, ms, sp)] = bm
    return out


def load_torch(path):
    out = {}
    if not path:
        return out
    for r in csv.DictReader(open(path)):
        m = KEY.search(r["config"])
        if m:
            k, d, n, b, g, ms, _ = m.groups()
            out[(int(k), int(d), int(n), int(b), int(g), int(ms), 0)] = float(r["event_us"])
    return out


def fmt(v, width=8, prec=1):
    return f"{v:{width}.{prec}f}" if v is not None and not math.isnan(v) else f"{'-':>{width}s}"


def ratio(a, b):
    return a / b if a and b and not math.isnan(a) and not math.isnan(b) else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphward_json")
    ap.add_argument("torch_csv", nargs="?")
    ap.add_argument("--csv", help="write the merged rows here (for plot_overlap.py)")
    args = ap.parse_args()
    gw = load_graphward(args.graphward_json)
    th = load_torch(args.torch_csv)
    if not gw:
        print(f"overlap_table: no Overlap/OverlapSweep medians in {args.graphward_json}",
              file=sys.stderr)
        return 2
    merged = []

    def t_gw(key):
        bm = gw.get(key)
        return bm["real_time"] if bm else None

    studies = sorted({k[:4] for k in gw if not (k[0] == 2 and k[1] == 1)}, key=lambda s: (-s[0], s[2]))
    head = f"{'':26s}" + "".join(f" {h:>26s}" for h in ("graphward eager", "graphward graph",
                                                        "PyTorch eager", "PyTorch graph"))
    sub = f"{'study':26s}" + "".join(f" {'1 str':>8s} {'K str':>8s} {'ovl':>8s}" for _ in range(4))
    print(head + "\n" + sub)
    for s in studies:
        for split in (0, 1):
            cells = []
            for lib, g in (("gw", 0), ("gw", 1), ("torch", 0), ("torch", 1)):
                if lib == "torch" and split:
                    one = many = None
                elif lib == "gw":
                    one, many = t_gw(s + (g, 0, split)), t_gw(s + (g, 1, split))
                else:
                    one, many = th.get(s + (g, 0, 0)), th.get(s + (g, 1, 0))
                cells.append((one, many, ratio(one, many)))
                for ms, v in ((0, one), (1, many)):
                    if v is not None:
                        merged.append(("graphward" if lib == "gw" else "pytorch", "graph" if g else "eager",
                                       ms, split, *s, v))
            if all(c[0] is None for c in cells):
                continue
            label = f"{s[0]}x{s[1]} w{s[2]} b{s[3]}" + (" +split" if split else "")
            print(f"{label:26s}" + "".join(f" {fmt(a)} {fmt(b)} {fmt(r, 8, 2)}" for a, b, r in cells))
    sizes = sorted({k[2] for k in gw if k[0] == 2 and k[1] == 1})
    if sizes:
        print("\nthe review's sweep: two parallel linears on an N x N input (µs per backward; ovl = "
              "1 stream / 2 streams)")
        print(f"{'N':>6s}" + "".join(f" {h:>26s}" for h in ("graphward eager", "graphward graph",
                                                             "PyTorch eager", "PyTorch graph")))
        best = {}
        for n in sizes:
            key = (2, 1, n, n)
            cells = []
            for lib, g in (("graphward eager", 0), ("graphward graph", 1), ("PyTorch eager", 0),
                           ("PyTorch graph", 1)):
                if lib.startswith("graphward"):
                    one, many = t_gw(key + (g, 0, 0)), t_gw(key + (g, 1, 0))
                else:
                    one, many = th.get(key + (g, 0, 0)), th.get(key + (g, 1, 0))
                r = ratio(one, many)
                cells.append((one, many, r))
                if r is not None and (lib not in best or r > best[lib][1]):
                    best[lib] = (n, r)
                for ms, v in ((0, one), (1, many)):
                    if v is not None:
                        merged.append(("graphward" if lib.startswith("graphward") else "pytorch",
                                       "graph" if g else "eager", ms, 0, *key, v))
            print(f"{n:6d}" + "".join(f" {fmt(a)} {fmt(b)} {fmt(r, 8, 2)}" for a, b, r in cells))
        for lib, (n, r) in best.items():
            print(f"best overlap, {lib}: N = {n}: on 2 streams the backward is "
                  f"{'faster' if r >= 1 else 'slower'} by {abs(100 * (1 - 1 / r)):.1f}% of its "
                  f"1-stream time (1 stream / 2 streams = {r:.2f})")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["library", "mode", "multistream", "split", "branches", "depth", "width",
                        "batch", "us"])
            w.writerows(merged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
