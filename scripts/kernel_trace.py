#!/usr/bin/env python3
"""Summarises a kernel trace (scripts/kernel_trace.cpp's CSV): for every CUDA graph replayed at
least five times, how long a replay takes from its first node's start to its last node's end
(median, min, max, after the first fifth of the replays), how often replays start, where a
replay's time goes (its kernels, their summed time, the time some node runs and the time none
does), its critical path (the longest chain of its nodes' median durations along the graph's
edges: the least time a replay of that graph could take with those durations), each stream's busy time and the
kernels that take the most; with --nodes, every node of a replay at its median start (µs from
the replay's start) and median duration, in start order.

Rows: kind,start_ns,end_ns,device,stream,graph,node,grid_or_bytes,block,name (kind K: kernel,
C: copy, S: memset; graph 0: not in a graph; a start of 0: a record CUPTI never completed).
Every node of a graph runs once a replay, and a graph's replays on a stream run one after another:
in order of start, a node met again begins the next replay (one missing a record is left out).
The edges come from TRACE.edges beside TRACE.csv (or --edges): rows E,from,to (an edge between
node ids) and M,copy,original (a node copied from another when its graph was instantiated or
cloned: the records may name the copy, the edges the original). Nodes with no record (events,
empty nodes) take no time on the path.

  scripts/kernel_trace.py TRACE.csv [--nodes] [--graph ID] [--edges EDGES]
"""
import argparse
import collections
import os
import statistics
import sys


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split(",", 9)
            if len(p) < 10 or not p[1].isdigit() or int(p[1]) == 0:
                continue
            rows.append({"kind": p[0], "start": int(p[1]), "end": int(p[2]), "stream": int(p[4]),
                         "graph": int(p[5]), "node": int(p[6]), "grid": int(p[7]), "name": p[9]})
    return rows


def read_edges(path):
    """(copies: {copy id: original id}, edges: set of (from, to)) of an .edges file; empty if none."""
    copies, edges = {}, set()
    if not path or not os.path.exists(path):
        return copies, edges
    with open(path) as f:
        for line in f:
            p = line.strip().split(",")
            if len(p) != 3 or not p[1].isdigit() or not p[2].isdigit():
                continue
            a, b = int(p[1]), int(p[2])
            if p[0] == "M" and a and b:
                copies[a] = b
            elif p[0] == "E" and a and b:
                edges.add((a, b))
    return copies, edges


def original(node, copies):
    for _ in range(len(copies) + 1):  # a copy of a copy; never a cycle
        if node not in copies:
            break
        node = copies[node]
    return node


def critical_path(work, copies, edges):
    """The longest path through the graph of `work` ({node id: (µs, name)}, ids as the records
    name them) along `edges`: (µs, [(name, µs), ...] in path order), or None when no edge touches
    these nodes."""
    weight = {}
    names = {}
    for n, (us, name) in work.items():
        o = original(n, copies)
        weight[o] = us
        names[o] = name
    # Node ids are unique across graphs: the edges are a union of separate graphs, and a path
    # ending at one of these nodes runs through theirs alone (events and empty nodes weigh 0).
    succ = collections.defaultdict(list)
    indegree = collections.Counter()
    nodes = set(weight)
    for a, b in edges:
        succ[a].append(b)
        indegree[b] += 1
        nodes.update((a, b))
    if not any(n in succ or indegree[n] for n in weight):
        return None
    best = {n: weight.get(n, 0.0) for n in nodes}
    previous = {}
    ready = [n for n in nodes if indegree[n] == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ[n]:
            if best[n] + weight.get(m, 0.0) > best[m]:
                best[m] = best[n] + weight.get(m, 0.0)
                previous[m] = n
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    if seen != len(nodes):
        return None  # a cycle: not a graph's edges
    end = max(weight, key=lambda n: best[n])
    path = []
    n = end
    while n is not None:
        if n in weight:
            path.append((names[n], weight[n]))
        n = previous.get(n)
    return best[end], path[::-1]


def union_us(items):
    """The time, in µs, that at least one of `items` (each with start and end, ns) was running."""
    total, end = 0, None
    for i in sorted(items, key=lambda r: r["start"]):
        if end is None or i["start"] > end:
            total += i["end"] - i["start"]
            end = i["end"]
        elif i["end"] > end:
            total += i["end"] - end
            end = i["end"]
    return total / 1e3


def summarise(rows, show_nodes, only_graph, out, copies=None, edges=None):
    graphs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        if r["graph"]:
            graphs[r["graph"]][r["node"]].append(r)
    shown = 0
    for g in sorted(graphs):
        if only_graph is not None and g != only_graph:
            continue
        nodes = graphs[g]
        # A graph's launches on a stream run one after another, so its records, in order of start,
        # fall into replays: a node met again begins the next. A replay missing a node's record
        # (CUPTI dropped it) is left out, and the others stay whole (pairing each node's k-th
        # record instead shifted every later replay onto the next one).
        parts, current = [], {}
        for r in sorted((r for v in nodes.values() for r in v), key=lambda r: r["start"]):
            if r["node"] in current:
                parts.append(current)
                current = {}
            current[r["node"]] = r
        if current:
            parts.append(current)
        whole = [(k, list(p.values())) for k, p in enumerate(parts) if len(p) == len(nodes)]
        replays = len(whole)
        if replays < 5:
            continue
        reps = [(min(i["start"] for i in items), max(i["end"] for i in items), items, k)
                for k, items in whole]
        skipped = replays // 5
        reps = reps[skipped:]
        spans = [(t1 - t0) / 1e3 for t0, t1, _, _ in reps]
        periods = [(b[0] - a[0]) / 1e3 for a, b in zip(reps, reps[1:]) if b[3] == a[3] + 1]
        incomplete = len(parts) - len(whole)
        out.write(f"graph {g}: {len(nodes)} nodes, {replays} replays ({len(reps)} after the first "
                  f"fifth{f'; {incomplete} left out, a record missing' if incomplete else ''})"
                  f"; a replay {statistics.median(spans):.1f} us (min {min(spans):.1f}, max "
                  f"{max(spans):.1f}); one starts every "
                  f"{statistics.median(periods) if periods else 0:.1f} us\n")
        # Where a replay's time goes: its kernels and their summed time, the time some node ran
        # (the union of the nodes' intervals) and the time none did (idle inside the replay).
        kinds = collections.Counter(i["kind"] for i in reps[0][2])
        kernel_sum = statistics.median(
            sum(i["end"] - i["start"] for i in items if i["kind"] == "K") / 1e3
            for _, _, items, _ in reps)
        busy_union = statistics.median(union_us(items) for _, _, items, _ in reps)
        idle = statistics.median((t1 - t0) / 1e3 - union_us(items) for t0, t1, items, _ in reps)
        span = statistics.median(spans)
        out.write(f"  a replay: {kinds['K']} kernels ({kinds['C']} copies, {kinds['S']} memsets), "
                  f"kernel time summed {kernel_sum:.1f} us, some node running {busy_union:.1f} us, "
                  f"none running {idle:.1f} us ({100 * idle / span if span else 0:.0f}% of the "
                  f"replay)\n")
        offsets = collections.defaultdict(list)
        durations = collections.defaultdict(list)
        first = {}
        for t0, _, items, _ in reps:
            for i in items:
                key = i["node"]
                offsets[key].append((i["start"] - t0) / 1e3)
                durations[key].append((i["end"] - i["start"]) / 1e3)
                first[key] = i
        lines = sorted((statistics.median(offsets[n]), statistics.median(durations[n]), first[n])
                       for n in offsets)
        busy = collections.Counter()
        by_name = collections.defaultdict(lambda: [0, 0.0])
        for _, dur, r in lines:
            busy[r["stream"]] += dur
            by_name[r["name"]][0] += 1
            by_name[r["name"]][1] += dur
        out.write("  busy a replay, by stream: " +
                  ", ".join(f"stream {s} {busy[s]:.1f} us" for s in sorted(busy)) + "\n")
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:8]
        out.write("  most time: " + "; ".join(f"{name[:60]} x{c} {t:.1f} us" for name, (c, t) in top)
                  + "\n")
        path = critical_path({n: (statistics.median(durations[n]), first[n]["name"]) for n in offsets},
                             copies or {}, edges or set())
        if path is None:
            out.write("  critical path: no edges of this graph recorded\n")
        else:
            us, chain = path
            out.write(f"  critical path: {us:.1f} us along the graph's edges, "
                      f"{100 * us / span if span else 0:.0f}% of the replay; {len(chain)} nodes: "
                      + ", ".join(f"{name[:40]} {d:.1f}" for name, d in chain[:12])
                      + (", ..." if len(chain) > 12 else "") + "\n")
        if show_nodes:
            for off, dur, r in lines:
                size = f"grid {r['grid']}" if r["kind"] == "K" else f"{r['grid']} bytes"
                out.write(f"    {off:9.1f} {dur:8.1f}  stream {r['stream']:<4} {size:<14} {r['name']}\n")
        shown += 1
    if shown == 0:
        out.write("no graph replayed five times or more in this trace\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--nodes", action="store_true", help="every node of a replay, in start order")
    ap.add_argument("--graph", type=int, default=None, help="only this graph id")
    ap.add_argument("--edges", default=None,
                    help="the graphs' edges (default: TRACE.edges beside TRACE.csv)")
    a = ap.parse_args()
    edges_path = a.edges
    if edges_path is None and a.trace.endswith(".csv"):
        edges_path = a.trace[:-len(".csv")] + ".edges"
    copies, edges = read_edges(edges_path)
    summarise(read(a.trace), a.nodes, a.graph, sys.stdout, copies, edges)


if __name__ == "__main__":
    main()
