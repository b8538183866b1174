"""compare_torch.py --resume against the stand-in PyTorch: a run cut short goes on where it stopped.
Runs two variants into a CSV, then three with --resume: the two measured already are kept, not run
again, and the CSV ends with each row once.
    python3 compare_torch_resume.py SCRIPT CSV"""
import csv
import os
import runpy
import sys

script, path = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    os.remove(path)


def run(*extra):
    sys.argv = ["compare_torch.py", "--strongest", "--iters", "2", "--only", "mlp/hidden:256",
                "--csv", path, "--cache-dir", "", *extra]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code:
            sys.exit(f"compare_torch.py exited with {e.code}")


run("--modes", "eager_fused,graph_fused")
run("--modes", "eager_fused,graph_fused,compile_step_graph", "--resume")
with open(path, newline="") as f:
    rows = list(csv.reader(f))
assert rows[0][0] == "config", rows[0]
modes = sorted(r[0].split("mode:")[1] for r in rows[1:])
print("rows", len(rows) - 1, modes)
