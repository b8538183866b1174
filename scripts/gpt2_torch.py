#!/usr/bin/env python3
"""PyTorch's GPT-2 as examples/gpt2.h builds it, for two jobs:

1. The reference: started from the parameters `train_gpt2 --save-init CKPT` wrote (the
   checkpoint format of examples/checkpoint.h), trained on the same shard with the same recipe
   (AdamW 0.9/0.95 with decay on the matrices, the warm-up and cosine schedule, clipping at 1.0,
   micro-batches), its losses step by step; with `--against gw.csv` (train_gpt2 --losses) it
   prints both and fails when a step's losses differ by more than --tolerance (relative).
2. Timing (--time): ms a step, tokens/s and peak memory of PyTorch's step — eager, with
   torch.compile (--compile), the whole step in one torch.cuda.graph (--graph, the strongest with
   --compile) — CUDA events over --steps after --warmup-steps steps.

Run where PyTorch and a GPU are (the CPU works for small sizes):
  make_token_shard s.bin --tokens 2000000 && \\
  train_gpt2 --data s.bin --steps 20 --mode step --save-init init.ckpt --losses gw.csv && \\
  python3 scripts/gpt2_torch.py --init init.ckpt --data s.bin --steps 20 --against gw.csv
Sizes, data and recipe flags mirror train_gpt2's (and must be the same values).
"""
import argparse
import csv
import math
import struct
import sys
import time

import os

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphward_checkpoint  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
          "bfloat16": torch.bfloat16}


def read_checkpoint(path):
    """examples/checkpoint.h's layout (scripts/graphward_checkpoint.py): tensors by name, integers."""
    raw, ints = graphward_checkpoint.read(path)
    tensors = {name: torch.frombuffer(bytearray(b), dtype=DTYPES[d]).reshape(shape).clone()
               for name, (d, shape, b) in raw.items()}
    return tensors, ints


class Shards:
    """examples/token_shards.h's windows for one rank: batch · seq + 1 tokens a window."""

    def __init__(self, paths, batch, seq):
        self.paths, self.batch, self.seq = paths, batch, seq
        self.shard, self.offset = 0, 0
        self.tokens = self.load(0)

    def load(self, i):
        raw = open(self.paths[i], "rb").read()
        magic, version, count = struct.unpack_from("<iii", raw, 0)
        if magic != 20240520 or version != 1 or len(raw) != 1024 + 2 * count:
            sys.exit(f"{self.paths[i]}: not an llm.c token shard")
        return torch.frombuffer(bytearray(raw[1024:]), dtype=torch.int16).to(torch.int32) & 0xFFFF

    def next(self):
        n = self.batch * self.seq
        if self.offset + n + 1 > len(self.tokens):
            nxt = (self.shard + 1) % len(self.paths)
            if nxt != self.shard:
                self.tokens = self.load(nxt)
            self.shard, self.offset = nxt, 0
        w = self.tokens[self.offset:self.offset + n + 1].long()
        self.offset += n
        return w[:-1].view(self.batch, self.seq), w[1:]


class Gpt2(torch.nn.Module):
    """examples/gpt2.h's model; parameters in its params() order (param.0, param.1, ...)."""

    def __init__(self, depth, width, heads, vocab, padded_vocab, max_seq):
        super().__init__()
        self.depth, self.width, self.heads, self.vocab = depth, width, heads, vocab
        C = width
        P = torch.nn.Parameter
        self.wte = P(torch.zeros(padded_vocab, C))
        self.wpe = P(torch.zeros(max_seq, C))
        self.blocks = torch.nn.ParameterList()
        for _ in range(depth):
            for shape in ([C], [C], [3 * C, C], [3 * C], [C, C], [C], [C], [C], [4 * C, C],
                          [4 * C], [C, 4 * C], [C]):
                self.blocks.append(P(torch.zeros(shape)))
        self.lnf_w, self.lnf_b = P(torch.ones(C)), P(torch.zeros(C))

    def ordered(self):
        return [self.wte, self.wpe, *self.blocks, self.lnf_w, self.lnf_b]

    def forward(self, idx, targets):
        B, T = idx.shape
        C, H = self.width, self.heads
        x = self.wte[idx] + self.wpe[:T]
        for l in range(self.depth):
            (ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w,
             fcp_b) = self.blocks[12 * l:12 * l + 12]
            h = F.layer_norm(x, (C,), ln1_w, ln1_b, 1e-5)
            q, k, v = F.linear(h, qkv_w, qkv_b).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, C), proj_w, proj_b)
            h = F.layer_norm(x, (C,), ln2_w, ln2_b, 1e-5)
            x = x + F.linear(F.gelu(F.linear(h, fc_w, fc_b), approximate="tanh"), fcp_w, fcp_b)
        x = F.layer_norm(x, (C,), self.lnf_w, self.lnf_b, 1e-5)
        logits = F.linear(x, self.wte)[..., :self.vocab]  # the real vocabulary's columns
        return F.cross_entropy(logits.reshape(B * T, -1).float(), targets)


def scheduled_lr(peak, t, warmup, total, final):
    """kernels/optim.h's scheduled_lr."""
    if total <= 0:
        return peak
    if t < warmup:
        return peak * (t + 1) / warmup
    r = min(1.0, (t - warmup) / (total - warmup))
    low = peak * final
    return low + 0.5 * (1.0 + math.cos(math.pi * r)) * (peak - low)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--init", help="train_gpt2 --save-init's checkpoint (else llm.c's init)")
    p.add_argument("--data", required=True, help="token shards, comma-separated")
    p.add_argument("--steps", type=int, default=20)
    for name, default in (("batch", 4), ("seq", 64), ("accum", 1), ("depth", 12),
                          ("width", 768), ("heads", 12), ("vocab", 50257),
                          ("padded-vocab", 50304), ("max-seq", 1024), ("warmup", 0)):
        p.add_argument("--" + name, type=int, default=default)
    for name, default in (("lr", 6e-4), ("final-lr-fraction", 0.0), ("clip", 1.0),
                          ("weight-decay", 0.1), ("tolerance", 2e-2)):
        p.add_argument("--" + name, type=float, default=default)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--against", help="train_gpt2 --losses CSV to compare step by step")
    p.add_argument("--losses", help="write this run's losses as CSV")
    p.add_argument("--time", action="store_true", help="time the steps (CUDA events)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--graph", action="store_true",
                   help="with --time: the whole step (micro-batches, clipping, AdamW with a "
                        "capturable rate) captured once in a torch.cuda.graph and replayed; with "
                        "--compile the forward and loss one torch.compile(fullgraph=True) inside")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps with --time")
    p.add_argument("--time-csv", help="with --time: append the row (batch, seq, accum, variant, "
                                      "precision, ms/step, tokens/s, peak MiB) to this CSV")
    a = p.parse_args()

    dev = torch.device(a.device)
    tf32 = a.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    model = Gpt2(a.depth, a.width, a.heads, a.vocab, a.padded_vocab, a.max_seq)
    params = model.ordered()
    with torch.no_grad():
        if a.init:
            tensors, _ = read_checkpoint(a.init)
            for i, prm in enumerate(params):
                src = tensors[f"param.{i}"]
                if tuple(src.shape) != tuple(prm.shape):
                    sys.exit(f"param.{i}: {tuple(src.shape)} in {a.init}; expected {tuple(prm.shape)}")
                prm.copy_(src.float())
        else:  # llm.c's initialization
            std_res = 0.02 / math.sqrt(2 * a.depth)
            for i, prm in enumerate(params):
                j = (i - 2) % 12 if 2 <= i < 2 + 12 * a.depth else -1
                if prm.dim() >= 2:
                    prm.normal_(0.0, std_res if j in (4, 10) else 0.02)
                elif j in (0, 6) or i == len(params) - 2:  # the layer norms' weights
                    prm.fill_(1.0)
            params[0][a.vocab:].zero_()
    model.to(dev)
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    fused = dev.type == "cuda"
    graph = a.graph and a.time
    if graph and dev.type != "cuda":
        sys.exit("--graph needs CUDA")
    # A captured step reads its rate from a tensor (capturable AdamW), set before each replay.
    lr = torch.tensor(a.lr, device=dev) if graph else a.lr
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused, capturable=graph)
    data = Shards(a.data.split(","), a.batch, a.seq)

    def forward_loss(x, y):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            return model(x, y)
    if a.compile:
        forward_loss = torch.compile(forward_loss, fullgraph=True)

    def set_lr(t):
        value = scheduled_lr(a.lr, t, a.warmup, a.steps, a.final_lr_fraction)
        for g in opt.param_groups:
            if graph:
                g["lr"].fill_(value)
            else:
                g["lr"] = value

    def accumulate_and_step(xs, ys):
        total = 0.0
        for x, y in zip(xs, ys):
            loss = forward_loss(x, y) / a.accum
            loss.backward()
            total = total + loss.detach()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        return total

    def batch():
        pairs = [data.next() for _ in range(a.accum)]
        return ([x.to(dev, non_blocking=True) for x, _ in pairs],
                [y.to(dev, non_blocking=True) for _, y in pairs])

    def train_step(t):
        set_lr(t)
        xs, ys = batch()
        total = accumulate_and_step(xs, ys)
        opt.zero_grad(set_to_none=True)
        return total

    if graph:  # PyTorch's whole-step capture: warm up on a side stream, .grad = None, capture
        static_x, static_y = batch()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for t in range(3):
                set_lr(t)
                accumulate_and_step(static_x, static_y)
                opt.zero_grad(set_to_none=True)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            static_loss = accumulate_and_step(static_x, static_y)

        def train_step(t):  # noqa: F811 (the captured step replaces the eager one)
            set_lr(t)
            xs, ys = batch()
            for dst, src in zip(static_x + static_y, xs + ys):
                dst.copy_(src)
            captured.replay()
            return static_loss

    losses = []
    if a.time:
        for t in range(a.warmup_steps):
            train_step(t)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for t in range(a.warmup_steps, a.warmup_steps + a.steps):
            train_step(t)
        if dev.type == "cuda":
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / a.steps
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            ms, peak = 1e3 * (time.perf_counter() - t0) / a.steps, 0.0
        tokens = a.batch * a.seq * a.accum
        variant = ("compile" if a.compile else "eager") + (" in a CUDA graph" if graph else "")
        print(f"pytorch {variant} {a.precision}: {ms:.3f} ms/step, "
              f"{1e3 * tokens / ms:.0f} tokens/s, peak {peak:.0f} MiB")
        if a.time_csv:
            new_file = not os.path.exists(a.time_csv) or os.path.getsize(a.time_csv) == 0
            with open(a.time_csv, "a") as f:
                if new_file:
                    f.write("batch,seq,accum,variant,precision,ms_per_step,tokens_per_s,peak_mib\n")
                f.write(f"{a.batch},{a.seq},{a.accum},{variant},{a.precision},{ms:.4f},"
                        f"{1e3 * tokens / ms:.1f},{peak:.1f}\n")
        return 0
    for t in range(a.steps):
        losses.append(float(train_step(t)))
    if a.losses:
        with open(a.losses, "w") as f:
            f.write("step,loss\n")
            for t, l in enumerate(losses):
                f.write(f"{t},{l:.9g}\n")
    # llm.c's initialization: logits of variance width · 0.02² over the layer norm's output, whose
    # mean loss is ln(vocab) + width · 0.02² / 2 (10.978 at GPT-2 small, not ln(50257) = 10.825).
    expected = math.log(a.vocab) + a.width * 0.02**2 / 2
    print(f"first loss {losses[0]:.4f} (ln(vocab) + width · 0.02² / 2 = {expected:.4f}), "
          f"last {losses[-1]:.4f}")
    if a.against:
        gw = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(a.against))}
        worst = 0.0
        print("step  graphward   pytorch    rel. difference")
        for t, l in enumerate(losses):
            if t not in gw:
                continue
            d = abs(gw[t] - l) / abs(l)
            worst = max(worst, d)
            print(f"{t:4d}  {gw[t]:9.5f}  {l:9.5f}  {d:.2e}")
        print(f"largest relative difference {worst:.2e} (tolerance {a.tolerance:g})")
        return 0 if worst <= a.tolerance else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
