#!/usr/bin/env python3
"""PyTorch's stacked LSTM on examples/rnn.h's task, timed: the reference for train_rnn.

The model and task are examples/rnn.h's: `--layers` LSTM layers of `--hidden` (input 16), a
linear head (hidden -> 4) on the top layer's last hidden state, MSE against a target, AdamW
(lr 3e-3, no weight decay), float32 with TF32 off, two fixed batches on the device in turn. Models:

  cudnn     torch.nn.LSTM: cuDNN's fused multi-layer LSTM (the hand-fused kernels to match);
  cell      a loop of torch.nn.LSTMCell, one per layer and time step (the flexible RNN, as
            graphward's is written from ops);
  gru-cudnn torch.nn.GRU, and gru-cell a loop of torch.nn.GRUCell, likewise (train_rnn --gru).

and three ways to run each step: eager, torch.compile (cell only: cuDNN's LSTM is one op), and
the whole step (forward, backward, AdamW with capturable=True) captured in one torch.cuda.graph
after a warm-up on a side stream with .grad = None — PyTorch's strongest for a fixed-shape loop.
Each variant: --warmup steps, then CUDA events over --steps steps; the median of --repeats runs.

  python3 scripts/rnn_torch.py --layers 4 --hidden 64 --time 8 --batch 32 --csv rnn_torch.csv

A CSV row per variant: layers,hidden,time,batch,model,variant,ms_per_step.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F


def build(a, dev, model):
    g = torch.Generator(device="cpu").manual_seed(3)
    gru = model.startswith("gru")
    if model in ("cudnn", "gru-cudnn"):
        rnn = (torch.nn.GRU if gru else torch.nn.LSTM)(a.input, a.hidden, a.layers).to(dev)
        cells = None
    else:
        rnn = None
        cell = torch.nn.GRUCell if gru else torch.nn.LSTMCell
        cells = torch.nn.ModuleList(
            cell(a.input if l == 0 else a.hidden, a.hidden) for l in range(a.layers)).to(dev)
    head = torch.nn.Linear(a.hidden, a.out).to(dev)
    mapping = torch.randn(a.out, a.input, generator=g).to(dev)
    params = list((rnn or cells).parameters()) + list(head.parameters())

    def loss_of(xs, target):  # xs [T, B, input]
        if rnn is not None:
            out, _ = rnn(xs)
            last = out[-1]
        else:
            hs = [xs.new_zeros(a.batch, a.hidden) for _ in range(a.layers)]
            cs = [xs.new_zeros(a.batch, a.hidden) for _ in range(a.layers)]
            for t in range(a.time):
                inp = xs[t]
                for l in range(a.layers):
                    if gru:
                        hs[l] = cells[l](inp, hs[l])
                    else:
                        hs[l], cs[l] = cells[l](inp, (hs[l], cs[l]))
                    inp = hs[l]
            last = hs[-1]
        return F.mse_loss(head(last), target)

    # Two fixed batches on the device, alternating (train_rnn's data): no host work in the loop.
    batches = []
    for b in range(2):
        gb = torch.Generator(device="cpu").manual_seed(1000 + b)
        xs = torch.randn(a.time, a.batch, a.input, generator=gb).to(dev)
        batches.append((xs, xs.mean(0) @ mapping.t()))

    def batch(step):
        return batches[step % 2]

    return params, loss_of, batch


def time_variant(a, dev, model, variant):
    params, loss_of, batch = build(a, dev, model)
    graphed = variant.endswith("graph")
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0, capturable=graphed,
                            foreach=True)
    fn = torch.compile(loss_of) if variant.startswith("compile") else loss_of

    def step_on(xs, target):
        loss = fn(xs, target)
        loss.backward()
        opt.step()
        return loss.detach()

    def train_step(i):
        xs, target = batch(i)
        loss = step_on(xs, target)
        opt.zero_grad(set_to_none=True)
        return loss

    if graphed:
        static_x, static_t = batch(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step_on(static_x, static_t)
                opt.zero_grad(set_to_none=True)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            static_loss = step_on(static_x, static_t)

        def train_step(i):  # noqa: F811 (the captured step replaces the eager one)
            xs, target = batch(i)
            static_x.copy_(xs)
            static_t.copy_(target)
            captured.replay()
            return static_loss

    for i in range(a.warmup):
        train_step(i)
    times = []
    for _ in range(a.repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(a.steps):
            loss = train_step(i)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / a.steps)
    return statistics.median(times), float(loss)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4, help="LSTM layers (default 4)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--time", type=int, default=8, help="time steps (default 8)")
    p.add_argument("--batch", type=int, default=32, help="batch (default 32)")
    p.add_argument("--input", type=int, default=16, help="input width (default 16)")
    p.add_argument("--out", type=int, default=4, help="head width (default 4)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per repeat (default 50)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs; the median (default 5)")
    p.add_argument("--variants", default="cudnn:graph,cudnn:eager,cell:graph,cell:compile-graph,"
                   "cell:eager", help="model:variant,... (models cudnn, cell, gru-cudnn, "
                   "gru-cell; variants eager, graph, compile, compile-graph)")
    p.add_argument("--csv", help="append a row per variant to this file")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rnn_torch.py: no CUDA device; the comparison times the GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    rows = []
    for spec in a.variants.split(","):
        model, variant = spec.split(":")
        try:
            ms, loss = time_variant(a, dev, model, variant)
        except Exception as e:  # a variant PyTorch cannot run says so and the others go on
            print(f"{model} {variant}: failed: {type(e).__name__}: {e}".splitlines()[0])
            continue
        print(f"{model:9s} {variant:13s} {ms:8.3f} ms/step (loss {loss:.4f})", flush=True)
        rows.append((model, variant, ms))
    if a.csv:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a") as f:
            if new:
                f.write("layers,hidden,time,batch,model,variant,ms_per_step\n")
            for model, variant, ms in rows:
                f.write(f"{a.layers},{a.hidden},{a.time},{a.batch},{model},{variant},{ms:.4f}\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
