#!/usr/bin/env python3
"""graphward against PyTorch at its strongest, from one run of scripts/strongest.sh: markdown
tables of the whole training step, the eager step back to back (C++ against C++), the captured
backward of the studies and the review's sweep, each row naming the PyTorch variant that won, and
each ratio against its target.

    python3 scripts/strongest_table.py DIR

DIR holds what scripts/strongest.sh wrote: models.json and overlap.json (graphward, Google
Benchmark), torch_models.csv and torch_overlap.csv (scripts/compare_torch.py --strongest /
--overlap), libtorch_<family>.json (bench/libtorch). A file missing leaves its columns empty.
"""
import csv
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overlap_table import salvage  # noqa: E402  (a JSON file cut short)

MODELS = [  # (kind, config as named in the rows, label, whole-step target, small)
    ("mlp", "hidden:256/layers:4/batch:128", "MLP 256×4, batch 128", 0.75, True),
    ("mlp", "hidden:2048/layers:4/batch:1024", "MLP 2048×4, batch 1024", 0.95, False),
    ("convnet", "batch:64/image:16/channels:16", "convnet b64 16² c16", 0.75, True),
    ("convnet", "batch:256/image:32/channels:64", "convnet b256 32² c64", 0.95, False),
    ("transformer", "batch:16/seq:32/dim:64", "transformer b16 s32 d64", 0.75, True),
    ("transformer", "batch:32/seq:128/dim:256", "transformer b32 s128 d256", 0.95, False),
]
GW_NAMES = {"mlp": "Mlp", "convnet": "Convnet", "transformer": "Transformer"}
STUDIES = [  # (k, d, n, b, multistream, label, target against PyTorch's graph, grads None)
    (4, 8, 256, 64, 1, "4 branches × 8, width 256, batch 64, stream per branch", 0.85),
    (1, 32, 256, 64, 0, "1 × 32, width 256, batch 64", 0.85),
    (4, 4, 1024, 256, 1, "4 × 4, width 1024, batch 256, stream per branch", 1.0),
    (2, 1, 512, 512, 1, "the review's sweep N = 512, two streams", None),
]


RUN_OPTIONS = re.compile(r"/(min_time|min_warmup_time|iterations|repeats|threads):[^/]*|"
                         r"/(manual_time|real_time|process_time)(?=/|$)")


def run_name(bm):
    """A benchmark's name without Google Benchmark's run options (min_time, iterations, ...)."""
    return RUN_OPTIONS.sub("", bm.get("run_name", bm["name"]))


def entries_of(path):
    """The entries of a Google Benchmark JSON file (those written before it stopped, for a file cut
    short); none when there is no file."""
    if not os.path.exists(path):
        return []
    text = open(path).read()
    try:
        return json.loads(text)["benchmarks"]
    except (ValueError, KeyError):
        return salvage(text)


def load_bench(path):
    """{run name: median benchmark entry} of a Google Benchmark JSON file (or what it holds)."""
    # The median of a run's repetitions; a run with no aggregates (one repetition) its one entry.
    out, aggregated = {}, set()
    for bm in entries_of(path):
        if bm.get("error_occurred"):
            continue
        name = run_name(bm)
        if bm.get("run_type") == "aggregate" or "aggregate_name" in bm:
            if bm.get("aggregate_name") == "median":
                out[name] = bm
                aggregated.add(name)
        elif name not in aggregated:
            out[name] = bm
    return out


def load_errors(path):
    """{run name: error message} of the rows that could not run."""
    return {run_name(bm): bm.get("error_message", "")
            for bm in entries_of(path) if bm.get("error_occurred")}


def load_csv(path):
    if not os.path.exists(path):
        return {}
    out = {}
    for r in csv.DictReader(open(path)):
        out[r["config"]] = r
    return out


def num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def fmt(v, prec=1):
    return "—" if v is None else f"{v:.{prec}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def verdict(r, target, higher=False):
    if r is None or target is None:
        return ""
    ok = r >= target if higher else r <= target
    return "met" if ok else "**not met**"


def fastest(rows):
    """(µs, name) of the smallest µs among (name, µs) pairs, or (None, "")."""
    rows = [(v, n) for n, v in rows if v is not None]
    return min(rows) if rows else (None, "")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    gw = load_bench(os.path.join(d, "models.json"))
    ov = load_bench(os.path.join(d, "overlap.json"))
    lt, lt_err = {}, {}
    for name in sorted(os.listdir(d)):
        if name.startswith("libtorch") and name.endswith(".json"):
            lt.update(load_bench(os.path.join(d, name)))
            lt_err.update(load_errors(os.path.join(d, name)))
    tm = load_csv(os.path.join(d, "torch_models.csv"))
    to = load_csv(os.path.join(d, "torch_overlap.csv"))

    def torch_variants(kind, config, column="event_us"):
        prefix = f"torch_{kind}/{config}/mode:"
        return [(k[len(prefix):], num(r[column])) for k, r in tm.items() if k.startswith(prefix)]

    def gw_row(kind, config, mode):
        return gw.get(f"{GW_NAMES[kind]}/{config}/mode:{mode}")

    def lt_variants(kind, config, column=None):
        prefix = f"Libtorch/{kind}/{config}/mode:"
        return [(k[len(prefix):], bm.get(column) if column else bm["real_time"])
                for k, bm in lt.items() if k.startswith(prefix)]

    print("### The whole training step: graphward's StepGraph against PyTorch's strongest\n")
    print("µs a step, CUDA events around the step, medians. graphward: the faster of mode 2 "
          "(StepGraph) and mode 3 (the optimizer stepped in the backward). PyTorch: the fastest "
          "variant of `compare_torch.py --strongest` (cudnn.benchmark on), named; libtorch: its "
          "whole step in an `at::cuda::CUDAGraph` with the fused AdamW.\n")
    print("| model | graphward StepGraph | PyTorch's strongest | its variant | graphward / PyTorch "
          "| target | libtorch graph | graphward / libtorch |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, config, label, target, _ in MODELS:
        modes = [(m, gw_row(kind, config, m)) for m in (2, 3)]
        best_gw, best_mode = fastest([(f"mode {m}", bm["real_time"] if bm else None)
                                      for m, bm in modes])
        pt, pt_name = fastest(torch_variants(kind, config))
        lg, lg_name = fastest([(n, v) for n, v in lt_variants(kind, config)
                               if n.startswith("graph")])
        r = ratio(best_gw, pt)
        print(f"| {label} | {fmt(best_gw)} ({best_mode or '—'}) | {fmt(pt)} | {pt_name or '—'} | "
              f"{fmt(r, 3)} | ≤ {target} {verdict(r, target)} | {fmt(lg)} {lg_name} | "
              f"{fmt(ratio(best_gw, lg), 3)} |")

    print("\n### Every PyTorch variant, µs a step (event time; `loop` = steps back to back)\n")
    names = sorted({k.split("/mode:")[1] for k in tm})
    if names:
        print("| model | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for kind, config, label, _, _ in MODELS:
            v = dict(torch_variants(kind, config))
            cells = []
            for n in names:
                r = tm.get(f"torch_{kind}/{config}/mode:{n}")
                if r is None:
                    cells.append("")
                elif v.get(n) is None:
                    cells.append("cannot run")
                else:
                    cells.append(f"{fmt(v[n])} (loop {fmt(num(r.get('loop_us')))})")
            print(f"| {label} | " + " | ".join(cells) + " |")
        notes = [(k, r["note"]) for k, r in tm.items() if r.get("note")]
        for k, note in notes:
            print(f"\n- `{k}`: {note}")

    print("\n### The eager step back to back, C++ against C++\n")
    print("µs a step in the loop a user writes (steps back to back, nothing synchronized between "
          "them; `loop_us`). graphward: mode 0 (eager backward). libtorch: its fastest eager "
          "variant (libtorch's AdamW, or the fused one). PyTorch (Python): its fastest eager "
          "variant, the same loop.\n")
    print("| model | graphward eager | libtorch eager | its variant | libtorch / graphward | target "
          "| PyTorch eager (Python) | its variant | PyTorch / graphward |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, config, label, _, small in MODELS:
        g = gw_row(kind, config, 0)
        g_loop = g.get("loop_us") if g else None
        le, le_name = fastest([(n, v) for n, v in lt_variants(kind, config, "loop_us")
                               if n.startswith("eager")])
        pe, pe_name = fastest([(n, v) for n, v in torch_variants(kind, config, "loop_us")
                               if n.startswith("eager")])
        r = ratio(le, g_loop)
        print(f"| {label} | {fmt(g_loop)} | {fmt(le)} | {le_name or '—'} | {fmt(r, 2)} | "
              f"{'≥ 1.5 ' + verdict(r, 1.5, higher=True) if small else ''} | {fmt(pe)} | "
              f"{pe_name or '—'} | {fmt(ratio(pe, g_loop), 2)} |")
    for name, err in sorted(lt_err.items()):
        print(f"\n- libtorch `{name}`: {err}")

    print("\n### The captured backward of the studies\n")
    print("µs a backward, CUDA events, medians. graphward: BackwardGraph's replay (weight-gradient "
          "parallelism on, as shipped). PyTorch: its backward captured in `torch.cuda.graph` with "
          "every `.grad` None before the warm-up and the capture; the capture that accumulates into "
          ".grads left by the warm-up is the second column. libtorch: the same capture in C++.\n")
    print("| study | graphward | PyTorch, grads None | PyTorch, accumulating | graphward / PyTorch "
          "(None) | target | libtorch, grads None | libtorch, accumulating |")
    print("|---|---|---|---|---|---|---|---|")
    for k, dd, n, b, ms, label, target in STUDIES:
        if k == 2 and dd == 1:
            g = ov.get(f"OverlapSweep/width:{n}/graph:1/multistream:{ms}")
        else:
            g = ov.get(f"Overlap/branches:{k}/depth:{dd}/width:{n}/batch:{b}/graph:1/"
                       f"multistream:{ms}/split:1")
        gv = g["real_time"] if g else None
        base = f"branches:{k}/depth:{dd}/width:{n}/batch:{b}"
        p1 = num(to.get(f"torch_overlap/{base}/graph:1/multistream:{ms}", {}).get("event_us"))
        p2 = num(to.get(f"torch_overlap/{base}/graph:2/multistream:{ms}", {}).get("event_us"))
        l1 = lt.get(f"LibtorchStudy/{base}/multistream:{ms}/graph:1")
        l2 = lt.get(f"LibtorchStudy/{base}/multistream:{ms}/graph:2")
        r = ratio(gv, p1)
        print(f"| {label} | {fmt(gv)} | {fmt(p1)} | {fmt(p2)} | {fmt(r, 3)} | "
              f"{('≤ ' + str(target) + ' ' + verdict(r, target)) if target else ''} | "
              f"{fmt(l1['real_time'] if l1 else None)} | {fmt(l2['real_time'] if l2 else None)} |")

    print("\n### The review's sweep in the graph: one stream against two\n")
    print("µs a replayed backward; 1 str / 2 str above 1: the second stream pays off. Target: "
          "graphward's ≥ 0.97 at every N.\n")
    print("| N | graphward 1 str | 2 str | 1/2 | target | PyTorch (None) 1 str | 2 str | 1/2 |")
    print("|---|---|---|---|---|---|---|---|")
    for e in range(6, 14):
        n = 1 << e
        g1, g2 = (ov.get(f"OverlapSweep/width:{n}/graph:1/multistream:{m}") for m in (0, 1))
        g1v, g2v = (x["real_time"] if x else None for x in (g1, g2))
        base = f"branches:2/depth:1/width:{n}/batch:{n}/graph:1"
        p1, p2 = (num(to.get(f"torch_overlap/{base}/multistream:{m}", {}).get("event_us"))
                  for m in (0, 1))
        r = ratio(g1v, g2v)
        print(f"| {n} | {fmt(g1v)} | {fmt(g2v)} | {fmt(r, 3)} | ≥ 0.97 "
              f"{verdict(r, 0.97, higher=True)} | {fmt(p1)} | {fmt(p2)} | {fmt(ratio(p1, p2), 3)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
