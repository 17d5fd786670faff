"""Trace any torch.nn.Module on the meta device: every aten op with its FLOPs and bytes, the
tensors autograd saves for backward, and the highest point of memory, with no memory
allocated and no weights needed.

How: the module runs through `torch.func.functional_call` with meta stand-ins for its
parameters and buffers (the module itself is not touched, whatever device it is on), on meta
inputs of the example shapes. A TorchDispatchMode sees every aten op: its FLOPs come from
torch.utils.flop_counter's formulas, its bytes from its tensors; each storage an op creates is
tracked with a weak reference until it dies, so the live bytes at every op boundary (and their
peak) are those of the eager run. `saved_tensors_hooks` marks what autograd keeps for backward.

The meta device picks the math path for `scaled_dot_product_attention`, which a CPU does not
(it runs a flash kernel that keeps no score matrix): each call asks the CPU's own selector,
with stride-0 stand-ins of the real shapes, and runs the CPU flash op on meta when the CPU
would. Tensors created inside a backend kernel (oneDNN scratch) are not visible here.
"""

from __future__ import annotations

import importlib
import math
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.module.ops import op_record, tensor_bytes
from gpuwise.workload.traced import HeapEvent, MemoryMoment, TracedModule, TracedOp

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
OPTIMIZERS = ("adamw", "sgd", "adafactor")
# Queries about a tensor, not work: no kernel, not counted.
_QUERIES = {"is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense", "size",
            "sym_size", "stride", "sym_stride", "sym_numel", "sym_storage_offset", "dim",
            "sym_is_contiguous", "prim_layout", "prim_device"}  # fmt: skip


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise GpuwiseError("tracing a module needs torch", "pip install 'gpuwise[torch]'") from None
    return torch


def load_factory(path: str, extra_sys_path: tuple[str, ...] = ()) -> Callable[[], Any]:
    """The callable at 'package.module:factory' (imported from the current directory too)."""
    if ":" not in path:
        raise GpuwiseError(f"{path!r} is not of the form 'package.module:factory'",
                           "name a module and a function in it, e.g. mymodels.resnet:build")  # fmt: skip
    mod_name, _, attr = path.partition(":")
    for entry in ("", *extra_sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's import is one line
        raise GpuwiseError(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}",
                           "check the module path and that it imports from this directory") from None  # fmt: skip
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise GpuwiseError(f"{mod_name!r} has no attribute {attr!r}",
                               "name a function that returns a torch.nn.Module")  # fmt: skip
    if not callable(factory):
        raise GpuwiseError(f"{path!r} is not callable", "name a function returning a module")
    return factory


def _dtype(name: str | None) -> Any:
    torch = _torch()
    if name is None:
        return None
    if name not in DTYPES:
        raise GpuwiseError(f"unknown dtype {name!r}", f"choose one of: {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])


def _meta_like(t: Any, dtype: Any, grad: bool) -> Any:
    torch = _torch()
    cast = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    out = torch.empty(t.shape, dtype=cast, device="meta")
    return out.requires_grad_(grad and out.is_floating_point())


def meta_inputs(example: Any, dtype: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) on meta from tensors, shapes (tuples of ints), or lists/dicts of them."""
    torch = _torch()

    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return _meta_like(x, dtype, False)
        if isinstance(x, (tuple, list)) and x and all(isinstance(v, int) for v in x):
            if any(v < 1 for v in x):
                raise GpuwiseError(f"input shape {tuple(x)} has a dimension below 1",
                                   "every dimension must be a positive integer")  # fmt: skip
            return torch.empty(tuple(x), dtype=dtype or torch.float32, device="meta")
        return x  # a non-tensor argument (a flag, None) passes through

    if isinstance(example, dict):
        return (), {k: one(v) for k, v in example.items()}
    if isinstance(example, torch.Tensor) or (
        isinstance(example, (tuple, list)) and example and all(isinstance(v, int) for v in example)
    ):
        return (one(example),), {}
    if isinstance(example, (tuple, list)):
        return tuple(one(x) for x in example), {}
    raise GpuwiseError(f"example inputs of type {type(example).__name__} are not understood",
                       "pass a tensor, a shape tuple, or a tuple/dict of them")  # fmt: skip


class _Recorder:
    """A TorchDispatchMode that records ops and the live bytes of the storages they create."""

    def __init__(self, at_rest: set[int], params: set[int], cpu_scratch: bool = False) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        self.cpu_scratch = cpu_scratch
        self.at_rest = at_rest
        self.params = params
        self.ops: list[TracedOp] = []
        self.phase = "forward"
        self.alive: dict[int, tuple[int, int]] = {}  # storage key -> (serial, bytes)
        self.live = 0
        self.peak = 0
        self.peak_serials: set[int] = set()
        self.heap: list[HeapEvent] = []  # what the pass takes and gives back, in order
        self._serial = 0
        recorder = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                out = func(*args, **(kwargs or {}))
                recorder.record(func, args, kwargs or {}, out)
                return out

        self.mode = Mode()

    def serial_of(self, t: Any) -> int | None:
        entry = self.alive.get(t.untyped_storage()._cdata)
        return entry[0] if entry else None

    def _free(self, key: int, serial: int, nbytes: int) -> None:
        entry = self.alive.get(key)
        if entry and entry[0] == serial:
            del self.alive[key]
            self.live -= nbytes
            self.heap.append(HeapEvent(serial, 0, self.phase))

    def _track(self, t: Any) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.alive or key in self.at_rest:
            return
        self._serial += 1
        nbytes = int(storage.nbytes())
        self.alive[key] = (self._serial, nbytes)
        self.live += nbytes
        self.heap.append(HeapEvent(self._serial, nbytes, self.phase))
        weakref.finalize(storage, self._free, key, self._serial, nbytes)

    def record(self, func: Any, args: Any, kwargs: dict, out: Any) -> None:
        torch = _torch()
        name = func.overloadpacket.__name__
        if name in _QUERIES:
            return
        for t in _tensors(out):
            if t.device.type == "meta":
                self._track(t)
        scratch = cpu_conv_scratch(name, args, out) if self.cpu_scratch else 0
        moment = self.live + scratch
        if scratch:  # oneDNN's reorder buffers, taken and given back within the call
            self._serial += 1
            self.heap += [HeapEvent(self._serial, scratch, self.phase),
                          HeapEvent(self._serial, 0, self.phase)]  # fmt: skip
        if moment > self.peak:
            self.peak = moment
            self.peak_serials = {s for s, _ in self.alive.values()}
        self.ops.append(op_record(torch, func, name, args, kwargs, out, self.phase, self.params))


def cpu_conv_scratch(name: str, args: Any, out: Any) -> int:
    """Bytes oneDNN holds inside a CPU convolution beyond its outputs: it reorders plain
    (NCHW) tensors into its blocked layout and back. Measured with VmHWM on this CPU (fp32):
    a forward holds a second copy of its output, a backward copies the output gradient and
    the input."""
    if name == "convolution":
        return tensor_bytes(out)
    if name == "convolution_backward":
        return tensor_bytes(args[0]) + tensor_bytes(args[1])
    return 0


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)
    elif hasattr(obj, "to_tuple"):  # transformers ModelOutput
        yield from _tensors(obj.to_tuple())


def default_loss(output: Any) -> Any:
    """The sum of every floating output, in fp32: every output reaches the loss."""
    parts = [t.float().sum() for t in _tensors(output) if t.is_floating_point()]
    if not parts:
        raise GpuwiseError("the module's output has no floating tensor to take a loss of",
                           "pass loss_fn= to from_module")  # fmt: skip
    return sum(parts[1:], parts[0])


@contextmanager
def _cpu_attention() -> Iterator[None]:
    """Run sdpa as a CPU would: its flash kernel where the CPU's selector picks it."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    def stand_in(t: Any) -> Any:  # real shape and dtype, no memory: stride 0 but the last dim
        return torch.empty(t.shape[-1], dtype=t.dtype).expand(t.shape)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                flash = _flash_call(torch, stand_in, *args, **kwargs)
                if flash is not None:
                    return flash
            return func(*args, **kwargs)

    with Mode():
        yield


def _flash_call(torch: Any, stand_in: Any, q: Any, k: Any, v: Any, attn_mask: Any = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> Any:  # fmt: skip
    """The CPU flash op where the CPU would run it. It broadcasts grouped KV heads itself
    (`enable_gqa`: Qwen2.5's 14 query heads over 2 KV heads keep their 2-head K and V)."""
    heads, kv_heads = q.shape[1] if q.dim() == 4 else 0, k.shape[1] if k.dim() == 4 else 0
    grouped = enable_gqa and kv_heads and heads % kv_heads == 0
    if q.device.type != "meta" or not heads or (kv_heads != heads and not grouped):
        return None
    mask = stand_in(attn_mask) if attn_mask is not None else None
    choice = torch.ops.aten._fused_sdp_choice(stand_in(q), stand_in(k), stand_in(v), mask,
                                              dropout_p, is_causal, scale=scale,
                                              enable_gqa=enable_gqa)  # fmt: skip
    if choice != 1:  # 1: flash; anything else runs the math path as on meta
        return None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]  # fmt: skip


@contextmanager
def _mode_kept(model: Any, training: bool) -> Iterator[None]:
    """Put the module in train/eval mode for the trace and give each submodule its own back."""
    before = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for m, flag in before:
            m.training = flag


def _storage_bytes(tensors: list[Any]) -> tuple[int, set[int]]:
    keys: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        keys[storage._cdata] = int(storage.nbytes())
    return sum(keys.values()), set(keys)


def _factored(shape: tuple[int, ...]) -> int:
    if len(shape) < 2:
        return math.prod(shape)
    return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]


def trace_module(model: Any, example_inputs: Any, *, training: bool = False,
                 dtype: str | None = None, loss_fn: Callable[[Any], Any] | None = None,
                 optimizer: str = "adamw", name: str | None = None,
                 device_kind: str = "cpu") -> TracedModule:  # fmt: skip
    """Trace one forward pass (and, when `training`, the loss's backward) on meta, for a
    device of `device_kind` ("cpu" adds oneDNN's convolution scratch to the peak)."""
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise GpuwiseError(f"expected a torch.nn.Module, got {type(model).__name__}",
                           "pass the module itself (or a factory returning it)")  # fmt: skip
    target = _dtype(dtype)
    meta: dict[int, Any] = {}  # one stand-in per tensor, so tied weights stay tied
    state: dict[str, Any] = {}
    params = list(model.named_parameters(remove_duplicate=False))
    for key, p in params:
        state[key] = meta.setdefault(id(p), _meta_like(p, target, training and p.requires_grad))
    for key, b in model.named_buffers(remove_duplicate=False):
        state[key] = meta.setdefault(id(b), _meta_like(b, target, False))
    args, kwargs = meta_inputs(example_inputs, target)
    param_meta = list({id(state[k]): state[k] for k, _ in params}.values())
    buffer_meta = [state[k] for k, _ in model.named_buffers(remove_duplicate=False)]
    inputs = list(_tensors((args, kwargs)))
    param_bytes, param_keys = _storage_bytes(param_meta)
    buffer_bytes, buffer_keys = _storage_bytes(buffer_meta)
    input_bytes, input_keys = _storage_bytes(inputs)
    rec = _Recorder(param_keys | buffer_keys | input_keys, param_keys, device_kind == "cpu")
    saved: dict[int, int] = {}
    notes: list[str] = []
    try:
        output_bytes = _run_traced(torch, model, state, args, kwargs, rec, training, saved,
                                   loss_fn)  # fmt: skip
    except GpuwiseError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's forward failed on meta: one line
        first = " ".join(str(exc).split())[:300]
        raise GpuwiseError(f"tracing {name or type(model).__name__} on the meta device failed: "
                           f"{type(exc).__name__}: {first}",
                           "the forward must not read tensor values (.item(), data-dependent "
                           "shapes) and the inputs must fit the module") from None  # fmt: skip
    trainable = [p for p in param_meta if (p.grad is not None if training else p.requires_grad)]
    if training and len(trainable) < sum(1 for p in param_meta if p.requires_grad):
        notes.append(f"{sum(1 for p in param_meta if p.requires_grad) - len(trainable)} "
                     "parameter tensors received no gradient: no optimizer state for them")  # fmt: skip
    grads = {rec.serial_of(p.grad) for p in trainable if training and p.grad is not None}
    sizes = {s: n for s, n in rec.alive.values()}
    peak = MemoryMoment(
        rec.peak,
        sum(n for s, n in saved.items() if s in rec.peak_serials),
        sum(sizes.get(s, 0) for s in grads if s in rec.peak_serials),
    )
    counts = [p.numel() for p in param_meta]
    return TracedModule(
        name=name or type(model).__name__, training=training,
        dtype=_dtype_name(param_meta, target), param_count=sum(counts),
        param_bytes=param_bytes, buffer_bytes=buffer_bytes, input_bytes=input_bytes,
        trainable_count=sum(p.numel() for p in trainable),
        largest_trainable=max((p.numel() for p in trainable), default=0),
        factored_state_count=sum(_factored(tuple(p.shape)) for p in trainable),
        ops=tuple(rec.ops), peak=peak, saved_bytes=sum(saved.values()),
        heap=tuple(rec.heap), cast_bytes=_cast_bytes(model, target),
        output_bytes=output_bytes,
        optimizer_ops=count_optimizer_ops(trainable, optimizer) if training else {},
        trainable_tensors=tuple(sorted(Counter(p.numel() for p in trainable).items())),
        trainable_order=tuple(p.numel() for p in trainable),
        notes=tuple(notes),
    )  # fmt: skip


def _run_traced(torch: Any, model: Any, state: dict, args: tuple, kwargs: dict,
                rec: _Recorder, training: bool, saved: dict[int, int],
                loss_fn: Callable[[Any], Any] | None) -> int:  # fmt: skip
    """Run the pass under the recorder, marking what autograd saves in `saved` (serial ->
    bytes); return the bytes of the output not saved for backward."""

    def pack(t: Any) -> Any:
        serial = rec.serial_of(t)
        if serial is not None:
            saved[serial] = int(t.untyped_storage().nbytes())
        return t

    with _mode_kept(model, training), _cpu_attention(), rec.mode:
        if training:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = torch.func.functional_call(model, state, args, kwargs)
                loss = (loss_fn or default_loss)(out)
            output_bytes = sum(n for s, n in {rec.serial_of(t): int(t.untyped_storage().nbytes())
                                               for t in _tensors(out)}.items()
                               if s is not None and s not in saved)  # fmt: skip
            del out
            rec.phase = "backward"
            loss.backward()
            del loss
        else:
            with torch.no_grad():
                out = torch.func.functional_call(model, state, args, kwargs)
            output_bytes = sum(int(t.untyped_storage().nbytes()) for t in _tensors(out))
            del out
    return output_bytes


def _cast_bytes(model: Any, target: Any) -> int:
    """Bytes of the largest parameter or buffer a cast to `target` replaces (0: no cast)."""
    if target is None:
        return 0
    return max((t.untyped_storage().nbytes() for t in (*model.parameters(), *model.buffers())
                if t.is_floating_point() and t.dtype != target), default=0)  # fmt: skip


def _dtype_name(params: list[Any], target: Any) -> str:
    torch = _torch()
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    if target is not None:
        return names[target]
    floating = [p for p in params if p.is_floating_point()]
    if not floating:
        return "fp32"
    counts: dict[Any, int] = {}
    for p in floating:
        counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return names.get(max(counts, key=lambda d: counts[d]), "fp32")


def count_optimizer_ops(trainable: list[Any], optimizer: str) -> dict[str, int]:
    """Aten ops one optimizer step dispatches, counted on 1-element stand-ins of the
    trainable tensors (same number and rank): the step's per-op cost does not depend on size."""
    torch = _torch()
    from gpuwise.measure.profiles.op_counts import _counter
    from gpuwise.measure.runs.memory_run import _make_optimizer

    if optimizer not in OPTIMIZERS:
        raise GpuwiseError(f"unknown optimizer {optimizer!r}",
                           f"choose one of: {', '.join(OPTIMIZERS)}")  # fmt: skip
    stand_ins = [torch.zeros((1,) * max(1, p.dim()), requires_grad=True) for p in trainable]
    for p in stand_ins:
        p.grad = torch.zeros_like(p)
    opt = _make_optimizer(optimizer, stand_ins)
    opt.step()  # the first step creates the states
    counter = _counter()
    with counter:
        opt.step()
    return {"kernels": counter.kernels, "views": counter.views}
