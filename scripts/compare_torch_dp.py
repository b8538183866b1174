#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on examples/train_dp.cpp's model and step, for the same table.

The MLP of train_dp (layers of Linear(W, W) + GELU(tanh), then Linear(W, 16); with --branches K,
its K-branch study: K branches of Linear + ReLU layers, each forward on a stream of its own, summed,
then Linear(W, 16)), MSE against a fixed random "teacher" layer (tanh), SGD lr 0.05, fp32 with TF32
off; each rank trains on its own batch of B rows (the global batch is B x world). Four batches are made before the loop and copied into static
input slots each step, as train_dp --bench does; each step is timed with CUDA events on the current
stream and the median after the first fifth of the steps is reported (rank 0 prints it).

    python3 scripts/compare_torch_dp.py [--world N] [--steps 40] [--width 1024] [--layers 4]
                                        [--batch 256] [--branches 1] [--bucket-mib 25]
                                        [--csv out.csv]
    python3 scripts/compare_torch_dp.py --allreduce-latency [--world N]

--allreduce-latency: what one NCCL all-reduce of fp32 costs on this machine inside a CUDA graph
(torch.distributed.all_reduce, 10 captured back to back, the median of 20 replays a size), for
0.25 to 32 MiB: the floor under a bucket's reduction.

Modes: eager (DDP's own bucketed all-reduce overlapping the backward) and graph (the whole step —
forward, backward with DDP's all-reduces, SGD — captured once in a torch.cuda.graph after 11 warm-up
steps on a side stream, DDP made in that stream's context, as PyTorch's CUDA-graph notes ask for
DDP, and replayed). One process per GPU (torch.multiprocessing, NCCL through a file rendezvous);
NCCL_NVLS_ENABLE stays 0 unless set.

Needs PyTorch with CUDA and N GPUs; graphward's own tests never need it.
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile


def branch_model(torch, k, layers, w, out):
    """train_dp --branches K: K branches of `layers` Linear + ReLU, each branch's forward on a
    stream of its own, the branch outputs summed, then the output layer."""

    class Branches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.branches = torch.nn.ModuleList(
                [torch.nn.Sequential(*[m for _ in range(layers)
                                       for m in (torch.nn.Linear(w, w), torch.nn.ReLU())])
                 for _ in range(k)])
            self.head = torch.nn.Linear(w, out)
            self.streams = [torch.cuda.Stream() for _ in range(k)]

        def forward(self, x):
            main = torch.cuda.current_stream()
            outs = []
            for branch, stream in zip(self.branches, self.streams):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    outs.append(branch(x))
            for stream in self.streams:
                main.wait_stream(stream)
            total = outs[0]
            for o in outs[1:]:
                total = total + o
            return self.head(total)

    return Branches()


def row_line(r):
    branches = f"branches:{r['branches']}/" if r["branches"] > 1 else ""
    return (f"torch_ddp/mode:{r['mode']}/world:{r['world']}/{branches}width:{r['width']}/"
            f"layers:{r['layers']}/batch:{r['batch']} {r['median_ms']:.4f} ms/step (median)")


def worker(rank, args, init_file, results):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    stacks_after = float(os.environ.get("GW_DP_TORCH_STACKS_AFTER", "0") or 0)
    if stacks_after > 0:  # where a rank is stuck, before a timeout kills it
        import faulthandler
        faulthandler.dump_traceback_later(stacks_after, exit=False)

    def progress(what):  # every rank's stage, so that a run cut short says where it was
        print(f"compare_torch_dp.py: rank {rank}: {what}", file=sys.stderr, flush=True)

    # PyTorch's notes for DDP under full-graph capture: no async error handling.
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import torch
    import torch.distributed as dist

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank,
                            world_size=args.world)
    progress("process group made")
    dev = torch.device("cuda", rank)
    w, out = args.width, 16
    rows = []
    for mode in ("eager", "graph"):
        gen = torch.Generator(device="cpu").manual_seed(1)
        if args.branches == 1:
            layers = []
            for _ in range(args.layers):
                layers += [torch.nn.Linear(w, w), torch.nn.GELU(approximate="tanh")]
            layers.append(torch.nn.Linear(w, out))
            model = torch.nn.Sequential(*layers).to(dev)
        else:
            model = branch_model(torch, args.branches, args.layers, w, out).to(dev)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / w ** 0.5)
        # PyTorch's notes for DDP under full-graph capture: DDP made in a side stream's context
        # (it keeps the gradient accumulators it makes; on the legacy default stream they would
        # make the capture fail with cudaErrorStreamCaptureImplicit), warm-up on that stream.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side if mode == "graph" else torch.cuda.current_stream()):
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[rank], bucket_cap_mb=args.bucket_mib)
        torch.cuda.current_stream().wait_stream(side)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        teacher = (torch.randn(out, w, generator=gen) * (2.0 / w ** 0.5)).to(dev)
        batches = []
        for k in range(4):
            g = torch.Generator(device="cpu").manual_seed(1000 * k + rank)
            xb = torch.randn(args.batch, w, generator=g).to(dev)
            batches.append((xb, torch.tanh(xb @ teacher.t())))
        x = torch.zeros(args.batch, w, device=dev)
        t = torch.zeros(args.batch, out, device=dev)

        def step():
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.mse_loss(ddp(x), t)
            loss.backward()
            opt.step()
            return loss

        progress(f"{mode}: DDP made")
        replay = None
        if mode == "graph":
            x.copy_(batches[0][0])
            t.copy_(batches[0][1])
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(11):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # Captured on the stream DDP was made and warmed up on: the gradient accumulators
            # DDP keeps are on that stream (another would tie the capture to one outside it).
            with torch.cuda.graph(graph, stream=side):
                step()
            replay = graph.replay
            progress(f"{mode}: captured")
        begins = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
        for s in range(args.steps):
            begins[s].record()
            xb, tb = batches[s % 4]
            x.copy_(xb)
            t.copy_(tb)
            if replay:
                replay()
            else:
                step()
            ends[s].record()
        torch.cuda.synchronize()
        progress(f"{mode}: {args.steps} steps timed")
        first = max(1, args.steps // 5)
        ms = statistics.median(begins[s].elapsed_time(ends[s]) for s in range(first, args.steps))
        rows.append({"library": "torch_ddp", "mode": mode, "world": args.world,
                     "branches": args.branches, "width": w, "layers": args.layers,
                     "batch": args.batch, "bucket_mib": args.bucket_mib,
                     "median_ms": round(ms, 4)})
        if rank == 0:  # at once: a later mode that fails or hangs leaves this one's figure
            print(row_line(rows[-1]), flush=True)
            results.append(rows[-1])
        if mode != "graph":
            dist.barrier()
    # Seen on 2 x H200 (PyTorch 2.11): after the captured mode, both ranks had timed their steps
    # and the process group's barrier or destroy then never returned. Every figure is out: a
    # spawned rank ends here, as mp.spawn expects of a rank that finished (exit status 0).
    torch.cuda.synchronize()
    progress("done")
    import multiprocessing
    if multiprocessing.parent_process() is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


def latency_worker(rank, args, init_file, results):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank,
                            world_size=args.world)
    side = torch.cuda.Stream()
    for mib in (0.25, 1, 2, 4, 8, 16, 32):
        x = torch.ones(int(mib * (1 << 20)) // 4, device="cuda")
        with torch.cuda.stream(side):
            for _ in range(5):  # warm-up (connections, buffers) outside the capture
                dist.all_reduce(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            for _ in range(10):
                dist.all_reduce(x)
        us = []
        for _ in range(20):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            us.append(a.elapsed_time(b) * 1000 / 10)
        if rank == 0:
            print(f"torch_nccl_allreduce/world:{args.world}/mib:{mib:g}/graph:1 "
                  f"{statistics.median(us):.1f} us/op (median)", flush=True)
    torch.cuda.synchronize()
    import multiprocessing
    if multiprocessing.parent_process() is not None:  # as worker(): end here once printed
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--branches", type=int, default=1,
                    help="K > 1: train_dp's K-branch study (ReLU, a stream per branch)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--bucket-mib", type=float, default=25.0)
    ap.add_argument("--csv")
    ap.add_argument("--allreduce-latency", action="store_true",
                    help="time one all-reduce in a CUDA graph for 0.25 to 32 MiB, then stop")
    args = ap.parse_args()
    if args.world < 1 or args.steps < 2 or args.branches < 1:
        sys.exit("compare_torch_dp.py: expected --world >= 1, --steps >= 2 and --branches >= 1")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"compare_torch_dp.py: PyTorch is not importable here ({e}); nothing measured "
              "(pip install torch, with CUDA, on the GPU machine)", file=sys.stderr)
        return 2

    if torch.cuda.device_count() < args.world:
        print(f"compare_torch_dp.py: skipped: --world {args.world} needs {args.world} GPUs; "
              f"this machine has {torch.cuda.device_count()}")
        return 77
    if args.allreduce_latency:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(latency_worker, args=(args, os.path.join(tmp, "init"), None),
                     nprocs=args.world)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.list()
        mp.spawn(worker, args=(args, os.path.join(tmp, "init"), results), nprocs=args.world)
        rows = list(results)
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            wr.writeheader()
            wr.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
