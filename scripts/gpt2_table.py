#!/usr/bin/env python3
"""GPT-2 small's training step in graphward, llm.c and PyTorch, side by side at each batch ×
sequence, with the ratios the project sets targets for:

    python3 scripts/gpt2_table.py --graphward gw_gpt2.json --llmc llmc.csv --torch torch_gpt2.csv

--graphward: bench/gpt2_bench.cpp's Google Benchmark JSON (medians where it has them; a file cut
short gives the rows it finished); tokens/s and ms/step from loop_us (steps back to back, nothing
synchronized between them: the figure a training loop gets), MFU from model_tflops against
--peak-tflops (989: an H100's or H200's dense bf16), peak_mib (graphward's pool and its graphs).
--llmc: scripts/llmc.sh's llmc.csv (median ms/step and tokens/s after the first 5 steps; its
device memory in use once it has allocated everything, the CUDA context included).
--torch: rows `gpt2_torch.py --time --time-csv` appended (one a variant and shape); "PyTorch's
fastest" is the fastest variant of the shape, named; its peak is torch.cuda.max_memory_allocated.

Targets (the full step's tokens/s): ≥ 2× llm.c's at 4 × 64, ≥ 1.3× at 8 × 256, ≥ 1.0× at
16 × 1024, ≥ 1.0× PyTorch's fastest at every shape; graphward's peak ≤ PyTorch's at 16 × 1024.
A verdict line each; a target whose figures are missing is "not measured". Exit status 0 when
every target was measured and met, 1 otherwise.
"""
import argparse
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overlap_table import medians  # noqa: E402

GW = re.compile(r"batch:(\d+)/seq:(\d+)/depth:(\d+)/mode:(\d)")
MODES = {0: "eager", 1: "backward graph", 2: "full step"}
LLMC_TARGETS = {(4, 64): 2.0, (8, 256): 1.3, (16, 1024): 1.0}


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def load_graphward(path):
    """{(batch, seq, mode): {ms, tokens_per_s, tflops, peak_mib, captures}} at depth 12."""
    out = {}
    for bm in medians(path):
        m = GW.search(bm.get("run_name", bm["name"]))
        if not m or int(m.group(3)) != 12 or "loop_us" not in bm:
            continue
        out[(int(m.group(1)), int(m.group(2)), int(m.group(4)))] = {
            "ms": bm["loop_us"] / 1e3, "tokens_per_s": bm["tokens_per_s"],
            "tflops": bm.get("model_tflops"), "peak_mib": bm.get("peak_mib"),
            "captures": bm.get("captures")}
    return out


def load_llmc(path):
    """{(batch, seq): {ms, tokens_per_s, first_loss, device_mib}} for the shapes that ran."""
    out = {}
    for r in csv.DictReader(open(path)):
        ms, tok = number(r.get("ms_per_step")), number(r.get("tokens_per_s"))
        if ms and tok:
            out[(int(r["batch"]), int(r["seq"]))] = {
                "ms": ms, "tokens_per_s": tok, "first_loss": number(r.get("first_loss")),
                "device_mib": number(r.get("device_mib"))}
    return out


def load_torch(path):
    """{(batch, seq): [(tokens_per_s, ms, peak_mib, variant)]}, one micro-batch a step only."""
    out = {}
    for r in csv.DictReader(open(path)):
        tok, ms = number(r.get("tokens_per_s")), number(r.get("ms_per_step"))
        if tok and ms and int(r.get("accum") or 1) == 1:
            out.setdefault((int(r["batch"]), int(r["seq"])), []).append(
                (tok, ms, number(r.get("peak_mib")), r["variant"]))
    return out


def cell(ms, tok):
    return f"{ms:.2f} ms, {tok / 1e3:.0f} k" if ms and tok else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphward", required=True)
    ap.add_argument("--llmc")
    ap.add_argument("--torch")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()
    gw = load_graphward(a.graphward)
    llmc = load_llmc(a.llmc) if a.llmc and os.path.exists(a.llmc) else {}
    torch = load_torch(a.torch) if a.torch and os.path.exists(a.torch) else {}
    shapes = sorted({(b, t) for b, t, _ in gw} | set(llmc) | set(torch) | set(LLMC_TARGETS))

    print("| batch × seq | graphward eager | backward graph | full step | llm.c | PyTorch's "
          "fastest | full step ÷ llm.c | full step ÷ PyTorch | MFU (full step) | peak MiB: "
          "graphward / PyTorch / llm.c in use |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    verdicts, failed = [], False
    for b, t in shapes:
        g = {m: gw.get((b, t, m)) for m in MODES}
        full = g[2]
        lc = llmc.get((b, t))
        pt = max(torch.get((b, t), []), default=None)
        r_llmc = full["tokens_per_s"] / lc["tokens_per_s"] if full and lc else None
        r_torch = full["tokens_per_s"] / pt[0] if full and pt else None
        mfu = (f"{100 * full['tflops'] / a.peak_tflops:.1f}%"
               if full and full.get("tflops") is not None else "-")
        peaks = " / ".join(f"{v:.0f}" if v is not None else "-" for v in (
            full and full.get("peak_mib"), pt and pt[2], lc and lc.get("device_mib")))
        print(f"| {b} × {t} | " + " | ".join(
            cell(g[m]["ms"], g[m]["tokens_per_s"]) if g[m] else "-" for m in MODES) +
            f" | {cell(lc['ms'], lc['tokens_per_s']) if lc else '-'}"
            f" | {cell(pt[1], pt[0]) + ' (' + pt[3] + ')' if pt else '-'}"
            f" | {f'{r_llmc:.2f}×' if r_llmc else '-'} | {f'{r_torch:.2f}×' if r_torch else '-'}"
            f" | {mfu} | {peaks} |")
        target = LLMC_TARGETS.get((b, t))
        if target is not None:
            if r_llmc is None:
                verdicts.append(f"{b} × {t}: full step against llm.c not measured")
                failed = True
            else:
                ok = r_llmc >= target
                failed |= not ok
                verdicts.append(f"{b} × {t}: full step {r_llmc:.2f}× llm.c's tokens/s (target "
                                f"{target}×): {'met' if ok else 'NOT met'}")
        if r_torch is None:
            verdicts.append(f"{b} × {t}: full step against PyTorch not measured")
            failed = True
        else:
            ok = r_torch >= 1.0
            failed |= not ok
            verdicts.append(f"{b} × {t}: full step {r_torch:.2f}× PyTorch's fastest ({pt[3]}) "
                            f"(target 1.0×): {'met' if ok else 'NOT met'}")
        if (b, t) == (16, 1024):
            if full and full.get("peak_mib") is not None and pt and pt[2] is not None:
                ok = full["peak_mib"] <= pt[2]
                failed |= not ok
                verdicts.append(f"{b} × {t}: peak {full['peak_mib']:.0f} MiB against PyTorch's "
                                f"{pt[2]:.0f} (target ≤): {'met' if ok else 'NOT met'}")
            else:
                verdicts.append(f"{b} × {t}: peak memory against PyTorch's not measured")
                failed = True
    firsts = [f"{b} × {t} {llmc[(b, t)]['first_loss']:.3f}" for b, t in shapes
              if (b, t) in llmc and llmc[(b, t)]["first_loss"] is not None]
    if firsts:
        print(f"\nllm.c's first step's loss: {', '.join(firsts)}")
    print()
    for v in verdicts:
        print(v)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
