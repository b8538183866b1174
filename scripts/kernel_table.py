#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel times (gpu__time_duration.sum, CSV) per kernel name and per
step, for graphward and PyTorch side by side (scripts/kernel_profile.sh); kernels launched fewer
times than there are steps (set-up) are left out:

    python3 scripts/kernel_table.py STEPS graphward.csv torch.csv
"""
import collections
import csv
import sys


def load(path):
    """{kernel name: [total ns, launches]} from an ncu --csv log (its table after the preamble)."""
    out = collections.defaultdict(lambda: [0.0, 0])
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        print(f"kernel_table: {e}", file=sys.stderr)
        return out
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"kernel_table: no kernel table in {path}", file=sys.stderr)
        return out
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"]
        out[name][0] += float(r["Metric Value"].replace(",", ""))
        out[name][1] += 1
    return out


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    steps = int(sys.argv[1])
    for label, path in (("graphward", sys.argv[2]), ("PyTorch", sys.argv[3])):
        # Kernels launched fewer times than there are steps are set-up (initialization, cuDNN's
        # algorithm timing), not part of a step.
        k = {name: v for name, v in load(path).items() if v[1] >= steps}
        total = sum(v[0] for v in k.values()) / steps / 1e3
        launches = sum(v[1] for v in k.values()) / steps
        print(f"\n{label}: {total:.1f} us of kernels per step, {launches:.0f} launches per step")
        print(f"{'us/step':>9s} {'n/step':>7s}  kernel")
        for name, (ns, n) in sorted(k.items(), key=lambda kv: -kv[1][0])[:25]:
            print(f"{ns / steps / 1e3:9.1f} {n / steps:7.1f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
