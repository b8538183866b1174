#!/usr/bin/env python3
"""Two builds of graphward compared in one run: the Google Benchmark JSON files of alternating
passes — A (the code before), B (the code after), A, B, ... — as one table of the benchmarks'
times and the ratio B/A:

    python3 scripts/ab_table.py A1.json B1.json A2.json B2.json [--counter NAME]

Each benchmark's time in a pass is its median aggregate where the pass ran repetitions, else its
one row (real time, in the benchmark's unit; --counter NAME: that counter instead, e.g. host_us).
B/A is the median of B's passes over the median of A's; "noisy" marks a benchmark whose passes of
one build differ by as much as the builds do (compare again, or with more passes).
A benchmark missing from a pass shows "-" there. scripts/ab.sh makes the passes.
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overlap_table import salvage  # noqa: E402  (a JSON file cut short: its complete entries)

SUFFIXES = ("_median",)


def load(path, counter):
    """{benchmark name: time} of one pass."""
    try:
        text = open(path).read()
    except OSError as e:
        print(f"ab_table: cannot read {path}: {e}", file=sys.stderr)
        return {}
    try:
        rows = json.loads(text)["benchmarks"]
    except (ValueError, KeyError):
        rows = salvage(text)
    medians, plain = {}, {}
    for r in rows:
        value = r.get(counter) if counter else r.get("real_time")
        if value is None:
            continue
        if r.get("run_type") == "aggregate":
            if r.get("aggregate_name") == "median":
                medians[r["run_name"]] = float(value)
        else:
            plain.setdefault(r.get("run_name", r["name"]), float(value))
    return medians or plain


def short(name):
    """The benchmark's name without Google Benchmark's suffixes (min_time, manual_time)."""
    parts = [p for p in name.split("/") if not p.startswith("min_time:") and p != "manual_time"
             and p != "real_time"]
    return "/".join(parts)


def table(paths, counter=None):
    passes = [load(p, counter) for p in paths]
    names = []
    for p in passes:
        for n in p:
            if n not in names:
                names.append(n)
    labels = [("A" if i % 2 == 0 else "B") + str(i // 2 + 1) for i in range(len(paths))]
    width = max([len(short(n)) for n in names] + [9])
    lines = [f"{'benchmark':{width}s} " + " ".join(f"{l:>9s}" for l in labels) + "       B/A"]
    for n in names:
        values = [p.get(n) for p in passes]
        a = [v for i, v in enumerate(values) if i % 2 == 0 and v is not None]
        b = [v for i, v in enumerate(values) if i % 2 == 1 and v is not None]
        cells = " ".join(f"{v:9.1f}" if v is not None else f"{'-':>9s}" for v in values)
        if a and b:
            ma, mb = statistics.median(a), statistics.median(b)
            r = f"{mb / ma:10.3f}" if ma > 0 else f"{'-':>10s}"
            spread = max(max(a) - min(a), max(b) - min(b))
            if spread >= abs(mb - ma):
                r += "  noisy"
        else:
            r = f"{'-':>10s}"
        lines.append(f"{short(n):{width}s} {cells}{r}")
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    counter = None
    if "--counter" in args:
        i = args.index("--counter")
        if i + 1 >= len(args):
            print("ab_table: --counter needs a name (e.g. host_us)", file=sys.stderr)
            return 2
        counter = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        print("usage: ab_table.py A1.json B1.json [A2.json B2.json ...] [--counter NAME]",
              file=sys.stderr)
        return 2
    print(table(args, counter))
    return 0


if __name__ == "__main__":
    sys.exit(main())
