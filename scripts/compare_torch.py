#!/usr/bin/env python3
"""PyTorch side of graphward's eager-backward study (bench/autograd_bench.cpp), same run rules.

The K-branch x D-layer model (Linear(N, N) + ReLU per layer, batch B, branch outputs summed, MSE
loss), fp32 with TF32 off, single stream or one stream per branch in forward. Per iteration the
forward is untimed; t0; loss.backward(); t1; synchronize; t2. Reports medians of the wall time
(t2 - t0, docs/DESIGN.md's figure) and the host time of the backward call (t1 - t0), in
microseconds.

    python3 scripts/compare_torch.py [--iters 200] [--csv out.csv] [--only SUBSTRING] [--graph]

--graph: PyTorch's own CUDA graph of the backward (captured once with torch.cuda.graph, replayed),
the side-by-side figure for bench/capture_bench.cpp: every .grad None before the warm-up and the
capture, as a user who wants speed captures it (torch_graph rows), and, labelled, the capture that
accumulates into the .grads the warm-up left (torch_graph_accumulate: one more kernel a parameter).

--overlap: the overlap studies of bench/overlap_bench.cpp — docs/DESIGN.md's studies and the
review's sweep (two parallel linears on an N x N input, N = 2^6 ... 2^13), each eager and as a CUDA graph,
the forward on one stream and on a stream per branch; graph:1 is the capture with every .grad None,
graph:2 (the studies only) the accumulating one. Adds event_us: CUDA events on the current
stream around the backward (the figure graphward's overlap rows report). Fewer iterations at large
N (--iters is the most). scripts/overlap_table.py prints it side by side with graphward's.

--models: the real-model training steps of bench/models_bench.cpp — the MLP of examples/mlp.h
(input 256, hidden layers of Linear + GELU(tanh), 10 classes), the convnet of examples/convnet.h
(conv 3x3 + ReLU, max pool, conv 3x3 + ReLU, average pool, linear) and the transformer block of
examples/transformer.h (attention written out as in graphward: one QKV linear, heads by reshape and
transpose, bmm, softmax, bmm — not fused SDPA), cross-entropy, AdamW; one whole training step per
iteration, in every form a PyTorch user would pick for speed (the row's mode):
  eager          zero_grad, forward, backward, AdamW (its default, foreach) step
  graph          the whole step captured once in a torch.cuda.graph (capturable AdamW, static
                 input slots copied into first) and replayed
  eager_fused    as eager, with AdamW(fused=True): one multi-tensor kernel a step
  graph_fused    as graph, with AdamW(fused=True, capturable=True)
  compile        torch.compile(model, mode="reduce-overhead") (CUDA graphs of forward and backward),
                 AdamW(fused=True)
  compile_graph  torch.compile(model, mode="max-autotune-no-cudagraphs") inside the whole-step
                 torch.cuda.graph, AdamW(fused=True, capturable=True)
--strongest: the same models in every variant a strong PyTorch user picks to make a fixed-shape
step fast (STRONGEST, LAYOUTS below), cudnn.benchmark on in every row: eager_fused; graph_fused
(.grad None before warm-up and capture); graph_fused_tunable (TunableOp tuning during the warm-up);
compile_step_graph (the step's forward and loss one torch.compile(fullgraph=True) function, inside
the whole-step graph); compile_step_max_autotune_graph (the same in max-autotune, its own CUDA
graphs left to the whole-step graph); compile_step_max_autotune (mode="max-autotune" with its own
CUDA graphs, no whole-step graph); each also +channels_last (convnets) and +sdpa (transformers,
attention by F.scaled_dot_product_attention). Variant by variant over the models, so that a run cut
short has the quick variants of all; inductor's caches and TunableOp's results are kept in
--cache-dir, so a compile or a tuning is paid once a machine (max-autotune takes minutes a model);
--resume with --csv keeps the rows the CSV holds and runs only the others (a run cut short goes
on).
scripts/strongest.sh runs it with graphward's rows; scripts/strongest_table.py names the fastest.
--bf16: the forward and loss under torch.autocast("cuda", torch.bfloat16), TF32 on for what stays
float32 (graphward's --bf16: Autocast); --causal: the transformers' attention causal; each row's
note says which.

A mode that cannot run on this PyTorch gives a row of NaN whose note says why. event_us: CUDA
events around the step; loop_us: steps back to back, nothing synchronized between them, CUDA events
around blocks of 20 (graphward's loop_us). scripts/models_table.py prints it side by side with graphward's and takes
its ratios against the fastest PyTorch row of each model.

Needs only PyTorch with CUDA; graphward's own tests never need it.
"""
import argparse
import csv
import os
import statistics
import sys
import time

CONFIGS = [  # branches, depth, width, batch, multistream — the same rows as EagerBackward
    (4, 8, 256, 64, 0),
    (4, 8, 256, 64, 1),
    (1, 32, 256, 64, 0),
    (4, 4, 1024, 256, 0),
    (4, 4, 1024, 256, 1),
]


def make_model(torch, k, d, n, b, multi):
    """The study's model: layers, parameters, input, target and a loss function whose forward
    runs on the current stream (and one stream per branch with `multi`)."""
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    layers = [[torch.nn.Linear(n, n).to(dev) for _ in range(d)] for _ in range(k)]
    params = [p for br in layers for l in br for p in l.parameters()]
    x = torch.randn(b, n, generator=gen).to(dev)
    target = torch.randn(b, n, generator=gen).to(dev)
    streams = [torch.cuda.Stream() for _ in range(k)] if multi else None

    def loss_fn():
        main = torch.cuda.current_stream()
        outs = []
        for i in range(k):
            if streams:
                streams[i].wait_stream(main)
                with torch.cuda.stream(streams[i]):
                    h = x
                    for layer in layers[i]:
                        h = torch.relu(layer(h))
                main.wait_stream(streams[i])
            else:
                h = x
                for layer in layers[i]:
                    h = torch.relu(layer(h))
            outs.append(h)
        total = outs[0]
        for o in outs[1:]:
            total = total + o
        return torch.nn.functional.mse_loss(total, target)

    return params, loss_fn


OVERLAP_STUDIES = [(4, 8, 256, 64), (1, 32, 256, 64), (4, 4, 1024, 256)]
SWEEP = [(2, 1, 1 << e, 1 << e) for e in range(6, 14)]  # the review's: N = 2^6 ... 2^13


def overlap_configs():
    """(k, d, n, b, graph, multi): graph 0 the eager backward, 1 the captured backward with every
    .grad None before the capture, 2 (the studies only) the capture with the warm-up's .grads
    left defined, so that it accumulates into them."""
    for k, d, n, b in OVERLAP_STUDIES + SWEEP:
        for graph in ((0, 1, 2) if (k, d, n, b) in OVERLAP_STUDIES else (0, 1)):
            for multi in ((0, 1) if k > 1 else (0,)):
                yield k, d, n, b, graph, multi


def iters_for(n, most):
    """Fewer iterations where one backward takes milliseconds (N >= 2048 in the sweep)."""
    return max(5, min(most, 200 if n <= 1024 else 50 if n <= 2048 else 20 if n <= 4096 else 10))


def run(torch, k, d, n, b, multi, iters, warmup=20, events=False):
    params, loss_fn = make_model(torch, k, d, n, b, multi)

    state = {}

    def prepare():
        for p in params:
            p.grad = None
        state["loss"] = loss_fn()

    return timed(torch, iters, warmup, prepare, lambda: state["loss"].backward(), events)


def timed(torch, iters, warmup, prepare, op, events=False):
    """Medians (µs) over `iters` iterations after `warmup`: prepare() untimed; synchronize; t0;
    op(); t1; synchronize; t2. Wall = t2 - t0, host = t1 - t0. With `events`, also the time
    between CUDA events recorded on the current stream just before and after op()."""
    wall, host, ev = [], [], []
    start = torch.cuda.Event(enable_timing=True) if events else None
    end = torch.cuda.Event(enable_timing=True) if events else None
    for it in range(warmup + iters):
        prepare()
        torch.cuda.synchronize()
        if events:
            start.record()
        t0 = time.perf_counter()
        op()
        t1 = time.perf_counter()
        if events:
            end.record()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if it >= warmup:
            wall.append((t2 - t0) * 1e6)
            host.append((t1 - t0) * 1e6)
            if events:
                ev.append(start.elapsed_time(end) * 1e3)
    if events:
        return statistics.median(ev), statistics.median(wall), statistics.median(host)
    return statistics.median(wall), statistics.median(host)


def run_graph(torch, k, d, n, b, multi, iters, warmup=20, events=False, accumulate=False):
    """PyTorch's own CUDA graph of the same backward: one forward, the backward (retain_graph)
    captured once with torch.cuda.graph and replayed; t0; replay(); t1; synchronize; t2.

    As a user who wants speed captures it, every parameter's .grad is None before the warm-up and
    before the capture, so the captured backward writes each gradient (the graph's pool holds it)
    rather than adding it to one left by the warm-up. With `accumulate`, the .grads the warm-up
    left stay defined through the capture: the graph holds one extra `grad += new` kernel a
    parameter (the labelled second row)."""
    params, loss_fn = make_model(torch, k, d, n, b, multi)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # forward, warm-up and capture off the default stream
        def grads_to_none():  # before each warm-up and before the capture
            if not accumulate:
                for p in params:
                    p.grad = None
        loss = loss_fn()
        for _ in range(3):
            grads_to_none()
            loss.backward(retain_graph=True)
        grads_to_none()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss.backward(retain_graph=True)
    torch.cuda.current_stream().wait_stream(side)
    return timed(torch, iters, warmup, lambda: None, graph.replay, events)


def run_event_rows(torch, args, jobs, width):
    """Runs each (name, run) of `jobs` whose name contains --only; run() returns (event_us, wall_us,
    host_us[, loop_us]). Prints a row each and writes it to the CSV (--csv) at once, so that a run
    cut short keeps the rows it finished. A row that cannot run gives NaN and a note saying why (in
    the table and the CSV's note column); the others go on. With --resume, the rows the CSV holds
    already (measured, or refused with a note) are kept and not run again: a run cut short goes on
    where it stopped, its compiles served by the caches."""
    append = bool(args.csv and args.resume and os.path.exists(args.csv)
                  and os.path.getsize(args.csv) > 0)
    done = set()
    if append:
        with open(args.csv, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    measured = float(row["event_us"]) == float(row["event_us"])  # not NaN
                except (KeyError, TypeError, ValueError):
                    measured = False
                if measured or row.get("note"):
                    done.add(row["config"])
    out = open(args.csv, "a" if append else "w", newline="") if args.csv else None
    writer = csv.writer(out) if out else None
    if writer and not append:
        writer.writerow(["config", "event_us", "wall_us", "host_us", "loop_us", "note"])
    print(f"{'config':{width}s} {'event_us':>9s} {'wall_us':>9s} {'host_us':>9s} {'loop_us':>9s}"
          f"  note", flush=True)
    nan = float("nan")
    for name, run_one in jobs:
        if args.only not in name:
            continue
        if name in done:
            print(f"{name:{width}s} (in {args.csv} already)", flush=True)
            continue
        # every row says its precision (--tf32, --bf16) and a causal transformer so (--causal)
        note = " ".join(n for n in ("bf16 autocast" if getattr(args, "bf16", False) else "",
                                     "TF32 on" if args.tf32 else "",
                                     "causal" if getattr(args, "causal", False)
                                     and "transformer" in name else "") if n)
        start = time.perf_counter()
        try:
            ev, wall, host, *rest = run_one()
            loop = rest[0] if rest else nan
        except Exception as e:  # e.g. a capture or a compile PyTorch refuses: say so, go on
            note = " ".join(f"{note} cannot run: {type(e).__name__}: {e}".split())[:300]
            print(f"{name}: failed: {e}", file=sys.stderr)
            ev = wall = host = loop = nan
        if writer:
            writer.writerow((name, ev, wall, host, loop, note))
            out.flush()
        print(f"{name:{width}s} {ev:9.1f} {wall:9.1f} {host:9.1f} {loop:9.1f}  {note}"
              f"  [{time.perf_counter() - start:.0f} s]", flush=True)
        torch.cuda.empty_cache()
    if out:
        out.close()
    return 0


def main_overlap(torch, args):
    def job(k, d, n, b, graph, multi):
        iters = iters_for(n, args.iters)
        if graph == 0:
            return lambda: run(torch, k, d, n, b, multi, iters, warmup=min(20, iters), events=True)
        return lambda: run_graph(torch, k, d, n, b, multi, iters, warmup=min(20, iters),
                                 events=True, accumulate=graph == 2)
    jobs = ((f"torch_overlap/branches:{k}/depth:{d}/width:{n}/batch:{b}/graph:{graph}/"
             f"multistream:{multi}", job(k, d, n, b, graph, multi))
            for k, d, n, b, graph, multi in overlap_configs())
    return run_event_rows(torch, args, jobs, 64)


# The rows of bench/models_bench.cpp.
MLPS = [(256, 4, 128), (2048, 4, 1024)]  # hidden, layers, batch
CONVNETS = [(64, 16, 16), (256, 32, 64)]  # batch, image, channels (the second conv: twice)
TRANSFORMERS = [(16, 32, 64), (32, 128, 256)]  # batch, seq, dim (dim/16 heads, MLP 4·dim)
VOCAB = 64


def batches(torch, make_x, classes, target_shape):
    dev = torch.device("cuda")
    return ([make_x() for _ in range(4)],
            [torch.randint(0, classes, target_shape, device=dev) for _ in range(4)])


def make_mlp(torch, hidden, layers, batch):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    mods, fan = [], 256
    for _ in range(layers):
        mods += [torch.nn.Linear(fan, hidden), torch.nn.GELU(approximate="tanh")]
        fan = hidden
    mods.append(torch.nn.Linear(fan, 10))
    model = torch.nn.Sequential(*mods).to(dev)
    xs, ts = batches(torch, lambda: torch.randn(batch, 256, device=dev), 10, (batch,))
    return model, list(model.parameters()), xs, ts


def make_convnet(torch, batch, image, channels, channels_last=False):
    """The convnet; with `channels_last`, its weights and every batch in NHWC (cuDNN's preferred
    layout for many of its kernels)."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * (image // 4) ** 2, 10)).to(dev)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    xs, ts = batches(torch, lambda: torch.randn(batch, 3, image, image, device=dev)
                     .contiguous(memory_format=fmt), 10, (batch,))
    return model, list(model.parameters()), xs, ts


def make_transformer(torch, batch, seq, dim, sdpa=False, causal=False):
    """The transformer block; with `sdpa`, its attention one F.scaled_dot_product_attention
    (PyTorch picks the fused kernel) instead of bmm, softmax, bmm written out; with `causal`,
    causal attention (is_causal=True; written out, the scores above the diagonal -inf)."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    F = torch.nn.functional
    heads, ff = dim // 16, 4 * dim
    dh = dim // heads

    def param(*shape, scale=0.05, value=None):
        t = torch.full(shape, value, device=dev) if value is not None else \
            torch.randn(*shape, device=dev) * scale
        return t.requires_grad_()
    tok, pos = param(VOCAB, dim, scale=0.5), param(seq, dim, scale=0.5)
    ln = [(param(dim, value=1.0), param(dim, value=0.0)) for _ in range(3)]
    wqkv, bqkv = param(3 * dim, dim), param(3 * dim, value=0.0)
    wo, bo = param(dim, dim), param(dim, value=0.0)
    w1, b1 = param(ff, dim), param(ff, value=0.0)
    w2, b2 = param(dim, ff), param(dim, value=0.0)
    wout, bout = param(VOCAB, dim), param(VOCAB, value=0.0)
    params = [tok, pos, wqkv, bqkv, wo, bo, w1, b1, w2, b2, wout, bout] + [p for l in ln for p in l]
    above_diagonal = torch.ones(seq, seq, dtype=torch.bool, device=dev).triu(1)

    def model(ids):
        b = ids.shape[0]
        x = (F.embedding(ids, tok) + pos).reshape(b * seq, dim)
        qkv = F.linear(F.layer_norm(x, (dim,), *ln[0]), wqkv, bqkv)
        if sdpa:
            q, k, v = (t.reshape(b, seq, heads, dh).transpose(1, 2) for t in qkv.split(dim, dim=1))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o = o.transpose(1, 2).reshape(b * seq, dim)
        else:
            def split_heads(t):
                return t.reshape(b, seq, heads, dh).transpose(1, 2).reshape(b * heads, seq, dh)
            q, k, v = (split_heads(t) for t in qkv.split(dim, dim=1))
            # The scale rides in the batched GEMM (alpha; beta 0 ignores the first operand), as
            # graphward's bmm(q, k, false, true, 1/sqrt(dh)): no pass over the scores for it.
            s = torch.baddbmm(q.new_empty(b * heads, seq, seq), q, k.transpose(1, 2), beta=0,
                              alpha=dh ** -0.5)
            if causal:
                s = s.masked_fill(above_diagonal, float("-inf"))
            p = F.softmax(s, dim=-1)
            o = torch.bmm(p, v).reshape(b, heads, seq, dh).transpose(1, 2).reshape(b * seq, dim)
        x = x + F.linear(o, wo, bo)
        h = F.gelu(F.linear(F.layer_norm(x, (dim,), *ln[1]), w1, b1), approximate="tanh")
        x = x + F.linear(h, w2, b2)
        return F.linear(F.layer_norm(x, (dim,), *ln[2]), wout, bout)
    xs, ts = batches(torch, lambda: torch.randint(0, VOCAB, (batch, seq), device=dev), VOCAB,
                     (batch * seq,))
    return model, params, xs, ts


# How a PyTorch user runs the step: a variant is a name and its options —
#   graph      the whole step captured once in a torch.cuda.graph and replayed (static input
#              slots copied into first; every .grad None before the warm-up and the capture)
#   fused      AdamW(fused=True) (else PyTorch's default, foreach); capturable where graphed
#   compile    None; "model": torch.compile(model, mode=compile_mode); "step": the step's forward
#              and loss as one function, torch.compile(fullgraph=True, mode=compile_mode) (the
#              backward is compiled with it by AOTAutograd; the fused AdamW, one kernel, after it)
#   tunable    TunableOp on, tuning every GEMM shape during the warm-up, its results kept
#   layout     "channels_last" (the convnet's weights and batches NHWC) or "sdpa" (the
#              transformer's attention one F.scaled_dot_product_attention)
MODEL_MODES = {
    "eager": {},
    "graph": {"graph": True},
    "eager_fused": {"fused": True},
    "graph_fused": {"graph": True, "fused": True},
    "compile": {"fused": True, "compile": "model", "compile_mode": "reduce-overhead"},
    "compile_graph": {"graph": True, "fused": True, "compile": "model",
                      "compile_mode": "max-autotune-no-cudagraphs"},
}

# The strongest preset: every way a strong PyTorch user makes a fixed-shape step fast, with
# cudnn.benchmark on in every row. Inside the whole-step graph, max-autotune runs as
# "max-autotune-no-cudagraphs" (the same autotuning; the whole-step graph replaces its CUDA graphs);
# compile_step_max_autotune is mode="max-autotune" with its own CUDA graphs, the step outside a graph.
STRONGEST = {
    "eager_fused": {"fused": True},
    "graph_fused": {"graph": True, "fused": True},
    "graph_fused_tunable": {"graph": True, "fused": True, "tunable": True},
    "compile_step_graph": {"graph": True, "fused": True, "compile": "step",
                           "compile_mode": "default"},
    "compile_step_max_autotune_graph": {"graph": True, "fused": True, "compile": "step",
                                        "compile_mode": "max-autotune-no-cudagraphs"},
    "compile_step_max_autotune": {"fused": True, "compile": "step",
                                  "compile_mode": "max-autotune"},
}
LAYOUTS = {"mlp": ("",), "convnet": ("", "channels_last"), "transformer": ("", "sdpa")}


def variant_name(base, layout):
    return base + (f"+{layout}" if layout else "")


def loop_us(torch, step, blocks=5, per_block=20):
    """The loop a user writes: `per_block` steps back to back with nothing synchronized between
    them (the host's next step overlaps the GPU's last), CUDA events around each block; the median
    of `blocks` blocks, µs a step (graphward's loop_us counter)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(blocks):
        torch.cuda.synchronize()
        start.record()
        for _ in range(per_block):
            step()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / per_block)
    return statistics.median(out)


class TunableOp:
    """TunableOp on for one variant: every GEMM shape tuned while the warm-up runs (`tuning`),
    its results kept in `filename` (PyTorch writes it when the process exits; the next run reads
    it back), off again on exit."""

    def __init__(self, torch, on, filename):
        self.torch, self.on, self.filename = torch, on, filename

    def __enter__(self):
        if self.on:
            t = self.torch.cuda.tunable
            t.enable(True)
            t.tuning_enable(True)
            if self.filename:
                t.set_filename(self.filename)
                try:
                    t.read_file(self.filename)
                except Exception:  # no results yet: tuned in this run
                    pass
        return self

    def tuning(self, on):
        if self.on:
            self.torch.cuda.tunable.tuning_enable(on)

    def __exit__(self, *exc):
        if self.on:
            t = self.torch.cuda.tunable  # its results are written to the file at exit
            t.tuning_enable(False)
            t.enable(False)
        return False


def run_model(torch, made, opts, iters, tunable_file=None, bf16=False):
    """One whole training step per iteration of `made` = (model, params, inputs, targets), run as
    the variant `opts` says (MODEL_MODES' comment), the forward and loss under
    torch.autocast("cuda", torch.bfloat16) with `bf16`: (event_us, wall_us, host_us, loop_us)."""
    F = torch.nn.functional
    model, params, xs, ts = made
    graph, fused = opts.get("graph", False), opts.get("fused", False)
    compile_kind, compile_mode = opts.get("compile"), opts.get("compile_mode", "default")
    if compile_kind:
        torch._dynamo.reset()  # a fresh compile of this model (the disk caches still serve)
    if compile_kind == "model":
        model = torch.compile(model, mode=compile_mode)

    def forward_loss(x, t):
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            return F.cross_entropy(model(x), t)
    if compile_kind == "step":
        forward_loss = torch.compile(forward_loss, fullgraph=True, mode=compile_mode)
    own_graphs = compile_kind and compile_mode in ("reduce-overhead", "max-autotune")
    kwargs = {"fused": True} if fused else {}
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0, capturable=bool(graph), **kwargs)
    state = {"i": 0}
    with TunableOp(torch, opts.get("tunable", False), tunable_file) as tunable:
        if not graph:
            mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

            def step():
                i = state["i"]
                state["i"] += 1
                if own_graphs and mark_step:
                    mark_step()  # a new iteration of the compiled model's CUDA graphs
                opt.zero_grad(set_to_none=True)
                forward_loss(xs[i % 4], ts[i % 4]).backward()
                opt.step()
            for _ in range(10):  # the warm-up (TunableOp tunes here)
                step()
            tunable.tuning(False)
            return timed(torch, iters, 0, lambda: None, step, events=True) + (loop_us(torch, step),)
        # PyTorch's whole-network capture recipe: warm up on a side stream, grads set to None so
        # the capture allocates them from the graph's pool, then capture forward, backward and step.
        static_x, static_t = xs[0].clone(), ts[0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                forward_loss(static_x, static_t).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        tunable.tuning(False)  # the capture uses what the warm-up tuned
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            forward_loss(static_x, static_t).backward()
            opt.step()

        def replay():
            i = state["i"]
            state["i"] += 1
            static_x.copy_(xs[i % 4])
            static_t.copy_(ts[i % 4])
            g.replay()
        return timed(torch, iters, 10, lambda: None, replay, events=True) + (loop_us(torch, replay),)


MODELS = ([("mlp", f"hidden:{h}/layers:{l}/batch:{b}", make_mlp, (h, l, b)) for h, l, b in MLPS]
          + [("convnet", f"batch:{b}/image:{s}/channels:{c}", make_convnet, (b, s, c))
             for b, s, c in CONVNETS]
          + [("transformer", f"batch:{b}/seq:{t}/dim:{d}", make_transformer, (b, t, d))
             for b, t, d in TRANSFORMERS])


def main_models(torch, args):
    """--models: the MODEL_MODES named by --modes (all by default); --strongest: every variant of
    STRONGEST in every layout of LAYOUTS (those named by --modes, when given)."""
    table = STRONGEST if args.strongest else MODEL_MODES
    modes = [m for m in args.modes.split(",") if m] if args.modes else None
    known = {variant_name(v, l) for v in table for ls in LAYOUTS.values() for l in ls} | set(table)
    unknown = [m for m in modes or () if m not in known]
    if unknown:
        print(f"compare_torch: unknown --modes {','.join(unknown)}; expected some of "
              f"{','.join(sorted(known))}", file=sys.stderr)
        return 2
    tunable_file = os.path.join(args.cache_dir, "tunableop_results.csv") if args.cache_dir else None

    def job(kind, make, config, opts, layout):
        kw = {layout: True} if layout else {}
        if kind == "transformer" and args.causal:
            kw["causal"] = True
        return lambda: run_model(torch, make(torch, *config, **kw), opts, args.iters,
                                 tunable_file, bf16=args.bf16)
    jobs = []  # variant by variant, so that a run cut short has the quick variants of every model
    for base, opts in table.items():
        for kind, name, make, config in MODELS:
            for layout in (LAYOUTS[kind] if args.strongest else ("",)):
                mode = variant_name(base, layout)
                if modes is None or mode in modes or base in modes:
                    jobs.append((f"torch_{kind}/{name}/mode:{mode}",
                                 job(kind, make, config, opts, layout)))
    return run_event_rows(torch, args, jobs, 80)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--tf32", action="store_true",
                    help="TF32 on for float32 matmuls and cuDNN convolutions (as graphward's "
                         "--tf32 / --precision tf32); off by default, both")
    ap.add_argument("--bf16", action="store_true",
                    help="--models / --strongest: the forward and loss under torch.autocast "
                         "bfloat16, TF32 on for what stays float32 (graphward's --bf16)")
    ap.add_argument("--causal", action="store_true",
                    help="--models / --strongest: the transformers' attention causal "
                         "(graphward's --causal)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--only", default="",
                    help="run only the configs whose name contains this string")
    ap.add_argument("--graph", action="store_true",
                    help="PyTorch's CUDA-graph-captured backward instead of its eager backward")
    ap.add_argument("--overlap", action="store_true",
                    help="the overlap studies and the sweep, eager and graph, 1 and K streams")
    ap.add_argument("--models", action="store_true",
                    help="the real-model training steps (MLP, convnet, transformer) in every mode")
    ap.add_argument("--strongest", action="store_true",
                    help="the real-model training steps in every variant of the strongest preset "
                         "(cudnn.benchmark on)")
    ap.add_argument("--modes", default="",
                    help="--models / --strongest: a comma-separated subset of their variants")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True (implied by --strongest)")
    ap.add_argument("--resume", action="store_true",
                    help="--models / --strongest / --overlap with --csv: keep the rows the CSV "
                         "holds and run only the others (a run cut short goes on)")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/graphward-compare"),
                    help="inductor's caches and TunableOp's results, kept between runs so a "
                         "compile or a tuning is paid once ('' for PyTorch's defaults)")
    args = ap.parse_args()
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)
        # Read by inductor when it is imported: its FX graph, AOTAutograd and autotuning caches.
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(args.cache_dir, "inductor"))
        os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
        os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    try:
        import torch
    except ImportError:
        print("compare_torch: PyTorch is not installed; nothing to compare", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("compare_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    args.tf32 = bool(args.tf32 or args.bf16)  # autocast's recipe: TF32 on for the rest
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark or args.strongest)
    rows = []
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()} "
          f"(TF32 {'on' if args.tf32 else 'off'} for matmul and cuDNN, "
          f"cudnn.benchmark {'on' if torch.backends.cudnn.benchmark else 'off'}), medians of "
          f"{args.iters} iterations; caches in {os.environ.get('TORCHINDUCTOR_CACHE_DIR', '-')}",
          flush=True)
    if args.overlap:
        return main_overlap(torch, args)
    if args.models or args.strongest:
        return main_models(torch, args)
    print(f"{'config':56s} {'wall_us':>9s} {'host_us':>9s}")
    for k, d, n, b, multi in CONFIGS:
        for accumulate in ((False, True) if args.graph else (False,)):
            prefix = ("torch_graph_accumulate" if accumulate else "torch_graph") if args.graph \
                else "torch"
            name = f"{prefix}/branches:{k}/depth:{d}/width:{n}/batch:{b}/multistream:{multi}"
            if args.only not in name:
                continue
            try:
                wall, host = (run_graph(torch, k, d, n, b, multi, args.iters, accumulate=accumulate)
                              if args.graph else run(torch, k, d, n, b, multi, args.iters))
            except Exception as e:  # e.g. a capture PyTorch refuses: say so, go on
                print(f"{name}: failed: {e}", file=sys.stderr)
                wall, host = float("nan"), float("nan")
            rows.append((name, wall, host))
            print(f"{name:56s} {wall:9.1f} {host:9.1f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["config", "wall_us", "host_us"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
