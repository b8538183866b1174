#!/usr/bin/env python3
"""Draws the review's sweep (scripts/overlap_table.py --csv output) as a PNG: time per backward
against N (log-log), one line per library, mode and stream count; below it, the overlap ratio
(1 stream / 2 streams) against N. Needs matplotlib (not needed by graphward's tests).

    python3 scripts/plot_overlap.py merged.csv docs/overlap_sweep.png [--title "..."]
"""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("merged_csv")
    ap.add_argument("png")
    ap.add_argument("--title", default="Two parallel linears on an N x N input: backward time")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_overlap: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    lines = collections.defaultdict(dict)
    for r in csv.DictReader(open(args.merged_csv)):
        if r["branches"] != "2" or r["depth"] != "1":
            continue
        lines[(r["library"], r["mode"], int(r["multistream"]))][int(r["width"])] = float(r["us"])
    if not lines:
        print("plot_overlap: no sweep rows in the CSV", file=sys.stderr)
        return 2
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 9), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    colors = {("graphward", "eager"): "tab:blue", ("graphward", "graph"): "tab:green",
              ("pytorch", "eager"): "tab:red", ("pytorch", "graph"): "tab:orange"}
    for (lib, mode, ms), pts in sorted(lines.items()):
        xs = sorted(pts)
        top.plot(xs, [pts[x] for x in xs], marker="o", color=colors[(lib, mode)],
                 linestyle="-" if ms else "--", label=f"{lib} {mode}, {'2 streams' if ms else '1 stream'}")
    for (lib, mode) in colors:
        one, two = lines.get((lib, mode, 0)), lines.get((lib, mode, 1))
        if one and two:
            xs = sorted(set(one) & set(two))
            bottom.plot(xs, [one[x] / two[x] for x in xs], marker="o", color=colors[(lib, mode)],
                        label=f"{lib} {mode}")
    top.set_xscale("log", base=2)
    top.set_yscale("log")
    top.set_ylabel("µs per backward (median, CUDA events)")
    top.set_title(args.title)
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=8)
    bottom.axhline(1.0, color="gray", linewidth=1)
    bottom.set_xscale("log", base=2)
    bottom.set_xlabel("N (input N x N, two linears N -> N)")
    bottom.set_ylabel("1 stream / 2 streams")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"plot_overlap: wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
