# A minimal stand-in for the parts of PyTorch that scripts/compare_torch.py uses, so that CI (no
# PyTorch, no GPU) runs the script end to end: its control flow and CSV output, not its figures.
import contextlib, types
__version__ = "fake"
class _T:
    def __init__(self, *a, **k): pass
    def to(self, dev): return self
    def __add__(self, o): return _T()
    def backward(self, retain_graph=False): pass
def device(name): return name
class Generator:
    def __init__(self, device=None): pass
    def manual_seed(self, s): return self
def randn(*a, generator=None): return _T()
def relu(x): return _T()
class _Linear:
    def __init__(self, i, o): pass
    def to(self, dev): return self
    def __call__(self, x): return _T()
    def parameters(self): return [types.SimpleNamespace(grad=None), types.SimpleNamespace(grad=None)]
nn = types.SimpleNamespace(Linear=_Linear, functional=types.SimpleNamespace(mse_loss=lambda a, b: _T()))
class _Stream:
    def wait_stream(self, o): pass
class _Graph:
    def replay(self): pass
class _Event:
    def __init__(self, enable_timing=False): pass
    def record(self): pass
    def elapsed_time(self, other): return 0.001
cuda = types.SimpleNamespace(
    Stream=_Stream, current_stream=lambda: _Stream(), stream=lambda s: contextlib.nullcontext(),
    synchronize=lambda: None, CUDAGraph=_Graph, graph=lambda g, stream=None: contextlib.nullcontext(),
    is_available=lambda: True, get_device_name=lambda: "fake GPU",
    Event=_Event, empty_cache=lambda: None)
backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
                                 cudnn=types.SimpleNamespace(allow_tf32=True))

# For compare_torch.py --models: an MLP, AdamW, cross-entropy, integer targets.
def _clone(self): return _T()
def _copy_(self, other): return self
_T.clone = _clone
_T.copy_ = _copy_
def manual_seed(s): return None
def randint(low, high, size, device=None): return _T()
def randn(*a, generator=None, device=None): return _T()
class _Module:
    def __init__(self, *a, **k): pass
    def to(self, dev): return self
    def __call__(self, x): return _T()
    def parameters(self): return [types.SimpleNamespace(grad=None)]
class _AdamW:
    def __init__(self, params, lr=1e-3, weight_decay=0.0, capturable=False, fused=None):
        self.params = list(params)
    def zero_grad(self, set_to_none=True): pass
    def step(self): pass
nn.Sequential = _Module
nn.GELU = _Module
nn.functional.cross_entropy = lambda logits, target: _T()
optim = types.SimpleNamespace(AdamW=_AdamW)

# For the convnet and the transformer of --models: any tensor method or arithmetic gives a tensor.
def _any(*a, **k): return _T()
for _name in ("__mul__", "__rmul__", "__radd__", "__matmul__", "__getitem__", "reshape",
              "transpose", "requires_grad_", "new_empty"):
    setattr(_T, _name, _any)
_T.shape = (1, 1)
_T.split = lambda self, size, dim=0: [_T(), _T(), _T()]
def full(shape, value, device=None): return _T()
def bmm(a, b): return _T()
def baddbmm(c, a, b, beta=1, alpha=1): return _T()
for _name in ("Conv2d", "ReLU", "MaxPool2d", "AvgPool2d", "Flatten", "Linear"):
    setattr(nn, _name, _Module)
for _name in ("embedding", "layer_norm", "linear", "softmax", "gelu"):
    setattr(nn.functional, _name, _any)

# For compare_torch_dp.py: DistributedDataParallel, SGD, and a spawn that runs the ranks in turn
# (torch/distributed.py, torch/multiprocessing.py).
def device(*a): return a
class _Param(_T):
    grad = None
_Module.parameters = lambda self: [_Param(), _Param()]
no_grad = contextlib.nullcontext
def tanh(x): return _T()
def zeros(*a, device=None): return _T()
def ones(*a, device=None): return _T()
for _name in ("__truediv__", "t"):
    setattr(_T, _name, _any)
class _DDP:
    def __init__(self, module, device_ids=None, bucket_cap_mb=25): self.module = module
    def __call__(self, x): return _T()
    def parameters(self): return self.module.parameters()
nn.parallel = types.SimpleNamespace(DistributedDataParallel=_DDP)
class _SGD:
    def __init__(self, params, lr=0.01): self.params = list(params)
    def zero_grad(self, set_to_none=True): pass
    def step(self): pass
optim.SGD = _SGD
cuda.set_device = lambda d: None
cuda.device_count = lambda: 2
# For compare_torch_dp.py --branches: a module of its own (forward through __call__), a list of
# modules.
class _NNModule:
    def __init__(self): pass
    def __call__(self, x): return self.forward(x)
    def to(self, dev): return self
    def parameters(self): return [_Param(), _Param()]
nn.Module = _NNModule
nn.ModuleList = list

# For the compiled rows of --models: torch.compile returns the model; the CUDA-graph step marker.
def compile(model, mode=None): return model
compiler = types.SimpleNamespace(cudagraph_mark_step_begin=lambda: None)

# For --strongest: torch.compile of a function (fullgraph), dynamo's reset, TunableOp, channels-last
# layouts, SDPA.
def compile(model, mode=None, fullgraph=False): return model
_dynamo = types.SimpleNamespace(reset=lambda: None)
channels_last, contiguous_format = "channels_last", "contiguous_format"
_Module.to = lambda self, dev=None, memory_format=None: self
_T.contiguous = lambda self, memory_format=None: self
nn.functional.scaled_dot_product_attention = _any
_tunable = {"enabled": False, "tuning": False}
cuda.tunable = types.SimpleNamespace(
    enable=lambda on=True: _tunable.update(enabled=on),
    tuning_enable=lambda on=True: _tunable.update(tuning=on),
    set_filename=lambda name, insert_device_ordinal=False: None,
    read_file=lambda name=None: False)

# For --bf16 and --causal: autocast, the causal mask of the written-out attention.
bfloat16 = "bfloat16"
bool = "bool"
def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
    return contextlib.nullcontext()
def ones(*a, device=None, dtype=None): return _T()
for _name in ("triu", "masked_fill"):
    setattr(_T, _name, _any)
