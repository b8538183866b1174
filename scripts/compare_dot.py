#!/usr/bin/env python3
"""Compares CUDA graphs dumped as Graphviz DOT (cudaGraphDebugDotPrint; BackwardGraph::write_dot;
GW_DOT_DIR=dir graphward_bench_capture writes graphward_*.dot and hand_*.dot): nodes by type, edges,
roots, sinks, fork and join nodes, the longest path, and the kernels each graph runs (by name,
with counts), then whether the two run the same kernels.

    python3 scripts/compare_dot.py A.dot [B.dot]
"""
import collections
import re
import sys

NODE = re.compile(r'"([^"]+)"\[style="[^"]*" shape="([a-z]+)" label="\d+\n([^\n"]*)')
EDGE = re.compile(r'"([^"]+)" -> "([^"]+)"')


def load(path):
    text = open(path).read()
    nodes = {m.group(1): (m.group(2), m.group(3).strip()) for m in NODE.finditer(text)}
    edges = [(a, b) for a, b in EDGE.findall(text) if a in nodes and b in nodes]
    return nodes, edges


def summary(path):
    nodes, edges = load(path)
    out_deg = collections.Counter(a for a, _ in edges)
    in_deg = collections.Counter(b for _, b in edges)
    succ = collections.defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    depth = {}
    for n in reversed(topological(nodes, edges)):
        depth[n] = 1 + max((depth[m] for m in succ[n]), default=0)
    kernels = collections.Counter(label for shape, label in nodes.values() if shape == "octagon")
    types = collections.Counter(label if shape != "octagon" else "KERNEL"
                                for shape, label in nodes.values())
    return {
        "nodes": len(nodes),
        "types": dict(types),
        "edges": len(edges),
        "roots": sum(1 for n in nodes if in_deg[n] == 0),
        "sinks": sum(1 for n in nodes if out_deg[n] == 0),
        "forks": sum(1 for n in nodes if out_deg[n] > 1),
        "joins": sum(1 for n in nodes if in_deg[n] > 1),
        "longest_path": max(depth.values(), default=0),
        "kernels": kernels,
    }


def topological(nodes, edges):
    in_deg = collections.Counter(b for _, b in edges)
    succ = collections.defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    ready = [n for n in nodes if in_deg[n] == 0]
    order = []
    while ready:
        n = ready.pop()
        order.append(n)
        for m in succ[n]:
            in_deg[m] -= 1
            if in_deg[m] == 0:
                ready.append(m)
    if len(order) != len(nodes):
        raise SystemExit("compare_dot: the graph has a cycle; expected a DAG")
    return order


def main(argv):
    if not 2 <= len(argv) <= 3:
        print(__doc__, file=sys.stderr)
        return 2
    sums = [summary(p) for p in argv[1:]]
    keys = ["nodes", "edges", "roots", "sinks", "forks", "joins", "longest_path"]
    print(f"{'':14s}" + "".join(f"{p[-40:]:>42s}" for p in argv[1:]))
    for k in keys:
        print(f"{k:14s}" + "".join(f"{s[k]:>42}" for s in sums))
    print(f"{'node types':14s}" + "".join(f"{str(s['types']):>42s}" for s in sums))
    names = sorted(set().union(*(s["kernels"] for s in sums)))
    print("kernels:")
    for name in names:
        print("  " + "".join(f"{s['kernels'][name]:6d}" for s in sums) + "  " + name[:90])
    if len(sums) == 2:
        same = sums[0]["kernels"] == sums[1]["kernels"]
        print("the same kernels" if same else "different kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
